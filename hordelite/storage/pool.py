"""Workers: who is online, a pop's check-in, and the records the worker routes show."""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    bindparam,
    case,
    delete,
    exists,
    false,
    func,
    insert,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import Select, Update

from hordelite.contract import budgets, refusals
from hordelite.contract.budgets import WorkerCap
from hordelite.contract.chat_declaration import ChatDeclaration
from hordelite.contract.chat_features import (
    ChatWorkerLimits,
)
from hordelite.contract.eligibility import (
    WorkerView,
)
from hordelite.contract.limits import ASSUMED_TOKENS_PER_SECOND
from hordelite.contract.text import PopRequest
from hordelite.contract.worker_edit import WorkerEdit
from hordelite.errors import RC, HordeError
from hordelite.storage import audit
from hordelite.storage.accounts import admitted, authenticate
from hordelite.storage.arrays import by_codepoint, json_elements, one_of
from hordelite.storage.ledger import lapse_job
from hordelite.storage.rules import Rules
from hordelite.storage.schema import (
    ANY_MODEL,
    jobs,
    queue,
    requests,
    users,
    worker_holds,
    workers,
)
from hordelite.storage.transaction import Tx, prepared

WORKER_BY_KEY = prepared(select(workers).where(workers.c.name_key == bindparam("name_key")))

# The prefix of a deleted worker's name and key: no pop can reach them (names
# refuse control characters), so the name it had is free again.
RETIRED_NAME = "\x1f"

_WORKERS_OF = prepared(
    select(func.count())
    .select_from(workers)
    .where(workers.c.user_id == bindparam("user_id"), workers.c.deleted == false())
)

_LOCK_USER = prepared(
    select(users.c.id).where(users.c.id == bindparam("user_id")).with_for_update(key_share=True)
)


_ONLINE_WORKERS = prepared(
    select(workers, users.c.trusted)
    .join(users, users.c.id == workers.c.user_id)
    .where(workers.c.online_until > bindparam("now"))
)

_ONLINE_CHAT_WORKERS = prepared(_ONLINE_WORKERS.where(workers.c.chat_model.is_not(None)))

_ONLINE_CHAT_WORKERS_OF = _ONLINE_WORKERS.where(
    workers.c.chat_model.in_(bindparam("models", expanding=True))
)


def online_now(
    conn: Tx,
    now: float,
    *,
    chat: bool = False,
    models: Sequence[str] | None = None,
) -> list[WorkerView]:
    """Workers online now. ``chat``: only those that take chat jobs (a chat
    request reads nothing of the others), and with ``models`` only those
    whose chat model is one of them (read along ix_workers_chat_model)."""
    if not chat:
        rows = conn.execute(_ONLINE_WORKERS, {"now": now}).mappings()
    elif models is None:
        rows = conn.execute(_ONLINE_CHAT_WORKERS, {"now": now}).mappings()
    else:
        params = {"now": now, "models": list(models)}
        rows = conn.execute(_ONLINE_CHAT_WORKERS_OF, params).mappings()
    return [worker_view(r) for r in rows]


@dataclasses.dataclass(frozen=True)
class OnlineWorker:
    """A worker online when read, and until when it stays so."""

    until: float
    view: WorkerView


def online_pool(conn: Tx, now: float) -> list[OnlineWorker]:
    """Every worker online now, with the end of its check-in (a snapshot
    that stays true for each worker until its ``until``)."""
    rows = conn.execute(_ONLINE_WORKERS, {"now": now}).mappings()
    return [OnlineWorker(r["online_until"], worker_view(r)) for r in rows]


def worker_view(row: Mapping[str, Any] | dict[str, Any]) -> WorkerView:
    return WorkerView(
        id=row["id"],
        models=tuple(row["models"]),
        max_length=row["max_length"],
        max_context_length=row["max_context_length"],
        nsfw=row["nsfw"],
        trusted=bool(row["trusted"]),
        threads=row["threads"],
        extra_slow=row["extra_slow"],
        # A paused worker gets no job: for routing it is in maintenance.
        maintenance=bool(row["maintenance"]) or bool(row.get("paused")),
        tokens_generated=row["tokens_generated"],
        seconds_generating=row["seconds_generating"],
        prompt_jobs=bool(row["prompt_jobs"]),
        **_chat_view(row["chat"]),
    )


def _chat_view(chat: dict[str, Any] | None) -> dict[str, Any]:
    """WorkerView's chat fields from a stored (or popped) declaration."""
    if not chat:
        return {}
    declaration = ChatDeclaration(
        model_id=chat["model_id"],
        features=tuple(chat["features"]),
        limits=ChatWorkerLimits(**chat["limits"]),
        image_transports=tuple(chat["image_transports"]),
    )
    return {
        "chat_model": declaration.model_id,
        "chat_features": declaration.features,
        "chat_mask": declaration.mask,
        "chat_max_context_length": declaration.limits.max_context_length,
        "chat_max_length": declaration.limits.max_length,
        "tools_max_temperature": declaration.limits.tools_max_temperature,
    }


def online_workers(conn: Tx, now: float) -> list[WorkerView]:
    return online_now(conn, now)


# What a pop reads first, in one statement (one round trip, not three): the
# key's user, the worker row of the pop's name (null columns on its first
# pop), whether the user has requests queued (its own come first,
# pop._Walks) and whether any text request naming no model is queued (the
# walk of that class is skipped when none is: most requests name their
# models). The worker's columns carry a prefix: both tables have an id.
_WORKER = "worker__"
_POPPER = prepared(
    select(
        users,
        *(column.label(_WORKER + column.name) for column in workers.c),
        exists().where(queue.c.user_id == users.c.id).label("owns_queued"),
        # A probe of ix_queue_order's first two columns.
        exists()
        .where(queue.c.model == ANY_MODEL, queue.c.kind == "text")
        .label("any_model_queued"),
    )
    .select_from(users.outerjoin(workers, workers.c.name_key == bindparam("name_key")))
    .where(users.c.key_hash == bindparam("key_hash"))
)


@dataclasses.dataclass(frozen=True)
class Popper:
    """A pop's user (admitted), its worker's row (None on its first pop),
    whether the user has requests queued, and whether any request naming
    no model is."""

    user: Mapping[str, Any]
    worker: Mapping[str, Any] | None
    owns_queued: bool
    # A text request naming no model is queued (its queue rows' model is
    # ANY_MODEL), as of this statement.
    any_model_queued: bool


def popper(conn: Tx, key_hash: str, pop: PopRequest, rules: Rules) -> Popper:
    """Who pops, and with which worker.

    A worker name belongs to the user who first popped with it; names are
    compared by their key, so "ALICE" is the worker first named "Alice", and
    another user's look-alike of a name is that name. The worker is read
    without a lock: its row is updated after the claim (``touch_worker``),
    so a pop locks its request before its worker, in the order submits take
    them. Refuses an unknown key, as ``authenticate`` does.
    """
    params = {"key_hash": key_hash, "name_key": pop.name_key}
    row = conn.execute(_POPPER, params).mappings().first()
    if row is None:
        raise HordeError(RC.InvalidAPIKey)
    user = admitted({column.name: row[column.name] for column in users.c}, rules)
    if user["anonymous"]:
        raise HordeError(RC.AnonForbiddenWorker)
    owns_queued, any_model_queued = bool(row["owns_queued"]), bool(row["any_model_queued"])
    if row[_WORKER + "id"] is None:
        return Popper(user, None, owns_queued, any_model_queued)
    worker = {column.name: row[_WORKER + column.name] for column in workers.c}
    if worker["user_id"] != user["id"]:
        raise refusals.worker_name_taken(pop.name, worker["name"])
    if worker["maintenance"]:
        raise refusals.worker_in_maintenance(pop.name, worker["id"])
    return Popper(user, worker, owns_queued, any_model_queued)


def worker_cap(user: Mapping[str, Any], rules: Rules) -> WorkerCap:
    """How many workers this user may have registered (budgets)."""
    return budgets.worker_cap(
        admin=bool(user["admin"]),
        trusted=bool(user["trusted"]),
        workers_per_user=rules.workers_per_user,
        trusted_workers_per_user=rules.trusted_workers_per_user,
    )


def _registered(conn: Tx, user_id: int) -> int:
    return int(conn.execute(_WORKERS_OF, {"user_id": user_id}).scalar_one())


def register_worker(
    conn: Tx,
    user: Mapping[str, Any],
    pop: PopRequest,
    declared: dict[str, Any],
    now: float,
    rules: Rules,
) -> Mapping[str, Any]:
    """A first pop's worker row, inserted: it exists (and is online) from
    this transaction. Refused when its owner has as many workers as its cap;
    the count here is unlocked, so that a refused pop ends before it walks
    the queue: ``hold_worker_cap`` counts again under the owner's lock."""
    cap = worker_cap(user, rules)
    if cap.limit:
        registered = _registered(conn, user["id"])
        if cap.refuses(registered):
            raise refusals.too_many_workers(pop.name, registered, cap.limit, cap.key)
    values = {
        "id": str(uuid.uuid4()),
        "name": pop.name,
        "name_key": pop.name_key,
        "user_id": user["id"],
        "created": now,
        "online_until": now + rules.worker_online,
        **take_hold(conn, user["id"], pop.name_key),
    }
    insert_worker = insert(workers).values(**values, **declared).returning(workers)
    return conn.execute(insert_worker).mappings().one()


_HOLD = prepared(
    select(worker_holds.c.paused, worker_holds.c.maintenance).where(
        worker_holds.c.user_id == bindparam("user_id"),
        worker_holds.c.name_key == bindparam("name_key"),
    )
)


def take_hold(conn: Tx, user_id: int, name_key: str) -> dict[str, bool]:
    """The pause and maintenance a deleted worker of this owner left to the
    name (``leave_hold``), as columns of the worker that now takes the name;
    the hold goes with it (decision 0073). Empty when there is none."""
    params = {"user_id": user_id, "name_key": name_key}
    hold = conn.execute(_HOLD, params).first()
    if hold is None:
        return {}
    conn.execute(
        delete(worker_holds).where(
            worker_holds.c.user_id == user_id, worker_holds.c.name_key == name_key
        )
    )
    return {"paused": bool(hold.paused), "maintenance": bool(hold.maintenance)}


def leave_hold(conn: Tx, row: Mapping[str, Any]) -> None:
    """A worker deleted while paused or in maintenance leaves that to its
    owner and name key: the next worker its owner pops or renames under the
    name has it, so deleting a worker does not lift an admin's pause."""
    if not (row["paused"] or row["maintenance"]):
        return
    where = (worker_holds.c.user_id == row["user_id"], worker_holds.c.name_key == row["name_key"])
    conn.execute(delete(worker_holds).where(*where))
    conn.execute(
        insert(worker_holds).values(
            user_id=row["user_id"],
            name_key=row["name_key"],
            paused=bool(row["paused"]),
            maintenance=bool(row["maintenance"]),
        )
    )


def hold_worker_cap(conn: Tx, user: Mapping[str, Any], name: str, rules: Rules) -> None:
    """After the first pop's claim: the owner's workers counted again with its
    row locked, so that two first pops at once cannot both pass the cap on
    PostgreSQL (the second waits for the first to commit, then counts its
    worker). Taken after the claim, in the transactions' lock order
    (request, users, worker), and FOR NO KEY UPDATE: the worker's insert
    holds the KEY SHARE lock of its foreign key on the same row, which FOR
    UPDATE would wait on in the other pop (a deadlock). SQLite runs one
    writer at a time: there the first count was exact already."""
    cap = worker_cap(user, rules)
    if not cap.limit:
        return
    conn.execute(_LOCK_USER, {"user_id": user["id"]})
    # The count includes this pop's own worker.
    registered = _registered(conn, user["id"]) - 1
    if cap.refuses(registered):
        raise refusals.too_many_workers(name, registered, cap.limit, cap.key)


def stored_declaration(pop: PopRequest, now: float) -> dict[str, Any]:
    return {
        "bridge_agent": pop.bridge_agent,
        "models": list(pop.models),
        "max_length": pop.max_length,
        "max_context_length": pop.max_context_length,
        "nsfw": pop.nsfw,
        "threads": pop.threads,
        "extra_slow": pop.extra_slow_worker,
        "last_check_in": now,
        # Stored from every pop: a pop without chat_jobs withdraws it.
        "chat": pop.chat.to_json() if pop.chat else None,
        "chat_model": pop.chat.model_id if pop.chat else None,
        "prompt_jobs": pop.prompt_jobs,
    }


# Every pop of a known worker runs this: the statement is built once per
# set of columns (one, in practice), not per pop.
@functools.cache
def _touch_statement(columns: tuple[str, ...]) -> Update:
    return prepared(
        update(workers)
        .where(workers.c.id == bindparam("worker_id"))
        .values({c: bindparam(c, type_=workers.c[c].type) for c in columns})
    )


def declaration_changed(row: Mapping[str, Any], declared: dict[str, Any]) -> bool:
    """Whether a pop's ``stored_declaration`` differs from what the worker's
    row holds (what eligibility reads: its models, limits, flags and chat
    declaration)."""
    return any(row[k] != v for k, v in declared.items() if k != "last_check_in")


def touch_worker(
    conn: Tx,
    row: Mapping[str, Any],
    declared: dict[str, Any],
    now: float,
    rules: Rules,
    until: float,
) -> None:
    """Store a pop's ``stored_declaration``: the worker is online from now until ``until``."""
    gap = now - row["last_check_in"]
    uptime = row["uptime"] + gap if 0 < gap <= rules.worker_online else row["uptime"]
    values = {**declared, "online_until": until, "uptime": uptime}
    conn.defer(_touch_statement(tuple(values)), {"worker_id": row["id"], **values})


@dataclasses.dataclass(frozen=True)
class WorkerChanges:
    """What a worker update changed; None: left as it was."""

    maintenance: bool | None = None
    aborts_in_window: int | None = None  # reset when maintenance is cleared
    online: bool | None = None  # False: the worker said it stops
    info: str | None = None  # "" once cleared
    name: str | None = None
    paused: bool | None = None
    team: str | None = None


def update_worker(
    conn: Tx,
    key_hash: str,
    worker_id: str,
    edit: WorkerEdit,
    rules: Rules,
    now: float,
    address: str | None = None,
) -> WorkerChanges:
    """Apply ``edit`` for the worker's owner or an admin (``paused``: an
    admin only). ``edit.offline``: the worker says it stops; it is offline
    from ``now`` until its next pop (hordelite.contract.presence). An
    admin's pause, and an admin's change of another user's worker, are in
    the audit trail (``_audit_worker_edit``), from ``address``."""
    user = authenticate(conn, key_hash, rules)
    row = _worker_to_change(conn, user, worker_id)
    if edit.admin_only and not user["admin"]:
        raise HordeError(RC.NotModerator, "paused: only an admin may pause a worker.")
    values = _edited_values(conn, row, edit, now)
    if values:
        try:
            # A savepoint: a rename racing another to the same name (two
            # transactions on PostgreSQL) is refused, not a failed transaction.
            with conn.begin_nested():
                conn.execute(update(workers).where(workers.c.id == worker_id).values(**values))
        except IntegrityError:
            raise refusals.worker_name_exists(edit.name or "") from None
    if user["admin"]:
        _audit_worker_edit(conn, audit.user_actor(user, address), row, edit, now)
    # The answer lists what changed: clearing maintenance also reset the count.
    return WorkerChanges(
        maintenance=edit.maintenance,
        aborts_in_window=values.get("aborts_in_window"),
        online=False if edit.offline else None,
        info=edit.info,
        name=edit.name,
        paused=edit.paused,
        team=edit.team,
    )


def _audit_worker_edit(
    conn: Tx, actor: audit.Actor, row: Mapping[str, Any], edit: WorkerEdit, now: float
) -> None:
    """An admin's edit of a worker in the trail, on the worker's id: a pause
    or resume (``paused`` is an admin's alone) always; maintenance and any
    other change only on another user's worker. An owner's own maintenance
    is its worker's state, not moderation: not recorded, whether or not
    the owner is an admin."""
    name = row["name"]
    if edit.paused is not None:
        action = "worker.pause" if edit.paused else "worker.resume"
        detail = {"name": name, "paused": [bool(row["paused"]), edit.paused]}
        audit.record(conn, actor, action, row["id"], now, detail)
    if row["user_id"] == actor.user_id:
        return
    if edit.maintenance is not None:
        detail = {"name": name, "maintenance": [bool(row["maintenance"]), edit.maintenance]}
        audit.record(conn, actor, "worker.maintenance", row["id"], now, detail)
    changed: dict[str, Any] = {}
    if edit.name is not None:
        changed["name"] = [name, edit.name]
    if edit.info is not None:
        changed["info"] = [row["info"] or "", edit.info]
    if edit.offline:
        changed["online"] = False
    if changed:
        audit.record(conn, actor, "worker.edit", row["id"], now, {"worker": name, **changed})


def _edited_values(
    conn: Tx, row: Mapping[str, Any], edit: WorkerEdit, now: float
) -> dict[str, Any]:
    """The worker row's columns ``edit`` sets; a new name must be no other
    worker's (compared by key)."""
    values: dict[str, Any] = {}
    if edit.maintenance is not None:
        values["maintenance"] = edit.maintenance
        if not edit.maintenance:
            values["aborts_in_window"] = 0
    if edit.offline:
        values["online_until"] = min(row["online_until"], now)
    if edit.info is not None:
        values["info"] = edit.info or None
    if edit.paused is not None:
        values["paused"] = edit.paused
    if edit.name is not None and edit.name_key is not None:
        if edit.name_key != row["name_key"]:
            values.update(_renamed(conn, row, edit.name, edit.name_key, values))
        values["name"] = edit.name  # or the same name, spelt anew
    return values


def _renamed(
    conn: Tx, row: Mapping[str, Any], name: str, key: str, values: dict[str, Any]
) -> dict[str, Any]:
    """The columns of a worker's new name key: refused when it is another
    worker's; a pause or maintenance its owner's deleted worker left to the
    name comes with it (``take_hold``): a rename does not lift them either,
    unless this edit sets them."""
    if conn.execute(WORKER_BY_KEY, {"name_key": key}).first() is not None:
        raise refusals.worker_name_exists(name)
    changed: dict[str, Any] = {"name_key": key}
    for column, held in take_hold(conn, row["user_id"], key).items():
        if column not in values:
            changed[column] = bool(row[column]) or held
    return changed


def _worker_to_change(conn: Tx, user: Mapping[str, Any], worker_id: str) -> Mapping[str, Any]:
    """The (not deleted) worker ``user`` may change, locked."""
    row = (
        conn.execute(
            select(workers)
            .where(workers.c.id == worker_id, workers.c.deleted == false())
            .with_for_update()
        )
        .mappings()
        .first()
    )
    if row is None:
        raise refusals.unknown_worker(worker_id)
    if row["user_id"] != user["id"] and not user["admin"]:
        raise refusals.not_the_workers_owner()
    return row


@dataclasses.dataclass(frozen=True)
class DeletedWorker:
    """A deleted worker's id and name, and what became of the jobs it held:
    the ids of those jobs, of the requests that got their job back in the
    queue, and of those that ended faulted with it."""

    id: str
    name: str
    job_ids: list[str]
    requeued: list[str]
    ended: list[str]


def delete_worker(
    conn: Tx,
    key_hash: str,
    worker_id: str,
    rules: Rules,
    now: float,
    address: str | None = None,
) -> DeletedWorker:
    """Delete the worker for its owner or an admin. Its jobs in hand go back
    to their requests as when a lease runs out (it can no longer submit
    them); its row stays for the jobs that name it, out of every listing,
    its name and key retired so that anyone may pop with the name again.
    An admin's delete of another user's worker is in the audit trail
    (``worker.delete``), from ``address``."""
    user = authenticate(conn, key_hash, rules)
    found = conn.execute(
        select(workers.c.user_id).where(workers.c.id == worker_id, workers.c.deleted == false())
    ).first()
    if found is None:
        raise refusals.unknown_worker(worker_id)
    if found.user_id != user["id"] and not user["admin"]:
        raise refusals.not_the_workers_owner()
    # Locks in the order submits take them: jobs, requests, then the worker.
    held = (
        conn.execute(
            select(jobs)
            .where(jobs.c.worker_id == worker_id, jobs.c.state == "processing")
            .with_for_update()
        )
        .mappings()
        .all()
    )
    requeued: list[str] = []
    ended: list[str] = []
    for job in held:
        was_requeued, was_ended = lapse_job(conn, job, now, rules)
        (requeued if was_requeued else ended if was_ended else []).append(job["request_id"])
    row = _worker_to_change(conn, user, worker_id)
    leave_hold(conn, row)
    if row["user_id"] != user["id"]:
        detail = {"name": row["name"], "owner_id": row["user_id"], "jobs_given_back": len(held)}
        audit.record(conn, audit.user_actor(user, address), "worker.delete", worker_id, now, detail)
    retired = f"{RETIRED_NAME}{worker_id}"
    conn.execute(
        update(workers)
        .where(workers.c.id == worker_id)
        .values(deleted=True, name=retired, name_key=retired, online_until=0.0)
    )
    return DeletedWorker(worker_id, row["name"], [j["id"] for j in held], requeued, ended)


@dataclasses.dataclass(frozen=True)
class WorkerRecord:
    """A worker with its owner's name and trust, as the service reads it."""

    id: str
    name: str
    owner: str  # the owner's username
    owner_id: int
    trusted: bool  # the owner's trust
    bridge_agent: str
    models: tuple[str, ...]
    max_length: int
    max_context_length: int
    nsfw: bool
    threads: int
    maintenance: bool
    online_until: float
    last_check_in: float  # its last pop
    uptime: float
    requests_fulfilled: int
    uncompleted_jobs: int
    aborts_in_window: int
    kudos_rewards: float
    tokens_generated: float
    seconds_generating: float
    chat: dict[str, Any] | None  # the chat declaration of the last pop, as sent
    chat_model: str | None  # its model, None for a worker without one
    prompt_jobs: bool
    nonconformant_replies: int
    info: str | None = None  # the owner's description
    paused: bool = False


# A worker with its owner's trust and name (worker details, the worker list).
# Deleted workers are no one's: only the jobs that name them still read them.
_WORKER_DETAILS = prepared(
    select(workers, users.c.trusted, users.c.username)
    .join(users, users.c.id == workers.c.user_id)
    .where(workers.c.deleted == false())
)


def _worker_record(row: Mapping[str, Any]) -> WorkerRecord:
    return WorkerRecord(
        id=row["id"],
        name=row["name"],
        owner=row["username"],
        owner_id=row["user_id"],
        trusted=bool(row["trusted"]),
        bridge_agent=row["bridge_agent"],
        models=tuple(row["models"]),
        max_length=row["max_length"],
        max_context_length=row["max_context_length"],
        nsfw=bool(row["nsfw"]),
        threads=row["threads"],
        maintenance=bool(row["maintenance"]),
        online_until=row["online_until"],
        last_check_in=row["last_check_in"],
        uptime=row["uptime"],
        requests_fulfilled=row["requests_fulfilled"],
        uncompleted_jobs=row["uncompleted_jobs"],
        aborts_in_window=row["aborts_in_window"],
        kudos_rewards=row["kudos_rewards"],
        tokens_generated=row["tokens_generated"],
        seconds_generating=row["seconds_generating"],
        chat=row["chat"],
        chat_model=row["chat_model"],
        prompt_jobs=bool(row["prompt_jobs"]),
        nonconformant_replies=row["nonconformant_replies"],
        info=row["info"],
        paused=bool(row["paused"]),
    )


def worker_details(
    conn: Tx, worker_id: str | None = None, name_key: str | None = None
) -> WorkerRecord | None:
    """A worker with its owner's trust and name, by id or by name key; None
    when there is none."""
    q = (
        _WORKER_DETAILS.where(workers.c.id == worker_id)
        if worker_id is not None
        else _WORKER_DETAILS.where(workers.c.name_key == name_key)
    )
    row = conn.execute(q).mappings().first()
    return None if row is None else _worker_record(row)


def list_workers(conn: Tx, now: float | None) -> list[WorkerRecord]:
    """The workers online at ``now`` by name; with None, every worker the
    horde knows, online or not."""
    q = _WORKER_DETAILS if now is None else _WORKER_DETAILS.where(workers.c.online_until > now)
    q = q.order_by(workers.c.name)
    return [_worker_record(r) for r in conn.execute(q).mappings()]


@dataclasses.dataclass(frozen=True)
class WorkerPage:
    """Some of the workers online, and how many are online in all."""

    workers: list[WorkerRecord]
    total: int


def worker_page(conn: Tx, now: float, limit: int, offset: int, busiest: bool = False) -> WorkerPage:
    """The online workers from ``offset``, at most ``limit`` of them: by name
    (read along the name's unique index), or with ``busiest`` those with most
    jobs done first. Only the page's rows are read and decoded, whatever the
    pool holds."""
    online = workers.c.online_until > now
    order = (workers.c.requests_fulfilled.desc(), workers.c.name) if busiest else (workers.c.name,)
    q = _WORKER_DETAILS.where(online).order_by(*order).limit(limit).offset(offset)
    page = [_worker_record(r) for r in conn.execute(q).mappings()]
    total = conn.execute(select(func.count()).select_from(workers).where(online)).scalar_one()
    return WorkerPage(page, int(total))


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """A model the online workers out of maintenance serve: their threads,
    how many they are, their speeds summed weighted by threads (tokens a
    second), and the model's waiting jobs and their tokens."""

    name: str
    threads: int
    workers: int
    speed: float
    jobs: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class ServedModels:
    """Some of the served models, and how many are served in all."""

    models: list[ServedModel]
    total: int


def served_models(
    conn: Tx, now: float, limit: int, offset: int, name: str | None = None
) -> ServedModels:
    """The models online workers out of maintenance serve (only ``name``,
    when given), most threads first (then by name), from ``offset``, at most
    ``limit`` of them, with their queues; in two statements. The database sums the pool: only the page's
    rows come back, whatever the pool holds. A worker's speed is the one
    ``WorkerView.speed`` gives (the assumed speed before its first job)."""
    listed = json_elements(conn, workers.c.models)
    speed = case(
        (
            workers.c.seconds_generating > 0,
            workers.c.tokens_generated / workers.c.seconds_generating,
        ),
        else_=literal(ASSUMED_TOKENS_PER_SECOND),
    )
    serving = (
        select(
            listed.c.value.label("name"),
            func.sum(workers.c.threads).label("threads"),
            func.count().label("workers"),
            func.sum(speed * workers.c.threads).label("speed"),
        )
        .select_from(workers.join(listed, true()))
        .where(
            workers.c.online_until > now,
            workers.c.maintenance == false(),
            workers.c.paused == false(),
        )
    )
    if name is not None:
        serving = serving.where(listed.c.value == name)
    pool = serving.group_by(listed.c.value).subquery()
    rows = conn.execute(
        select(pool, func.count().over().label("total"))
        .order_by(pool.c.threads.desc(), by_codepoint(conn, pool.c.name))
        .limit(limit)
        .offset(offset)
    ).all()
    if rows:
        total = int(rows[0].total)
    else:  # past the last page: the window had no row to count on
        total = int(conn.execute(select(func.count()).select_from(pool)).scalar_one())
    queued = model_queue_stats(conn, [r.name for r in rows])
    models = [
        ServedModel(
            r.name, int(r.threads), int(r.workers), float(r.speed), *queued.get(r.name, (0, 0))
        )
        for r in rows
    ]
    return ServedModels(models, total)


def model_queue_stats(conn: Tx, models: list[str] | None = None) -> dict[str, tuple[int, int]]:
    """Per model (of ``models``, or every model queued; "" is the any-model
    queue): its waiting jobs and their tokens."""
    if models is not None and not models:
        return {}
    stats = (
        select(
            queue.c.model,
            # Jobs, not requests: a request with n = 3 waits for 3 jobs.
            func.coalesce(func.sum(requests.c.remaining), 0),
            func.coalesce(func.sum(requests.c.remaining * requests.c.max_length), 0),
        )
        .join(requests, requests.c.id == queue.c.request_id)
        .group_by(queue.c.model)
    )
    if models is not None:
        stats = stats.where(one_of(conn, queue.c.model, models))
    return {model: (int(jobs), int(tokens)) for model, jobs, tokens in conn.execute(stats)}


def served_model_names(conn: Tx, now: float) -> Select[tuple[str]]:
    """The models the workers online at ``now`` list (in maintenance or not),
    as a subquery: a statement that needs the served models reads them
    itself rather than being sent one parameter per model."""
    listed = json_elements(conn, workers.c.models)
    return (
        select(listed.c.value)
        .select_from(workers.join(listed, true()))
        .where(workers.c.online_until > now)
    )
