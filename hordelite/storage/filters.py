"""Prompt filters in the database (docs/reference/filters.md): an admin
writes, changes and deletes them (through the routes, or the operator at the
shell), each change recorded in the audit trail and bumping the filters'
revision in its own transaction; every process reads the revision to know
when to read them again (hordelite.horde.moderation)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, func, insert, or_, select, update

from hordelite.contract.filters import FilterEdit, FilterSpec, Screened
from hordelite.contract.limits import MAX_FILTERS
from hordelite.errors import RC, HordeError
from hordelite.storage import audit
from hordelite.storage.accounts import authenticate
from hordelite.storage.rules import Rules
from hordelite.storage.schema import filter_revision, filters
from hordelite.storage.shared_keys import requester
from hordelite.storage.transaction import Tx


@dataclasses.dataclass(frozen=True)
class FilterRecord:
    id: int
    regex: str
    filter_type: int
    description: str | None
    replacement: str
    action: str
    user: str  # name#id of the admin who wrote or last changed it ("cli": the operator)

    @property
    def spec(self) -> FilterSpec:
        return FilterSpec(
            self.regex, self.filter_type, self.description, self.replacement, self.action
        )


@dataclasses.dataclass(frozen=True)
class FilterRules:
    """Every filter and the revision they were read at."""

    revision: int
    records: tuple[FilterRecord, ...]


def _record(row: Mapping[str, Any]) -> FilterRecord:
    return FilterRecord(
        id=row["id"],
        regex=row["regex"],
        filter_type=row["filter_type"],
        description=row["description"],
        replacement=row["replacement"] or "",
        action=row["action"],
        user=row["author"],
    )


def moderator(
    conn: Tx, key_hash: str | None, rules: Rules, address: str, doing: str
) -> audit.Actor:
    """Who acts on the filters: the key's user, when an admin (403
    NotModerator else); the operator at the shell for no key."""
    if key_hash is None:
        return audit.CLI_ACTOR
    user = authenticate(conn, key_hash, rules)
    if not user["admin"] or user["anonymous"]:
        raise HordeError(RC.NotModerator, f"Only an admin of this horde may {doing}.")
    return audit.user_actor(user, address)


def revision(conn: Tx) -> int:
    """The filters' revision: it changes with every change to them."""
    found = conn.execute(select(filter_revision.c.revision).where(filter_revision.c.id == 1))
    return int(found.scalar() or 0)


def _bump(conn: Tx) -> None:
    bumped = conn.execute(
        update(filter_revision)
        .where(filter_revision.c.id == 1)
        .values(revision=filter_revision.c.revision + 1)
    )
    if not bumped.rowcount:
        conn.execute(insert(filter_revision).values(id=1, revision=1))


def every_filter(conn: Tx) -> FilterRules:
    """Every filter, in id order, with the revision read first (a change
    committed meanwhile bumps it past what is answered: read again)."""
    at = revision(conn)
    rows = conn.execute(select(filters).order_by(filters.c.id)).mappings()
    return FilterRules(at, tuple(_record(r) for r in rows))


def list_filters(
    conn: Tx,
    key_hash: str | None,
    rules: Rules,
    filter_type: int | None,
    contains: str | None,
) -> list[FilterRecord]:
    """GET /filters: the filters of ``filter_type`` whose regex or
    description contains ``contains`` (any, when None), in id order."""
    moderator(conn, key_hash, rules, "", "read the filters")
    query = select(filters).order_by(filters.c.id)
    if filter_type is not None:
        query = query.where(filters.c.filter_type == filter_type)
    if contains:
        query = query.where(
            or_(
                filters.c.regex.contains(contains, autoescape=True),
                filters.c.description.contains(contains, autoescape=True),
            )
        )
    return [_record(r) for r in conn.execute(query).mappings()]


def one_filter(conn: Tx, key_hash: str | None, rules: Rules, filter_id: int) -> FilterRecord:
    moderator(conn, key_hash, rules, "", "read the filters")
    return _found(conn, filter_id)


def _found(conn: Tx, filter_id: int) -> FilterRecord:
    row = conn.execute(select(filters).where(filters.c.id == filter_id)).mappings().first()
    if row is None:
        raise HordeError(RC.FilterNotFound, f"Filter with ID '{filter_id}' not found.")
    return _record(row)


def create_filter(
    conn: Tx, key_hash: str | None, rules: Rules, spec: FilterSpec, address: str, now: float
) -> tuple[FilterRecord, bool]:
    """A new filter, and True; the filter with the same regex and type, and
    False, when there is one (the AI Horde's PUT answers it so). 400
    TooManyFilters past MAX_FILTERS."""
    actor = moderator(conn, key_hash, rules, address, "add a filter")
    same = (
        conn.execute(
            select(filters).where(
                filters.c.regex == spec.regex, filters.c.filter_type == spec.filter_type
            )
        )
        .mappings()
        .first()
    )
    if same is not None:
        return _record(same), False
    if (conn.execute(select(func.count()).select_from(filters)).scalar() or 0) >= MAX_FILTERS:
        raise HordeError(RC.TooManyFilters, f"This horde holds {MAX_FILTERS} filters, its most.")
    values = {**_values(spec), "user_id": actor.user_id, "author": actor.name}
    new_id = conn.execute(
        insert(filters).values(created=now, updated=now, **values).returning(filters.c.id)
    ).scalar_one()
    _bump(conn)
    audit.record(conn, actor, "filter.create", f"filter:{new_id}", now, _detail(spec))
    return _found(conn, new_id), True


def edit_filter(
    conn: Tx,
    key_hash: str | None,
    rules: Rules,
    filter_id: int,
    edit: FilterEdit,
    address: str,
    now: float,
) -> FilterRecord:
    """PATCH /filters/{id}: the fields given changed; the filter as it is now."""
    actor = moderator(conn, key_hash, rules, address, "change a filter")
    before = _found(conn, filter_id)
    after = edit.applied(before.spec)
    conn.execute(
        update(filters)
        .where(filters.c.id == filter_id)
        .values(updated=now, user_id=actor.user_id, author=actor.name, **_values(after))
    )
    _bump(conn)
    changed = {k: v for k, v in _detail(after).items() if _detail(before.spec).get(k) != v}
    audit.record(conn, actor, "filter.edit", f"filter:{filter_id}", now, changed)
    return _found(conn, filter_id)


def delete_filter(
    conn: Tx, key_hash: str | None, rules: Rules, filter_id: int, address: str, now: float
) -> None:
    actor = moderator(conn, key_hash, rules, address, "delete a filter")
    gone = _found(conn, filter_id)
    conn.execute(delete(filters).where(filters.c.id == filter_id))
    _bump(conn)
    audit.record(conn, actor, "filter.delete", f"filter:{filter_id}", now, _detail(gone.spec))


def _values(spec: FilterSpec) -> dict[str, Any]:
    return {
        "regex": spec.regex,
        "filter_type": spec.filter_type,
        "description": spec.description,
        "replacement": spec.replacement,
        "action": spec.action,
    }


def _detail(spec: FilterSpec) -> dict[str, Any]:
    """What the audit keeps of a rule: all of it (an admin's words, not a
    requester's)."""
    return _values(spec)


def record_screened(conn: Tx, key_hash: str, rules: Rules, screened: Screened, now: float) -> None:
    """A request refused or flagged by filters, in the audit trail: its
    requester (a shared key's lender) as the actor, from its client
    address; the filters it matched as the target. Never the prompt."""
    user, _shared = requester(conn, key_hash, rules, None)
    actor = audit.user_actor(user, screened.client)
    ids = screened.filter_ids
    target = "filter:" + ",".join(str(i) for i in ids)
    detail = {"kind": screened.kind, "filters": list(ids)}
    audit.record(conn, actor, screened.action, target, now, detail)
