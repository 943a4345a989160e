"""The dashboard's activity figures (decision 0044): jobs done, their tokens
and mean latency per minute over the last hour, whatever the retention (the
purge rolls up the jobs it deletes), read at most once per
DASHBOARD_CACHE_SECONDS however many pages ask."""

from __future__ import annotations

import dataclasses
import math

import anyio

from hordelite.clock import Clock
from hordelite.contract.limits import (
    DASHBOARD_BUCKET_SECONDS,
    DASHBOARD_CACHE_SECONDS,
    DASHBOARD_WINDOW_SECONDS,
)
from hordelite.storage.store import Store


@dataclasses.dataclass(frozen=True)
class Minute:
    """One bucket: when it starts (seconds since the epoch), the jobs done in
    it, their tokens, and their mean latency (None without a job)."""

    start: int
    jobs: int
    tokens: int
    latency: float | None


@dataclasses.dataclass(frozen=True)
class Activity:
    bucket_seconds: int
    window_seconds: int
    buckets: tuple[Minute, ...]


async def read_activity(store: Store, now: float) -> Activity:
    """The buckets of the hour ending with the current, partial one, oldest first."""
    seconds = DASHBOARD_WINDOW_SECONDS
    count = seconds // DASHBOARD_BUCKET_SECONDS
    end = (math.floor(now / DASHBOARD_BUCKET_SECONDS) + 1) * DASHBOARD_BUCKET_SECONDS
    start = end - seconds
    found = {
        b.index: b
        for b in await store.activity(
            start=start, bucket_seconds=DASHBOARD_BUCKET_SECONDS, count=count
        )
    }
    buckets = []
    for i in range(count):
        b = found.get(i)
        at = start + i * DASHBOARD_BUCKET_SECONDS
        if b is None:
            buckets.append(Minute(at, 0, 0, None))
        else:
            buckets.append(Minute(at, b.jobs, b.tokens, round(b.latency_sum / b.jobs, 3)))
    return Activity(DASHBOARD_BUCKET_SECONDS, seconds, tuple(buckets))


class ActivityCache:
    """The figures as last read, for DASHBOARD_CACHE_SECONDS of ``clock``."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._lock = anyio.Lock()
        self._activity: Activity | None = None
        self._read_at = -math.inf

    async def get(self) -> Activity:
        async with self._lock:  # one read for every page asking at once
            now = self._clock.now()
            if self._activity is None or not 0 <= now - self._read_at < DASHBOARD_CACHE_SECONDS:
                self._activity = await read_activity(self._store, now)
                self._read_at = now
            return self._activity
