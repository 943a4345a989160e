"""The webhook calls owed (decision 0056): a request with a webhook owes one
call from its end (``hook_due``, set where requests end: ``end_request``
and a last submit), until the call is made or given up.

Any serving process may make a call: each claims the calls due, which moves
them on by WEBHOOK_CLAIM_SECONDS, so that a process that dies while calling
leaves them due again and another (or its successor) makes them. On
PostgreSQL claims skip the rows other transactions hold locked, so replicas
never claim the same call at once; SQLite's writes run one at a time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from sqlalchemy import bindparam, func, select, tuple_, update

from hordelite.contract.limits import WEBHOOK_BACKOFF, WEBHOOK_CLAIM_SECONDS, WEBHOOK_TRIES
from hordelite.storage.schema import requests
from hordelite.storage.transaction import Tx, prepared

_DUE = select(requests.c.id).where(requests.c.hook_due.is_not(None))
# Whether a call is due at ``now``: one row at most, along ix_requests_hook_due.
_ANY_DUE = prepared(_DUE.where(requests.c.hook_due <= bindparam("now")).limit(1))


# A requester: its user id, and for the anonymous user its client address.
Requester = tuple[int, str]


@dataclasses.dataclass(frozen=True)
class OwedCall:
    """A webhook call claimed: the request, its requester (user id), how it
    ended, where to call, the how-manieth try this one is (1 for the
    first), and the client address an anonymous request came from ("" for
    a registered user's, or an address unknown)."""

    request_id: str
    user_id: int
    kind: str
    state: str
    url: str
    attempt: int
    client: str = ""

    @property
    def requester(self) -> Requester:
        """Whose calls are bounded together: a user, or one anonymous client
        address (decision 0071)."""
        return (self.user_id, self.client)


def any_due(conn: Tx, now: float) -> bool:
    """Whether some call is due at ``now`` (a read along ix_requests_hook_due,
    so that a poll finding none takes no write)."""
    return conn.execute(_ANY_DUE, {"now": now}).first() is not None


def claim_calls(
    conn: Tx, now: float, limit: int, busy: Mapping[Requester, int], per_user: int
) -> list[OwedCall]:
    """Claim at most ``limit`` of the calls due at ``now``, the longest due
    first, and of them at most ``per_user`` less ``busy[requester]`` (the
    calls its caller is making for that user, or anonymous address: each
    anonymous address is a requester of its own, decision 0071) for each
    requester: a requester at
    its bound is passed over, its calls left due, so that the calls behind
    them are claimed. Each claimed call is counted as tried and owed again
    only after WEBHOOK_CLAIM_SECONDS (when its caller settles it first, it
    is not)."""
    full = sorted(requester for requester, calls in busy.items() if calls >= per_user)
    client = func.coalesce(requests.c.client, "")
    query = (
        select(
            requests.c.id,
            requests.c.user_id,
            requests.c.kind,
            requests.c.state,
            requests.c.webhook,
            requests.c.hook_tries,
            client.label("client"),
        )
        .where(requests.c.hook_due.is_not(None), requests.c.hook_due <= now)
        .order_by(requests.c.hook_due)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    if full:  # at most WEBHOOK_CALLS_IN_FLIGHT / per_user requesters
        query = query.where(tuple_(requests.c.user_id, client).not_in(full))
    taken = dict(busy)
    claimed: list[OwedCall] = []
    for row in conn.execute(query).all():
        if row.webhook is None:  # cannot be set so; settled rather than kept owed
            conn.execute(update(requests).where(requests.c.id == row.id).values(hook_due=None))
            continue
        requester = (row.user_id, row.client)
        if taken.get(requester, 0) >= per_user:
            continue  # this requester's bound reached within this claim
        taken[requester] = taken.get(requester, 0) + 1
        conn.execute(
            update(requests)
            .where(requests.c.id == row.id)
            .values(hook_due=now + WEBHOOK_CLAIM_SECONDS, hook_tries=row.hook_tries + 1)
        )
        claimed.append(
            OwedCall(
                row.id,
                row.user_id,
                row.kind,
                row.state,
                row.webhook,
                row.hook_tries + 1,
                row.client,
            )
        )
    return claimed


def settle_call(conn: Tx, call: OwedCall, *, done: bool, now: float) -> float | None:
    """Record a claimed call's outcome: ``done`` (answered, or not to be
    tried again) settles it; a failure makes it due again after its back-off,
    or gives it up after WEBHOOK_TRIES. Returns when it is due again, or
    None when it is settled."""
    again = (
        None if done or call.attempt >= WEBHOOK_TRIES else now + WEBHOOK_BACKOFF[call.attempt - 1]
    )
    conn.execute(
        update(requests)
        .where(requests.c.id == call.request_id, requests.c.hook_tries == call.attempt)
        .values(hook_due=again)
    )
    return again
