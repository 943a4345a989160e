"""Signals through Redis: several processes or machines act as one horde.

What crosses processes goes through Redis; what waits stays in the process
that waits. Each process holds one pub/sub connection (``listen``) and wakes
its own waiters from what it hears, through the in-process backend's local
wake-ups; so the number of Redis connections does not grow with open waits.

Keys and channels (``horde:`` on the database the URL names; the seed puts
the retained stream on logical database 7, so ``redis://host:6379/7``):

- ``horde:queue`` (channel): a job became available; the message is the
  request's eligibility view as JSON, or empty for any. Each process wakes
  one of its waiting pops that can take it.
- ``horde:chat:<request id>`` (channel): the request changed (``touch``),
  ended or got a generation (``end``), or got a progress entry
  (``progress``). No text travels in these messages.
- ``horde:pool`` (channel): a worker joined, left or declared anew.
- ``horde:version:<request id>``: the request's version, a value of the one
  counter ``horde:versions`` (decision 0038: a version read before a change
  never equals one read after it).
- ``horde:lease:<job id>``, ``horde:cancel:<job id>``, ``horde:ended:<job
  id>``, ``horde:request_leases:<request id>``, ``horde:lease_ends``: the
  progress leases written at pop, so that a post on any process is
  authenticated and paced without reading the database. The cancel flag is
  a key of its own, so a post writing its lease back cannot undo a cancel
  made meanwhile on another process.
- ``horde:chat:stream:<request id>``: the retained progress stream, a list
  of JSON entries with a time to live.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Any

import anyio
import anyio.abc
import coredis
from coredis.response.types import ScoredMember

from hordelite.contract.eligibility import RequestView, WorkerView
from hordelite.contract.limits import (
    ENDED_MARKER_SECONDS,
    STREAM_RETENTION_SECONDS,
    VERSION_TTL_SECONDS,
)
from hordelite.contract.progress import Lease
from hordelite.signals._local import LocalSignals, ProgressEntry, QueueWaiter

log = logging.getLogger("hordelite.signals")

QUEUE = "horde:queue"
POOL = "horde:pool"
REQUEST_PREFIX = "horde:chat:"
STREAM_PREFIX = "horde:chat:stream:"
# A stream outlives its last lease by the retention; before that, by as long
# as a job can be leased (a progress post extends a lease up to its cap).
STREAM_TTL_SECONDS = 24 * 3600

# One counter for every version, so that no two changes share one.
_BUMP = """
local v = redis.call('INCR', KEYS[1])
redis.call('SET', KEYS[2], v, 'EX', ARGV[1])
return v
"""


def _request_channel(request_id: str) -> str:
    return f"{REQUEST_PREFIX}{request_id}"


def _lease_ttl(lease: Lease, now: float) -> int:
    """Seconds a lease's keys live: past its longest possible end."""
    return max(math.ceil(lease.max_expires - now) + 60, 60)


class RedisSignals:
    """The Signals interface on Redis; see the module's docstring."""

    def __init__(self, client: coredis.Redis[str]) -> None:
        self._redis = client
        self._local = LocalSignals()
        self._bump = client.register_script(_BUMP)

    # Listening -----------------------------------------------------------

    async def listen(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Hear every process's signals on one pub/sub connection and wake
        this process's waiters; runs until cancelled."""
        async with self._redis.pubsub(
            channels=[QUEUE, POOL], patterns=[f"{REQUEST_PREFIX}*"]
        ) as pubsub:
            task_status.started()
            async for message in pubsub:
                if message["type"] in ("message", "pmessage"):
                    self._dispatch(str(message["channel"]), str(message["data"]))

    def _dispatch(self, channel: str, data: str) -> None:
        local = self._local
        if channel == QUEUE:
            local.wake_pops(RequestView.of(json.loads(data)) if data else None)
        elif channel == POOL:
            local.pool_changed_locally()
        elif channel.startswith(REQUEST_PREFIX):
            request_id = channel[len(REQUEST_PREFIX) :]
            if data == "end":
                local.wake_request(request_id)
                local.wake_stream(request_id)
            elif data == "touch":
                local.touch_locally(request_id)
            elif data == "progress":
                local.wake_stream(request_id)

    # Queue and requests ----------------------------------------------------

    def queue_waiter(self, worker: WorkerView | None) -> AbstractContextManager[QueueWaiter]:
        return self._local.queue_waiter(worker)

    async def notify_queue(self, request: RequestView | None = None) -> None:
        data = "" if request is None else json.dumps(dataclasses.asdict(request))
        await self._redis.publish(QUEUE, data)

    def request_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        return self._local.request_waiter(request_id)

    async def notify_request(self, request_id: str) -> None:
        await self._bump_version(request_id)
        await self._redis.publish(_request_channel(request_id), "end")

    async def touch_request(self, request_id: str) -> None:
        await self._bump_version(request_id)
        await self._redis.publish(_request_channel(request_id), "touch")

    async def _bump_version(self, request_id: str) -> None:
        keys = ["horde:versions", f"horde:version:{request_id}"]
        await self._bump(keys=keys, args=[int(VERSION_TTL_SECONDS)])

    async def request_version(self, request_id: str) -> int:
        value = await self._redis.get(f"horde:version:{request_id}")
        return int(value) if value is not None else 0

    def status_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        return self._local.status_waiter(request_id)

    async def notify_pool(self) -> None:
        self._local.pool_changed_locally()  # seen here at once; by the others on the channel
        await self._redis.publish(POOL, "")

    def pool_version(self) -> int:
        return self._local.pool_version()

    def notify_all_requests(self) -> None:
        self._local.notify_all_requests()

    # Leases --------------------------------------------------------------

    async def put_lease(self, lease: Lease) -> None:
        ttl = _lease_ttl(lease, lease.popped)
        await self._redis.set(f"horde:lease:{lease.job_id}", _lease_json(lease), ex=ttl)
        await self._redis.sadd(f"horde:request_leases:{lease.request_id}", [lease.job_id])
        await self._redis.expire(f"horde:request_leases:{lease.request_id}", ttl)
        ends: dict[str | bytes, int | float] = {lease.job_id: lease.expires}
        await self._redis.zadd("horde:lease_ends", ends)
        # A new attempt of a request that is still waiting: its stream lives on.
        await self._redis.expire(f"{STREAM_PREFIX}{lease.request_id}", STREAM_TTL_SECONDS)

    async def save_lease(self, lease: Lease) -> None:
        ttl = _lease_ttl(lease, lease.popped)
        key = f"horde:lease:{lease.job_id}"
        # XX: a lease ended meanwhile (a submit on another process) stays ended.
        await self._redis.set(key, _lease_json(lease), condition=coredis.PureToken.XX, ex=ttl)
        ends: dict[str | bytes, int | float] = {lease.job_id: lease.expires}
        await self._redis.zadd("horde:lease_ends", ends, condition=coredis.PureToken.XX)
        if lease.cancelled:
            await self._redis.set(f"horde:cancel:{lease.job_id}", "1", ex=ttl)

    async def lease(self, job_id: str) -> Lease | None:
        stored, cancelled = await self._redis.mget(
            [f"horde:lease:{job_id}", f"horde:cancel:{job_id}"]
        )
        if stored is None:
            return None
        fields: dict[str, Any] = json.loads(stored)
        fields["last"] = tuple(fields["last"])
        return Lease(**fields, cancelled=cancelled is not None)

    async def ended(self, job_id: str) -> bool:
        return bool(await self._redis.exists([f"horde:ended:{job_id}"]))

    async def end_lease(self, job_id: str, now: float) -> Lease | None:
        lease = await self.lease(job_id)
        if lease is None:
            await self._redis.zrem("horde:lease_ends", [job_id])  # its keys expired
            return None
        await self._redis.delete([f"horde:lease:{job_id}", f"horde:cancel:{job_id}"])
        await self._redis.set(f"horde:ended:{job_id}", "1", ex=int(ENDED_MARKER_SECONDS))
        await self._redis.zrem("horde:lease_ends", [job_id])
        jobs_key = f"horde:request_leases:{lease.request_id}"
        await self._redis.srem(jobs_key, [job_id])
        if not await self._redis.scard(jobs_key):
            await self.end_stream(lease.request_id, now)
        return lease

    async def request_leases(self, request_id: str) -> list[Lease]:
        job_ids = await self._redis.smembers(f"horde:request_leases:{request_id}")
        leases = [await self.lease(job_id) for job_id in sorted(job_ids)]
        return [lease for lease in leases if lease is not None]

    async def lease_ends(self) -> dict[str, float]:
        ends = await self._redis.zrange(
            "horde:lease_ends", "-inf", "+inf", sortby=coredis.PureToken.BYSCORE, withscores=True
        )
        return {str(e.member): float(e.score) for e in ends if isinstance(e, ScoredMember)}

    # Progress streams ----------------------------------------------------

    async def append_progress(self, request_id: str, entry: ProgressEntry) -> None:
        key = f"{STREAM_PREFIX}{request_id}"
        await self._redis.rpush(key, [json.dumps(entry)])
        await self._redis.expire(key, STREAM_TTL_SECONDS)
        await self._redis.publish(_request_channel(request_id), "progress")

    async def read_progress(self, request_id: str, position: int) -> list[ProgressEntry]:
        entries = await self._redis.lrange(f"{STREAM_PREFIX}{request_id}", position, -1)
        return [ProgressEntry(json.loads(e)) for e in entries]

    def progress_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        return self._local.progress_waiter(request_id)

    async def end_stream(self, request_id: str, now: float) -> None:
        # Kept a while for a reader a little behind, as in-process.
        await self._redis.expire(
            f"{STREAM_PREFIX}{request_id}", int(STREAM_RETENTION_SECONDS), coredis.PureToken.LT
        )

    async def sweep_progress(self, now: float, ended_requests: list[str]) -> None:
        """End the streams of ended requests and the leases past their end;
        Redis forgets the rest by their times to live."""
        for request_id in ended_requests:
            await self.end_stream(request_id, now)
        expired = await self._redis.zrange(
            "horde:lease_ends", "-inf", now, sortby=coredis.PureToken.BYSCORE
        )
        for job_id in expired:
            await self.end_lease(str(job_id), now)

    def statistics(self) -> dict[str, int]:
        """This process's waiters (what Redis holds is bounded by its TTLs)."""
        return self._local.statistics()


def _lease_json(lease: Lease) -> str:
    fields = dataclasses.asdict(lease)
    del fields["cancelled"]  # a key of its own (see the module's docstring)
    return json.dumps(fields)


@contextlib.asynccontextmanager
async def open_redis_signals(url: str) -> AsyncIterator[RedisSignals]:
    """Redis signals for the block, listening in a task the block owns."""
    client: coredis.Redis[str] = coredis.Redis.from_url(url, decode_responses=True)
    async with client:
        signals = RedisSignals(client)
        async with anyio.create_task_group() as tg:
            await tg.start(signals.listen)
            try:
                yield signals
            finally:
                tg.cancel_scope.cancel()
