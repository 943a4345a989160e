"""Timeouts and blocks by address (contract.addresses), in the database so
that one SQLite horde and PostgreSQL replicas alike enforce them with no
Redis: the rules, their version (bumped by every change, which each process
polls), the offences that grow automatic timeouts, and the audit entry of
each change in its own transaction."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import delete, insert, or_, select, update

from hordelite.contract import refusals
from hordelite.contract.addresses import (
    Offences,
    Policy,
    Rule,
    after_offence,
    offence_timeout,
)
from hordelite.errors import RC, HordeError
from hordelite.storage import audit
from hordelite.storage.accounts import authenticate
from hordelite.storage.rules import Rules
from hordelite.storage.schema import (
    address_offences,
    address_rules,
    address_rules_version,
    workers,
)
from hordelite.storage.transaction import Tx

_VERSION_ROW = 1

P = ParamSpec("P")
T = TypeVar("T")


def admin_actor(conn: Tx, key_hash: str, rules: Rules, address: str | None) -> audit.Actor:
    """The admin a key belongs to, as the audit trail names it; raises
    InvalidAPIKey, and NotModerator for any other user (the AI Horde's)."""
    user = authenticate(conn, key_hash, rules)
    if not user["admin"]:
        raise HordeError(RC.NotModerator, "Only an admin of this horde may time out addresses.")
    return audit.user_actor(user, address)


def version(conn: Tx) -> int:
    """The rules' version (0 before any change)."""
    found = conn.execute(
        select(address_rules_version.c.version).where(address_rules_version.c.id == _VERSION_ROW)
    ).scalar()
    return int(found or 0)


def _bump(conn: Tx) -> None:
    moved = conn.execute(
        update(address_rules_version)
        .where(address_rules_version.c.id == _VERSION_ROW)
        .values(version=address_rules_version.c.version + 1)
    ).rowcount
    if not moved:
        conn.execute(insert(address_rules_version).values(id=_VERSION_ROW, version=1))


def _rule(row: Mapping[str, Any]) -> Rule:
    return Rule(row["target"], row["until"], row["created"], bool(row["automatic"]))


def in_force(conn: Tx, now: float) -> tuple[int, list[Rule]]:
    """The version and the rules in force at ``now`` (blocks, and timeouts
    not lapsed), read in that order: a change committed between the two
    reads leaves the version behind, so the next look reads again."""
    current = version(conn)
    rows = conn.execute(
        select(address_rules).where(
            or_(address_rules.c.until.is_(None), address_rules.c.until > now)
        )
    ).mappings()
    return current, sorted((_rule(r) for r in rows), key=lambda r: r.target)


def _existing(conn: Tx, target: str) -> Rule | None:
    row = conn.execute(select(address_rules).where(address_rules.c.target == target)).mappings()
    found = row.first()
    return None if found is None else _rule(found)


def _put(conn: Tx, rule: Rule) -> None:
    values = {"until": rule.until, "created": rule.created, "automatic": rule.automatic}
    if _existing(conn, rule.target) is None:
        conn.execute(insert(address_rules).values(target=rule.target, **values))
    else:
        conn.execute(
            update(address_rules).where(address_rules.c.target == rule.target).values(**values)
        )
    _bump(conn)


def set_rule(conn: Tx, actor: audit.Actor, target: str, until: float | None, now: float) -> Rule:
    """Time ``target`` out until ``until`` or (None) block it, in place of
    any rule it had: an operator's word is the last."""
    rule = Rule(target, until, now)
    _put(conn, rule)
    if until is None:
        audit.record(conn, actor, "address.block", target, now)
    else:
        audit.record(conn, actor, "address.timeout", target, now, {"seconds": until - now})
    return rule


def lift(
    conn: Tx, actor: audit.Actor, target: str, now: float, worker_id: str | None = None
) -> bool:
    """Lift ``target``'s timeout or block and forget its offences; whether
    it had a rule (recorded either way: the lift is the moderator's act)."""
    found = conn.execute(delete(address_rules).where(address_rules.c.target == target)).rowcount
    conn.execute(delete(address_offences).where(address_offences.c.client == target))
    if found:
        _bump(conn)
    detail: dict[str, Any] = {"found": bool(found)}
    if worker_id is not None:
        detail["worker_id"] = worker_id
    audit.record(conn, actor, "address.lift", target, now, detail)
    return bool(found)


def offend(conn: Tx, client: str, kind: str, now: float, policy: Policy) -> Rule | None:
    """Count a refusal of ``kind`` against ``client``; when it is an
    offence, time ``client`` out for as long as its count says (never
    shortening a rule it has) and record that as the horde's. The timeout
    given, or None."""
    row = (
        conn.execute(select(address_offences).where(address_offences.c.client == client))
        .mappings()
        .first()
    )
    before = Offences() if row is None else Offences(row["offences"], row["refusals"], row["last"])
    after, offence = after_offence(
        before, kind, now, memory=policy.memory, refusals_per_offence=policy.refusals_per_offence
    )
    values = {"offences": after.offences, "refusals": after.refusals, "last": now}
    if row is None:
        conn.execute(insert(address_offences).values(client=client, **values))
    else:
        conn.execute(
            update(address_offences).where(address_offences.c.client == client).values(**values)
        )
    if not offence:
        return None
    seconds = offence_timeout(after.offences, policy.first, policy.longest)
    if seconds <= 0:  # offence_timeout 0: offences are counted, never timed out
        return None
    existing = _existing(conn, client)
    if existing is not None and existing.left(now) >= seconds:
        return None
    rule = Rule(client, now + seconds, now, automatic=True)
    _put(conn, rule)
    detail = {"seconds": seconds, "offences": after.offences, "kind": kind}
    audit.record(conn, audit.HORDE_ACTOR, "address.timeout", client, now, detail)
    return rule


def _worker_address(conn: Tx, worker_id: str) -> str:
    row = conn.execute(
        select(workers.c.id, workers.c.address).where(workers.c.id == worker_id)
    ).first()
    if row is None:
        raise refusals.unknown_worker(worker_id)
    if not row.address:
        raise HordeError(
            RC.BadRequest,
            f"worker_id: worker {worker_id} has not popped from a known address.",
            errors={"worker_id": "has not popped from a known address"},
        )
    return str(row.address)


def block_worker(conn: Tx, actor: audit.Actor, worker_id: str, seconds: float, now: float) -> str:
    """Time out the address ``worker_id`` last popped from (an IPv6 one
    as its /64) for ``seconds``; the address."""
    address = _worker_address(conn, worker_id)
    _put(conn, Rule(address, now + seconds, now))
    detail = {"address": address, "seconds": seconds}
    audit.record(conn, actor, "worker.address_block", worker_id, now, detail)
    return address


def unblock_worker(conn: Tx, actor: audit.Actor, worker_id: str, now: float) -> str:
    """Lift the timeout of the address ``worker_id`` last popped from; the address."""
    address = _worker_address(conn, worker_id)
    lift(conn, actor, address, now, worker_id)
    return address


def note_worker_address(conn: Tx, worker_id: str, stored: str | None, address: str | None) -> None:
    """Keep the address a worker pops from, written only when it moved."""
    if address is not None and address != stored:
        conn.execute(update(workers).where(workers.c.id == worker_id).values(address=address))


def purge(conn: Tx, now: float, memory: float) -> None:
    """Lapsed timeouts and offences older than ``memory`` deleted (the
    sweep's). A lapsed timeout no longer applies anyway: the version
    stays."""
    conn.execute(
        delete(address_rules).where(
            address_rules.c.until.is_not(None), address_rules.c.until <= now
        )
    )
    conn.execute(delete(address_offences).where(address_offences.c.last < now - memory))


def by_admin(
    conn: Tx,
    key_hash: str,
    rules: Rules,
    address: str | None,
    change: Callable[Concatenate[Tx, audit.Actor, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """``change`` made by the admin the key belongs to, from ``address``, in
    the transaction that checks it is one (NotModerator otherwise)."""
    return change(conn, admin_actor(conn, key_hash, rules, address), *args, **kwargs)


def listed(conn: Tx, key_hash: str, rules: Rules, now: float) -> list[Rule]:
    """The rules in force, for an admin (NotModerator otherwise)."""
    admin_actor(conn, key_hash, rules, None)
    return in_force(conn, now)[1]
