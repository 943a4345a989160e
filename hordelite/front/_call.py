"""One OpenAI call after its submission: the first status read, the wait, and
the cancellation of the horde request on every exit but an answer or a fault.

The wait sleeps on the request's completion signal; a fallback re-check at a
random point of each ``recheck_interval`` catches a lost signal without
synchronising the re-checks of many open calls.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import anyio

from hordelite.config import FrontConfig
from hordelite.errors import RC, HordeError
from hordelite.horde.results import RequestStatus
from hordelite.horde.service import Horde
from hordelite.http.loop import run_to_completion
from hordelite.signals import look_again_by

# What the wait yields while nothing happened (a stream sends a comment).
TICK = object()
# Seconds a cancellation of the horde request may take while the call ends.
_CANCEL_BUDGET = 5.0


class Call:
    """One call's horde request: a chat request (``kind`` "chat", the chat
    front's call) or a text one (a legacy completion); ``fail_fast``: the
    horde object's availability_mode."""

    def __init__(
        self,
        horde: Horde,
        config: FrontConfig,
        request_id: str,
        started: float,
        *,
        kind: str = "chat",
        fail_fast: bool = False,
    ) -> None:
        self.horde = horde
        self.config = config
        self.request_id = request_id
        self.kind = kind
        self.fail_fast = fail_fast
        self.deadline = started + config.timeout
        self.settled = False  # answered or faulted: nothing to cancel
        self._impossible_since: float | None = None

    async def first_read(self) -> RequestStatus:
        """The first status read: refusals that come before any stream opens.

        A declaration gap is 404 no_worker_supports_features, a limit gap 400
        no_worker_supports_limit; under availability_mode fail_fast, no free
        eligible thread (threads busy with other jobs are not free) or a
        wait_time over the budget left is 503 queue_unavailable with
        Retry-After.
        """
        fail_fast = self.fail_fast
        status = await self.horde.requests.status(
            self.kind, self.request_id, with_free_threads=fail_fast
        )
        reason = status.impossible
        if reason and reason.rc in (RC.no_worker_supports_features, RC.no_worker_supports_limit):
            raise HordeError(reason.rc, reason.message)
        if fail_fast and not status.done:
            budget = self.deadline - anyio.current_time()
            if status.free_threads == 0 or status.wait_time > budget:
                retry = max(1, min(int(status.wait_time) or 30, 120))
                raise HordeError(
                    RC.queue_unavailable,
                    "No eligible worker can take this request within the time left "
                    f"(estimated wait {status.wait_time} s, budget {int(budget)} s, "
                    f"free eligible threads {status.free_threads or 0}); "
                    "it was cancelled. Try again later.",
                    retry_after=retry,
                )
        return status

    async def poll(self) -> RequestStatus | None:
        """Read the status once: the final status when a generation landed,
        None while the request waits; raises HordeError for a fault (502),
        the deadline (408), no eligible worker past the grace period (503)
        or a stopping horde (503)."""
        # The re-checks do not need the queue position, the costly part.
        status = await self.horde.requests.status(self.kind, self.request_id, with_position=False)
        now = anyio.current_time()
        if status.faulted:
            self.settled = True
            fault = status.fault
            raise HordeError(
                RC.ChatRequestFaulted,
                fault.message if fault else RC.ChatRequestFaulted.default_message,
                worker_rc=fault.rc if fault else None,
            )
        if status.done:
            if not status.generations:
                raise HordeError(RC.ChatRequestFaulted, "The request ended without a reply.")
            self.settled = True
            return status
        if status.is_possible:
            self._impossible_since = None
        elif self._impossible_since is None:
            self._impossible_since = now
        elif now - self._impossible_since > self.config.no_worker_grace:
            raise HordeError(
                RC.no_eligible_worker,
                f"No online worker could take this request for {int(self.config.no_worker_grace)} s; "
                "it was cancelled.",
            )
        if self.horde.stopping and not self._finishing(status, now):
            raise HordeError(
                RC.ShuttingDown,
                "The horde is stopping; this request was cancelled and nothing was charged "
                "for a reply not delivered.",
            )
        if now >= self.deadline:
            raise HordeError(
                RC.RequestTimeout,
                f"No reply within {int(self.config.timeout)} s; the request was cancelled.",
            )
        return None

    def _finishing(self, status: RequestStatus, now: float) -> bool:
        """While the horde drains: whether this call still waits for its
        reply. It does while a worker has its job and the drain's deadline
        has not come: the worker's submit reaches this process, which
        serves until its calls are answered (server.open_server), or
        another process (Redis signals). A call whose request no worker has
        is handed back (cancelled, uncharged) at once."""
        return bool(status.processing) and now < self.horde.core.drain_deadline

    def next_recheck(self) -> float:
        """When to re-read the status without a signal: a random point of the
        interval, so many open calls do not re-check together. A request no
        online worker can take is re-read when its grace period ends: until
        a worker takes it (which signals), nothing else can change."""
        now = anyio.current_time()
        deadline = min(self.deadline, self.horde.core.drain_deadline)
        if self.horde.signals.degraded:  # signals may be lost: re-read soon
            return look_again_by(self.horde.signals, deadline)
        if self._impossible_since is not None:
            grace_end = self._impossible_since + self.config.no_worker_grace
            return min(deadline, max(grace_end, now) + random.uniform(0.0, 1.0))
        return min(deadline, now + self.config.recheck_interval * random.uniform(0.5, 1.0))

    async def wait(self, keepalive: float | None = None) -> AsyncIterator[Any]:
        """Yields TICK every ``keepalive`` seconds while waiting, then the
        final status (see ``poll`` for what it raises)."""
        next_tick = anyio.current_time() + keepalive if keepalive else float("inf")
        while True:
            with self.horde.signals.request_waiter(self.request_id) as woken:
                status = await self.poll()
                if status is None:
                    with anyio.move_on_after(
                        max(min(self.next_recheck(), next_tick) - anyio.current_time(), 0)
                    ):
                        await woken.wait()
            if status is not None:
                yield status
                return
            if keepalive and anyio.current_time() >= next_tick:
                next_tick = anyio.current_time() + keepalive
                yield TICK

    async def cancel(self) -> None:
        """Cancel the horde request unless it was answered or faulted.

        Runs to its end (within its budget) even when the call is cancelled
        meanwhile: the client leaving at that moment must not leave the
        request waiting.
        """
        if self.settled:
            return
        self.settled = True
        await run_to_completion(self._cancel_request)

    async def _cancel_request(self) -> None:
        # The call was the request's only reader: nobody can read its reply
        # now, so nothing more is charged for it (decision 0051).
        with anyio.move_on_after(_CANCEL_BUDGET):
            await self.horde.requests.abandon(self.request_id, self.kind)
