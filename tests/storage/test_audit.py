"""The audit trail's storage (decision 0077): entries written, read newest
first by page and filter, refused for an unknown action, and purged past
the retention by the sweep; on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses

import pytest

from hordelite.contract.audit_query import AuditQuery
from hordelite.storage import audit, queries
from hordelite.storage.database import Database
from tests.storage.helpers import NOW, RULES


def _record(db: Database, action: str, target: str, at: float, actor: audit.Actor) -> None:
    db.run_sync(audit.record, True, actor, action, target, at, {"why": target})


def test_entries_come_newest_first_in_pages_and_by_filter(database: Database) -> None:
    admin = audit.Actor("mod#2", 2, "203.0.113.9")
    for i in range(5):
        _record(database, "filter.create", f"filter {i}", NOW + i, admin)
    _record(database, "kudos.grant", "alice#3", NOW + 10, audit.CLI_ACTOR)

    first = database.run_sync(audit.entries, False, AuditQuery(limit=3))
    assert [e.target for e in first] == ["alice#3", "filter 4", "filter 3"]
    assert (first[0].actor, first[0].actor_id, first[0].address) == ("cli", None, "")
    shown = (first[1].actor, first[1].actor_id, first[1].address, first[1].detail)
    assert shown == ("mod#2", 2, "203.0.113.9", {"why": "filter 4"})
    second = database.run_sync(audit.entries, False, AuditQuery(limit=3, before_id=first[-1].id))
    assert [e.target for e in second] == ["filter 2", "filter 1", "filter 0"]

    grants = database.run_sync(audit.entries, False, AuditQuery(actions=("kudos.grant",)))
    assert [e.target for e in grants] == ["alice#3"]
    by_mod = database.run_sync(audit.entries, False, AuditQuery(actor="mod#2", since=NOW + 3))
    assert [e.target for e in by_mod] == ["filter 4", "filter 3"]
    on_one = database.run_sync(audit.entries, False, AuditQuery(target="filter 1"))
    assert [e.at for e in on_one] == [NOW + 1]


def test_an_unknown_action_is_refused_and_nothing_is_written(database: Database) -> None:
    with pytest.raises(ValueError, match="not an audit action"):
        _record(database, "filter.created", "x", NOW, audit.CLI_ACTOR)
    assert database.run_sync(audit.entries, False) == []


def test_the_sweep_deletes_entries_older_than_the_retention(database: Database) -> None:
    rules = dataclasses.replace(RULES, audit_retention=100.0)
    _record(database, "mode.set", "maintenance", NOW - 101, audit.CLI_ACTOR)
    _record(database, "mode.set", "raid_mode", NOW - 99, audit.CLI_ACTOR)
    database.run_sync(queries.sweep, True, NOW, rules)
    assert [e.target for e in database.run_sync(audit.entries, False)] == ["raid_mode"]
