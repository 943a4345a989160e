"""The queue rows a waiting request keeps (one per model) and how a request leaves the queue."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from sqlalchemy import (
    bindparam,
    case,
    delete,
    insert,
    literal_column,
    null,
    select,
    update,
)
from sqlalchemy.sql.expression import ColumnClause

from hordelite.contract import refusals
from hordelite.contract.eligibility import (
    RequestView,
)
from hordelite.storage.counts import add_counts
from hordelite.storage.schema import (
    ANY_MODEL,
    client_generations,
    jobs,
    queue,
    queue_classes,
    requests,
    users,
)
from hordelite.storage.transaction import Tx, prepared

# Inline: no RETURNING of the new rows' ids (nobody reads them), so that the
# insert can be deferred (Tx.defer).
INSERT_QUEUE = prepared(insert(queue).inline())

DEQUEUE = prepared(delete(queue).where(queue.c.request_id == bindparam("rid")))

_CLASS_LAST_USED = prepared(
    select(queue_classes.c.last_used).where(
        queue_classes.c.model == bindparam("model"),
        queue_classes.c.kind == bindparam("kind"),
        queue_classes.c.features == bindparam("features"),
    )
)

CLASS_REFRESH_SECONDS = 60.0

REQUEST_BY_ID = prepared(
    select(requests).where(requests.c.id == bindparam("rid"), requests.c.kind == bindparam("kind"))
)
_REQUEST_BY_ID_LOCKED = prepared(REQUEST_BY_ID.with_for_update())


def enqueue(
    conn: Tx, req: dict[str, Any] | Mapping[str, Any], view: RequestView, now: float
) -> None:
    """The queue rows of a request that has jobs to hand out (one per model)."""
    base = {
        "request_id": req["id"],
        "user_id": req["user_id"],
        "anonymous": req["anonymous"],
        "prio_key": req["prio_key"],
        "created": req["created"],
        **_queue_row(view),
    }
    models = view.models or (ANY_MODEL,)
    conn.defer(INSERT_QUEUE, [{**base, "model": m} for m in models])
    if view.kind == "chat":
        for model in models:
            use_class(conn, {"model": model, "kind": "chat", "features": view.features}, now)


def _queue_row(view: RequestView) -> dict[str, Any]:
    """The queue columns the pop's candidate query filters on, from the
    request's eligibility fields (one row per model adds ``model``)."""
    listed = 0 if not view.worker_ids else 2 if view.worker_blacklist else 1
    return {
        "max_length": view.max_length,
        "max_context_length": view.max_context_length,
        "trusted_only": view.trusted_workers,
        "fast_only": not view.slow_workers,
        "nsfw": view.nsfw,
        "worker_filter": listed,
        "kind": view.kind,
        "features": view.features,
        "context_tokens": view.context_tokens,
        "tools_temperature": view.tools_temperature,
    }


def use_class(conn: Tx, key: dict[str, Any], now: float) -> None:
    """Make sure a chat pop will visit this class (see queue_classes.last_used)."""
    last_used = conn.execute(_CLASS_LAST_USED, key).scalar()
    if last_used is not None and last_used >= now - CLASS_REFRESH_SECONDS:
        return
    if last_used is not None:
        touched = conn.execute(
            update(queue_classes)
            .where(
                queue_classes.c.model == key["model"],
                queue_classes.c.kind == key["kind"],
                queue_classes.c.features == key["features"],
            )
            .values(last_used=now)
        ).rowcount
        if touched:
            return
    conn.execute(insert(queue_classes).values(**key, last_used=now))


def dequeue(conn: Tx, request_id: str) -> None:
    conn.defer(DEQUEUE, {"rid": request_id})


def get_request(conn: Tx, request_id: str, kind: str, lock: bool = False) -> Mapping[str, Any]:
    q = _REQUEST_BY_ID_LOCKED if lock else REQUEST_BY_ID
    row = conn.execute(q, {"rid": request_id, "kind": kind}).mappings().first()
    if row is None:
        raise refusals.unknown_request(kind, request_id)
    return row


# Once an ended request's jobs are all back, nothing reads its prompt or
# conversation again (a status reads neither; a pop takes only waiting
# requests; a reply is judged only while its job is processing): they are
# released, and the request no longer counts against its user's stored
# budgets (contract/budgets.py). The row stays readable until its retention.
#
# Its generations stay until the purge: from the release on they count
# toward its user's stored bytes (users.generation_bytes; decision 0069),
# as until then the request's reservation of their bound did.
HELD: ColumnClause[Any] = literal_column("0")
_RELEASE = (
    update(requests)
    .where(requests.c.id.in_(bindparam("ids", expanding=True)), requests.c.held_bytes > HELD)
    .values(prompt="", chat=null(), submitted_prompt=None, held_bytes=0, image_bytes=0)
    .returning(requests.c.user_id, requests.c.generation_bytes, requests.c.client)
)
_COUNT_GENERATIONS = prepared(
    update(users)
    .where(users.c.id == bindparam("uid"))
    .values(generation_bytes=users.c.generation_bytes + bindparam("stored"))
)


def release(conn: Tx, request_ids: list[str]) -> None:
    """Drop what these ended requests hold stored (their blobs are the
    caller's to delete), and count their generations on their users."""
    if request_ids:
        count_generations(conn, conn.execute(_RELEASE, {"ids": request_ids}).all(), 1)


def count_generations(
    conn: Tx, rows: Sequence[tuple[int, int, str | None]], sign: Literal[1, -1]
) -> None:
    """Count (``sign`` 1, at the release) or take off (-1, at the purge) the
    generation bytes of released requests, given as (user id, bytes, client
    address) rows: on their users, and an anonymous request's on its address
    too (decisions 0069 and 0071); one statement per user, one upsert for
    the addresses. An address whose count reaches 0 is forgotten."""
    per_user: dict[int, int] = collections.defaultdict(int)
    per_client: dict[str, int] = collections.defaultdict(int)
    for user_id, stored, client in rows:
        if stored:
            per_user[user_id] += sign * stored
            if client:
                per_client[client] += sign * stored
    if per_user:
        conn.execute(_COUNT_GENERATIONS, [{"uid": uid, "stored": n} for uid, n in per_user.items()])
    add_counts(
        conn,
        client_generations,
        ["client"],
        [{"client": c, "generation_bytes": n} for c, n in per_client.items()],
    )
    if per_client and sign < 0:
        conn.execute(_FORGET_CLIENTS, {"clients": list(per_client)})


_FORGET_CLIENTS = delete(client_generations).where(
    client_generations.c.client.in_(bindparam("clients", expanding=True)),
    client_generations.c.generation_bytes <= 0,
)


# The released generations of one anonymous client address (0: none).
CLIENT_GENERATIONS = prepared(
    select(client_generations.c.generation_bytes).where(
        client_generations.c.client == bindparam("client")
    )
)


def hook_due_at(now: Any) -> Any:
    """``hook_due`` as a request ending at ``now`` sets it: its webhook's call
    is owed from its end when it has one (decision 0056)."""
    return case((requests.c.webhook.is_not(None), now), else_=null())


def end_request(conn: Tx, request_id: str, state: str, now: float, abort_jobs: bool = True) -> None:
    """End a request: out of the queue; with ``abort_jobs`` its jobs still
    out are aborted (a late submit gets AbortedGen and charges nobody).

    A client's cancel does not abort them (worker guide, step 7): a job that does not
    stream is submitted as usual and rewarded for its reply.
    """
    conn.execute(
        update(requests)
        .where(requests.c.id == request_id)
        .values(state=state, ended=now, remaining=0, hook_due=hook_due_at(now))
    )
    if abort_jobs:
        conn.execute(
            update(jobs)
            .where(jobs.c.request_id == request_id, jobs.c.state == "processing")
            .values(state="cancelled")
        )
    dequeue(conn, request_id)
