"""Webhooks (decision 0056): the call a text request's ``webhook`` is owed
once the request ends, made by a background task of each serving process,
never on a request's path.

The call is owed in storage (hordelite.storage.webhooks) from the request's
end until it is answered or given up, so it is lost neither when the
process stops nor when another replica ended the request. Each call goes
through the same address policy as image fetches (hordelite.outbound.guarded_fetch):
a webhook at a private address is never reached unless the operator allows
it (``[webhooks] call_private``).

The calls are made inside ``Webhooks.calling``, which the serving task opens:
one client for them all and the task group each call runs in, on its own,
so that no call waits for another. A process makes at most
WEBHOOK_CALLS_IN_FLIGHT at once, and at most WEBHOOK_CALLS_PER_REQUESTER of
one requester's: receivers that never answer hold a few of the process's
calls, never the others'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import httpx

from hordelite import __version__
from hordelite.contract.limits import (
    WEBHOOK_CALLS_IN_FLIGHT,
    WEBHOOK_CALLS_PER_REQUESTER,
    WEBHOOK_CLAIM_BATCH,
    WEBHOOK_TIMEOUT,
)
from hordelite.errors import HordeError, StorageUnavailable
from hordelite.horde._core import HordeCore
from hordelite.horde.results import RequestStatus
from hordelite.outbound.guarded_fetch import open_call_client, post_json
from hordelite.storage.webhooks import OwedCall, Requester

log = logging.getLogger("hordelite.webhooks")

# The status of a request, as Requests.status reads it (kind, id).
StatusReader = Callable[[str, str], Awaitable[RequestStatus]]
# The body of a call: from the request's id, the state it ended in and its
# status (api renders it).
Render = Callable[[str, str, RequestStatus], dict[str, Any]]
# What a receiver can drop a repeat by: the request's id, the same on every
# try (decision 0056: delivery is at least once), and which try this is.
DELIVERY_ID_HEADER = "Webhook-Id"
ATTEMPT_HEADER = "Webhook-Attempt"


@dataclasses.dataclass
class _Calling:
    """The calls this process is making: their client, the task group they
    run in, and how many there are, in all and per requester (a user, or
    one anonymous client address)."""

    client: httpx.AsyncClient
    tasks: anyio.abc.TaskGroup
    claiming: anyio.Lock
    total: int = 0
    busy: dict[Requester, int] = dataclasses.field(default_factory=dict)

    def begin(self, requester: Requester) -> None:
        self.total += 1
        self.busy[requester] = self.busy.get(requester, 0) + 1

    def end(self, requester: Requester) -> bool:
        """Count a call ended; whether it freed a slot a claim was held back by."""
        held_back = (
            self.total >= WEBHOOK_CALLS_IN_FLIGHT
            or self.busy[requester] >= WEBHOOK_CALLS_PER_REQUESTER
        )
        self.total -= 1
        self.busy[requester] -= 1
        if not self.busy[requester]:
            del self.busy[requester]
        return held_back


class Webhooks:
    """The webhook calls this process makes."""

    def __init__(self, core: HordeCore, status: StatusReader) -> None:
        self._core = core
        self._status = status
        self._calling: _Calling | None = None

    def arm(self) -> anyio.Event:
        """The event a request ended in this process, or a call that held
        others back ended, sets (``HordeCore.webhooks_due``); arm it before
        ``call_due``, then wait on it."""
        return self._core.webhooks_due.arm()

    @contextlib.asynccontextmanager
    async def calling(self) -> AsyncIterator[None]:
        """Make calls (``call_due``) within the block: its client is open
        and its calls run for as long. On exit no call is started, and the
        calls started are waited for (each ends within WEBHOOK_TIMEOUT and
        its settling); cancelled, a call left unsettled stays owed."""
        async with (
            open_call_client(WEBHOOK_CALLS_IN_FLIGHT) as client,
            anyio.create_task_group() as tasks,
        ):
            self._calling = _Calling(client, tasks, anyio.Lock())
            try:
                yield
            finally:
                self._calling = None

    async def call_due(self, render: Render) -> int:
        """Claim the calls due now that the bounds leave room for (at most
        WEBHOOK_CLAIM_BATCH) and start each, without waiting for them;
        returns how many were claimed. Each is settled in storage as it
        ends: answered, due again after its back-off, or given up."""
        calling = self._calling
        if calling is None:
            raise RuntimeError("webhook calls are made within Webhooks.calling()")
        core = self._core
        async with calling.claiming:  # one claim at a time: the room is counted once
            free = WEBHOOK_CALLS_IN_FLIGHT - calling.total
            now = core.clock.now()
            if free <= 0 or not await core.store.webhooks_due(now=now):
                return 0
            calls = await core.store.claim_webhooks(
                now=now,
                limit=min(free, WEBHOOK_CLAIM_BATCH),
                busy=dict(calling.busy),
                per_user=WEBHOOK_CALLS_PER_REQUESTER,
            )
            for call in calls:
                calling.begin(call.requester)
                calling.tasks.start_soon(self._call_once, calling, call, render)
        return len(calls)

    async def _call_once(self, calling: _Calling, call: OwedCall, render: Render) -> None:
        try:
            await self._call(calling.client, call, render)
        except StorageUnavailable as exc:  # the claim lapses, and the call is owed again
            log.warning(
                "webhook of request %s not settled, storage unavailable: %s", call.request_id, exc
            )
        except Exception:
            # As a failing round: the horde goes on, the call is owed again.
            log.exception("webhook of request %s failed", call.request_id)
        finally:
            if calling.end(call.requester):
                self._core.webhooks_due.set()

    async def _call(self, client: httpx.AsyncClient, call: OwedCall, render: Render) -> None:
        core = self._core
        try:
            status = await self._status(call.kind, call.request_id)
        except HordeError:  # gone (purged by hand): nothing left to tell
            await core.store.settle_webhook(call=call, done=True, now=core.clock.now())
            return
        body = json.dumps(
            render(call.request_id, call.state, status), separators=(",", ":")
        ).encode()
        outcome = await post_json(
            client,
            call.url,
            body,
            allow_private=core.config.webhooks.call_private,
            time_limit=WEBHOOK_TIMEOUT,
            headers={
                "User-Agent": f"hordelite/{__version__}",
                DELIVERY_ID_HEADER: call.request_id,
                ATTEMPT_HEADER: str(call.attempt),
            },
        )
        done = outcome.answered or outcome.final
        again = await core.store.settle_webhook(call=call, done=done, now=core.clock.now())
        if outcome.answered:
            core.metrics.webhook_calls.labels("answered").inc()
        elif again is not None:
            core.metrics.webhook_calls.labels("retry").inc()
            log.info(
                "webhook of request %s not answered (%s%s, try %d); again in %.0f s",
                call.request_id,
                outcome.reason,
                f" {outcome.status}" if outcome.status else "",
                call.attempt,
                again - core.clock.now(),
            )
        else:
            core.metrics.webhook_calls.labels("given_up").inc()
            log.warning(
                "webhook of request %s given up after try %d: %s%s",
                call.request_id,
                call.attempt,
                outcome.reason,
                f" {outcome.status}" if outcome.status else "",
            )
