"""Timeouts and blocks by address, the pure rules (contract.addresses):
canonical targets and the /64 rule, membership, the refusal's message,
growing timeouts and the route bodies."""

from __future__ import annotations

import math
from typing import Any

import pytest

from hordelite.contract.addresses import (
    Offences,
    Policy,
    Rule,
    RuleSet,
    after_offence,
    listed_seconds,
    offence_kind,
    offence_timeout,
    parse_lift_order,
    parse_target,
    parse_timeout_order,
    parse_worker_block,
    refusal,
)
from hordelite.contract.forwarded import client_address
from hordelite.errors import RC, HordeError


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("203.0.113.7", "203.0.113.7"),
        (" 203.0.113.7 ", "203.0.113.7"),
        ("203.0.113.7/32", "203.0.113.7"),
        ("198.51.100.77/24", "198.51.100.0/24"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        # An IPv6 address, or a range narrower than /64, is its /64.
        ("2001:db8:1:2::7", "2001:db8:1:2::/64"),
        ("2001:DB8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:3::/80", "2001:db8:1:2::/64"),
        ("2001:db8::/32", "2001:db8::/32"),
        ("fe80::1%eth0", "fe80::/64"),
    ],
)
def test_a_target_is_stored_in_one_canonical_form(given: str, stored: str) -> None:
    assert parse_target(given) == stored


@pytest.mark.parametrize("bad", ["", "  ", "localhost", "203.0.113.300", "1.2.3.4/33", 7, None])
def test_anything_else_is_a_bad_request_naming_the_field(bad: Any) -> None:
    with pytest.raises(HordeError) as caught:
        parse_target(bad)
    assert caught.value.rc is RC.BadRequest
    assert caught.value.extra["errors"].keys() == {"ipaddr"}


def test_the_client_as_forwarded_finds_it_is_already_canonical() -> None:
    for peer in ("203.0.113.7", "2001:db8:1:2::99", "::ffff:198.51.100.1"):
        client = client_address(peer, ())
        assert client is not None
        assert parse_target(client) == client


def rules(*pairs: tuple[str, float | None]) -> RuleSet:
    return RuleSet(Rule(parse_target(t), until) for t, until in pairs)


def test_a_rule_covers_the_members_of_its_network_and_nothing_else() -> None:
    found = rules(("198.51.100.0/24", None), ("203.0.113.7", 100.0), ("2001:db8:1:2::1", 50.0))
    assert found.left("198.51.100.77", 0.0) == math.inf
    assert found.left("198.51.101.1", 0.0) == 0.0
    assert found.left("203.0.113.7", 0.0) == 100.0
    assert found.left("203.0.113.8", 0.0) == 0.0
    assert found.left("2001:db8:1:2::/64", 0.0) == 50.0  # the client as counted
    assert found.left("2001:db8:1:3::/64", 0.0) == 0.0
    assert found.left(None, 0.0) == 0.0
    assert found.left("not an address", 0.0) == 0.0


def test_a_lapsed_timeout_stops_applying_when_it_lapses() -> None:
    found = rules(("203.0.113.0/24", 100.0))
    assert found.left("203.0.113.7", 99.5) == 0.5
    assert found.left("203.0.113.7", 100.0) == 0.0
    assert found.covering("203.0.113.7", 100.0) == []


def test_the_longest_of_the_rules_covering_a_client_is_what_is_left() -> None:
    found = rules(("10.0.0.0/8", 30.0), ("10.1.0.0/16", 90.0), ("10.1.2.3", 60.0))
    assert found.left("10.1.2.3", 0.0) == 90.0
    assert {r.target for r in found.covering("10.1.2.3", 0.0)} == {
        "10.0.0.0/8",
        "10.1.0.0/16",
        "10.1.2.3",
    }
    # A range is covered by the rules whose network holds all of it.
    assert {r.target for r in found.covering("10.1.0.0/16", 0.0)} == {"10.0.0.0/8", "10.1.0.0/16"}
    # IPv4 and IPv6 rules never cover each other's clients.
    assert rules(("::/0", None)).left("203.0.113.7", 0.0) == 0.0


def test_the_refusal_says_how_long_is_left_or_that_it_is_a_block() -> None:
    timed = refusal(539.2)
    assert (timed.rc, timed.status) == (RC.TimeoutIP, 403)
    assert "540 more seconds" in timed.message
    assert timed.extra["retry_after"] == 540
    assert "worker" in refusal(10, worker=True).message
    blocked = refusal(math.inf)
    assert "blocked" in blocked.message
    assert "retry_after" not in blocked.extra


def test_a_listed_block_has_seconds_minus_one_as_redis_answers_a_key_without_expiry() -> None:
    assert listed_seconds(Rule("203.0.113.7", None), 5.0) == -1
    assert listed_seconds(Rule("203.0.113.7", 100.0), 0.5) == 100
    assert listed_seconds(Rule("203.0.113.7", 100.0), 200.0) == 0


def test_offences_grow_the_timeout_as_the_ai_horde_does() -> None:
    # (2n - 1) x the first: 3, 9, 15, 21 minutes, capped.
    assert [offence_timeout(n, 180.0, 86400.0) for n in (1, 2, 3, 4)] == [180, 540, 900, 1260]
    assert offence_timeout(1000, 180.0, 3600.0) == 3600.0


def test_a_filter_refusal_is_an_offence_and_budget_refusals_are_one_every_nth() -> None:
    policy = Policy(refusals_per_offence=3, memory=100.0)

    def offend(record: Offences, kind: str, now: float) -> tuple[Offences, bool]:
        return after_offence(
            record,
            kind,
            now,
            memory=policy.memory,
            refusals_per_offence=policy.refusals_per_offence,
        )

    record, offence = offend(Offences(), offence_kind("CorruptPrompt") or "", 1.0)
    assert (record.offences, offence) == (1, True)
    said = []
    for t in range(2, 8):
        record, offence = offend(record, offence_kind("TooManyPrompts") or "", float(t))
        said.append(offence)
    assert said == [False, False, True, False, False, True]
    assert (record.offences, record.refusals) == (3, 0)
    # Past the memory after the last one, the count starts again.
    record, offence = offend(record, "filter", 7.0 + 100.5)
    assert (record.offences, offence) == (1, True)
    # 0 refusals per offence: budget refusals never are one.
    none = after_offence(Offences(), "budget", 0.0, memory=10.0, refusals_per_offence=0)
    assert none == (Offences(), False)


def test_which_refusals_are_offences() -> None:
    assert offence_kind("CorruptPrompt") == "filter"
    for name in ("TooManyPrompts", "StoredBytesExceeded", "RequestTooLarge", "TooManyImages"):
        assert offence_kind(name) == "budget"
    for name in ("RequestRateExceeded", "TimeoutIP", "BadRequest", "KudosUpfront"):
        assert offence_kind(name) is None


def test_the_route_bodies_are_the_ai_horde_s_with_a_block_of_hordelite_s() -> None:
    order = parse_timeout_order({"ipaddr": "2001:db8:1:2::7", "hours": 24})
    assert (order.target, order.seconds) == ("2001:db8:1:2::/64", 86400.0)
    block = parse_timeout_order({"ipaddr": "198.51.100.0/24", "block": True})
    assert (block.target, block.seconds) == ("198.51.100.0/24", None)
    assert parse_lift_order({"ipaddr": "203.0.113.7"}) == "203.0.113.7"
    assert parse_worker_block({"days": 7}) == 7 * 86400.0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"ipaddr": "203.0.113.7"}, "hours"),
        ({"ipaddr": "203.0.113.7", "hours": 0}, "hours"),
        ({"ipaddr": "203.0.113.7", "hours": 721}, "hours"),
        ({"ipaddr": "203.0.113.7", "hours": 1.5}, "hours"),
        ({"ipaddr": "203.0.113.7", "hours": True}, "hours"),
        ({"ipaddr": "203.0.113.7", "block": "yes"}, "block"),
        ({"hours": 1}, "ipaddr"),
        ([], "body"),
    ],
)
def test_a_bad_timeout_body_names_its_field(body: Any, field: str) -> None:
    with pytest.raises(HordeError) as caught:
        parse_timeout_order(body)
    assert caught.value.extra["errors"].keys() == {field}


@pytest.mark.parametrize("days", [0, 31, "7", None])
def test_a_worker_block_takes_1_to_30_days(days: Any) -> None:
    with pytest.raises(HordeError) as caught:
        parse_worker_block({"days": days})
    assert caught.value.extra["errors"].keys() == {"days"}
