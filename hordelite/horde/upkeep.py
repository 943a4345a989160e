"""Upkeep: the timers' sweep, readiness, and the start of shutdown."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from hordelite import __version__
from hordelite.contract.limits import DRAIN_ANSWER_MARGIN, READY_CHECK_SECONDS
from hordelite.errors import StorageUnavailable
from hordelite.horde._core import HordeCore
from hordelite.storage.timers import SweepResult


class Upkeep:
    """What keeps one horde going between requests."""

    def __init__(self, core: HordeCore) -> None:
        self._core = core

    async def sweep(self, *, wait: bool = False) -> SweepResult:
        """One pass of the timers: expired leases, expired requests, purge.

        Of several processes on one PostgreSQL database one sweeps at a
        time: while another sweeps this one is skipped (``skipped`` is set),
        or with ``wait`` waits its turn.
        """
        core = self._core
        signals = core.signals
        now = core.clock.now()
        extended = await signals.lease_ends()
        result = await core.store.sweep(now=now, extended=extended, wait=wait)
        if result.expired_jobs:
            core.metrics.faults.labels("lease_expired").inc(result.expired_jobs)
        for job_id in result.expired_job_ids:
            await signals.end_lease(job_id, now)
        if result.requeued:
            await core.queue_changed()
        for request_id in result.ended_requests:
            await signals.notify_request(request_id)
        if result.ended_requests:
            core.webhooks_due.set()
        for request_id in result.changed_requests:
            await signals.touch_request(request_id)
        if core.blobs is not None:
            # The images of requests purged, and of ended ones released.
            gone = [*result.purged_ids, *result.released_image_ids]
            if gone:
                await core.blobs.delete_prefixed(gone)
        await signals.sweep_progress(now, result.ended_requests)
        return result

    def begin_shutdown(self) -> None:
        """Stop holding waits: each waiting pop answers now (a last try, then
        empty), each waiting OpenAI call gets its final answer: at once, or,
        when a worker has its job, its reply or the refusal by the drain's
        deadline (``front._call``)."""
        grace = self._core.config.server.grace_period
        self._core.drain_deadline = anyio.current_time() + max(grace - DRAIN_ANSWER_MARGIN, 0.0)
        self._core.stopping = True
        self._core.skipped.stale()
        self._core.signals.notify_all_requests()  # this process's pops, calls, streams and reads

    async def unready(self) -> str | None:
        """Why this horde should get no new traffic now (``/readyz``), or
        None: it is stopping, its database does not answer within
        READY_CHECK_SECONDS, or (with ``[signals] ready_when_degraded =
        false``) its Redis signals are down."""
        if self._core.stopping:
            return "stopping"
        try:
            with anyio.fail_after(READY_CHECK_SECONDS):
                await self._core.store.ping()
        except (StorageUnavailable, TimeoutError):
            return "database"
        if self.signals_degraded() and not self._core.config.signals.ready_when_degraded:
            return "signals"
        return None

    def signals_degraded(self) -> bool:
        """Whether signals may be lost now (Redis is down): by default the
        horde still serves, degraded, and stays ready (decision 0054)."""
        return self._core.signals.degraded

    def signals_ping(self) -> Callable[[], Awaitable[None]] | None:
        """A round trip to Redis when the signals go through it, else None.

        Only RedisSignals has ``ping``: in-process signals have nothing to
        reach, so the Signals protocol does not ask for one."""
        ping = getattr(self._core.signals, "ping", None)
        return ping if callable(ping) else None

    def heartbeat(self) -> dict[str, Any]:
        """``GET /api/v2/status/heartbeat``."""
        return {"message": "OK", "version": __version__}
