"""Webhooks (decision 0056): the call a text request's ``webhook`` is owed
once the request ends, made by a background task of each serving process,
never on a request's path.

The call is owed in storage (hordelite.storage.webhooks) from the request's
end until it is answered or given up, so it is lost neither when the
process stops nor when another replica ended the request. Each call goes
through the same address policy as image fetches (hordelite.guarded_fetch):
a webhook at a private address is never reached unless the operator allows
it (``[webhooks] call_private``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from hordelite import __version__
from hordelite.contract.limits import WEBHOOK_CALLS_AT_ONCE, WEBHOOK_TIMEOUT
from hordelite.errors import HordeError
from hordelite.guarded_fetch import post_json
from hordelite.horde._core import HordeCore
from hordelite.horde.results import RequestStatus
from hordelite.storage.webhooks import OwedCall

log = logging.getLogger("hordelite.webhooks")

# The status of a request, as Requests.status reads it (kind, id).
StatusReader = Callable[[str, str], Awaitable[RequestStatus]]
# The body of a call: from the request's id, the state it ended in and its
# status (api renders it).
Render = Callable[[str, str, RequestStatus], dict[str, Any]]


class Webhooks:
    """The webhook calls this process makes."""

    def __init__(self, core: HordeCore, status: StatusReader) -> None:
        self._core = core
        self._status = status

    def arm(self) -> anyio.Event:
        """The event a request ended in this process sets (``HordeCore.webhooks_due``);
        arm it before ``call_due``, then wait on it."""
        return self._core.webhooks_due.arm()

    async def call_due(self, render: Render) -> int:
        """Claim the calls due now (at most WEBHOOK_CALLS_AT_ONCE) and make
        them, all at once; returns how many were claimed. Each is settled in
        storage as it ends: answered, due again after its back-off, or given
        up."""
        core = self._core
        now = core.clock.now()
        if not await core.store.webhooks_due(now=now):
            return 0
        calls = await core.store.claim_webhooks(now=now, limit=WEBHOOK_CALLS_AT_ONCE)
        async with anyio.create_task_group() as tg:
            for call in calls:
                tg.start_soon(self._call, call, render)
        return len(calls)

    async def _call(self, call: OwedCall, render: Render) -> None:
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
            call.url,
            body,
            allow_private=core.config.webhooks.call_private,
            time_limit=WEBHOOK_TIMEOUT,
            user_agent=f"hordelite/{__version__}",
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
