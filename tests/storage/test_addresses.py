"""Timeouts and blocks by address in storage (storage.addresses), on
SQLite and PostgreSQL: the version each change bumps, the growth of
automatic timeouts that never shorten a rule, a lift forgetting offences,
and the sweep deleting what no longer applies."""

from __future__ import annotations

import dataclasses

from sqlalchemy import select

from hordelite.contract.addresses import Policy
from hordelite.contract.audit_query import AuditQuery
from hordelite.storage import addresses, audit, queries
from hordelite.storage.database import Database
from hordelite.storage.schema import address_offences, address_rules
from hordelite.storage.transaction import Tx
from tests.storage.helpers import NOW, RULES

POLICY = Policy(first=60.0, longest=1000.0, memory=500.0, refusals_per_offence=2)


def in_force(db: Database, now: float = NOW) -> list[tuple[str, float | None]]:
    return [(r.target, r.until) for r in db.run_sync(addresses.in_force, False, now)[1]]


def version(db: Database) -> int:
    return db.run_sync(addresses.version, False)


def offend(db: Database, client: str, kind: str, now: float = NOW) -> object:
    return db.run_sync(addresses.offend, True, client, kind, now, POLICY)


def test_every_change_bumps_the_version_and_a_timeout_replaces_a_block(database: Database) -> None:
    assert version(database) == 0
    database.run_sync(addresses.set_rule, True, audit.CLI_ACTOR, "198.51.100.0/24", None, NOW)
    assert (version(database), in_force(database)) == (1, [("198.51.100.0/24", None)])
    until = NOW + 60
    database.run_sync(addresses.set_rule, True, audit.CLI_ACTOR, "198.51.100.0/24", until, NOW)
    assert (version(database), in_force(database)) == (2, [("198.51.100.0/24", until)])
    assert in_force(database, until) == []  # lapsed: not in force
    assert database.run_sync(addresses.lift, True, audit.CLI_ACTOR, "198.51.100.0/24", NOW)
    assert (version(database), in_force(database)) == (3, [])
    # Lifting what has no rule changes nothing the processes hold.
    assert not database.run_sync(addresses.lift, True, audit.CLI_ACTOR, "198.51.100.0/24", NOW)
    assert version(database) == 3


def test_offences_grow_a_timeout_that_never_shortens_an_operator_s_rule(
    database: Database,
) -> None:
    assert offend(database, "203.0.113.7", "budget") is None  # one refusal: no offence yet
    first = offend(database, "203.0.113.7", "budget")
    assert first is not None
    assert in_force(database) == [("203.0.113.7", NOW + 60)]
    offend(database, "203.0.113.7", "filter", NOW + 10)
    assert in_force(database) == [("203.0.113.7", NOW + 10 + 180)]
    # An operator's block stands whatever the offences.
    database.run_sync(addresses.set_rule, True, audit.CLI_ACTOR, "203.0.113.7", None, NOW + 20)
    assert offend(database, "203.0.113.7", "filter", NOW + 30) is None
    assert in_force(database, NOW + 30) == [("203.0.113.7", None)]
    by_horde = database.run_sync(audit.entries, False, AuditQuery(actor="horde"))
    assert [e.detail["offences"] for e in reversed(by_horde)] == [1, 2]
    # A lift forgets the offences: the next one is a first again.
    database.run_sync(addresses.lift, True, audit.CLI_ACTOR, "203.0.113.7", NOW + 40)
    offend(database, "203.0.113.7", "filter", NOW + 50)
    assert in_force(database, NOW + 50) == [("203.0.113.7", NOW + 50 + 60)]


def test_offence_timeout_0_counts_offences_and_times_nothing_out(database: Database) -> None:
    none = dataclasses.replace(POLICY, first=0.0)
    for _ in range(3):
        assert database.run_sync(addresses.offend, True, "203.0.113.7", "filter", NOW, none) is None
    assert in_force(database) == []


def test_the_sweep_deletes_lapsed_timeouts_and_forgotten_offences(database: Database) -> None:
    rules = dataclasses.replace(RULES, offences=POLICY)
    database.run_sync(addresses.set_rule, True, audit.CLI_ACTOR, "203.0.113.1", NOW - 1, NOW - 9)
    database.run_sync(addresses.set_rule, True, audit.CLI_ACTOR, "203.0.113.2", NOW + 9, NOW - 9)
    database.run_sync(addresses.set_rule, True, audit.CLI_ACTOR, "203.0.113.3", None, NOW - 9)
    offend(database, "198.51.100.1", "budget", NOW - 501)
    offend(database, "198.51.100.2", "budget", NOW - 499)
    database.run_sync(queries.sweep, True, NOW, rules)

    def rows(conn: Tx) -> tuple[list[str], list[str]]:
        kept = [r[0] for r in conn.execute(select(address_rules.c.target))]
        counted = [r[0] for r in conn.execute(select(address_offences.c.client))]
        return sorted(kept), sorted(counted)

    assert database.run_sync(rows, False) == (["203.0.113.2", "203.0.113.3"], ["198.51.100.2"])
