"""The audit trail's query rules (contract.audit_query): durations and ISO
times for ``since``, actions checked against the known names (repeated or
comma lists, each once), counts bounded; each refusal names its field."""

from __future__ import annotations

import time

import pytest

from hordelite.contract.audit_query import (
    DEFAULT_PAGE,
    AuditQuery,
    AuditText,
    parse_actions,
    parse_count,
    parse_query,
    parse_since,
    parse_text,
)
from hordelite.errors import RC, HordeError

NOW = 1_800_000_000.0
KNOWN = ("kudos.grant", "user.edit", "worker.pause")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("2h", 7200), ("7d", 7 * 86400), ("1w", 7 * 86400)],
)
def test_a_duration_counts_back_from_now(text: str, seconds: int) -> None:
    assert parse_since(text, NOW, "since") == NOW - seconds


def test_an_iso_time_is_utc_unless_it_says_its_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    # Not the machine's time zone: a naive time read as local would be 5 h off.
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        _check_iso_times()
    finally:
        monkeypatch.undo()
        time.tzset()


def _check_iso_times() -> None:
    assert parse_since("2027-01-15T08:00:00", NOW, "since") == parse_since(
        "2027-01-15T08:00:00Z", NOW, "since"
    )
    assert parse_since("2027-01-15T10:00:00+02:00", NOW, "since") == parse_since(
        "2027-01-15T08:00:00Z", NOW, "since"
    )
    assert parse_since("1970-01-02", NOW, "since") == 86400.0


@pytest.mark.parametrize("text", ["", "2", "2y", "-2h", "yesterday", "2 h", "1e3s"])
def test_anything_else_is_refused_naming_the_field(text: str) -> None:
    with pytest.raises(HordeError) as refused:
        parse_since(text, NOW, "--since")
    assert refused.value.rc is RC.BadRequest
    assert refused.value.message.startswith("--since: ")


def test_actions_come_repeated_or_as_comma_lists_each_once_in_order() -> None:
    given = ["worker.pause", "kudos.grant, worker.pause", "", "user.edit,"]
    assert parse_actions(given, KNOWN, "action") == ("worker.pause", "kudos.grant", "user.edit")
    with pytest.raises(HordeError, match=r"action: no action 'kudos\.granted'; the actions: "):
        parse_actions(["kudos.granted"], KNOWN, "action")


def test_counts_and_names_are_bounded() -> None:
    assert parse_count("500", "limit", 500) == 500
    for text in ("0", "501", "-1", "x", "1.5", "²"):
        with pytest.raises(HordeError, match=r"^BadRequest: limit: "):
            parse_count(text, "limit", 500)
    assert parse_text(" mod#2 ", "actor", 255) == "mod#2"
    for text in ("", "   ", "x" * 256):
        with pytest.raises(HordeError, match=r"^BadRequest: actor: "):
            parse_text(text, "actor", 255)


def test_a_query_is_read_from_its_text_and_each_refusal_names_its_field_as_given() -> None:
    given = AuditText(["kudos.grant"], " mod#2 ", "alice#3", "2h", "40", "10")
    assert parse_query(given, KNOWN, NOW) == AuditQuery(
        actions=("kudos.grant",),
        actor="mod#2",
        target="alice#3",
        since=NOW - 7200,
        before_id=40,
        limit=10,
    )
    assert parse_query(AuditText(), KNOWN, NOW) == AuditQuery(limit=DEFAULT_PAGE)
    # The shell names its flags, the route its parameters.
    with pytest.raises(HordeError, match=r"^BadRequest: --limit: at most 500"):
        parse_query(AuditText(limit="501"), KNOWN, NOW, "--")
    with pytest.raises(HordeError, match=r"^BadRequest: action: no action"):
        parse_query(AuditText(actions=["kudos.granted"]), KNOWN, NOW)
