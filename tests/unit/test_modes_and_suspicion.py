"""The pure rules of the horde's modes and of worker suspicion
(hordelite.contract.modes, hordelite.contract.suspicion)."""

from __future__ import annotations

import pytest

from hordelite.contract.modes import Modes, parse_modes_edit, silenced
from hordelite.contract.suspicion import (
    Suspicion,
    added,
    name_suspicions,
    name_words,
    too_fast,
)
from hordelite.contract.worker_edit import parse_worker_edit
from hordelite.errors import RC, HordeError


def test_a_modes_body_sets_the_modes_it_names_and_leaves_null_ones() -> None:
    body = {"maintenance_mode": True, "raid_mode": None, "invite_only_mode": False}
    assert parse_modes_edit(body) == {"maintenance": True, "invite_only": False}


@pytest.mark.parametrize("body", [{}, {"raid_mode": None}, {"other": True}])
def test_a_modes_body_setting_nothing_is_no_horde_mod_selected(body: object) -> None:
    with pytest.raises(HordeError) as raised:
        parse_modes_edit(body)
    assert raised.value.rc is RC.NoHordeModSelected


@pytest.mark.parametrize("value", ["true", 1, 0, [], {}])
def test_a_mode_that_is_not_a_boolean_is_refused_naming_its_field(value: object) -> None:
    with pytest.raises(HordeError) as raised:
        parse_modes_edit({"raid_mode": value})
    assert raised.value.rc is RC.BadRequest
    assert raised.value.extra["errors"].keys() == {"raid_mode"}


def test_a_modes_body_must_be_an_object() -> None:
    with pytest.raises(HordeError) as raised:
        parse_modes_edit([True])
    assert raised.value.rc is RC.BadRequest


def test_raid_mode_is_silent_and_closes_the_door_to_new_workers_as_invite_only_does() -> None:
    assert not Modes().silent
    assert not Modes().closed_to_new_workers
    assert Modes(raid=True).silent
    assert Modes(raid=True).closed_to_new_workers
    assert not Modes(invite_only=True).silent
    assert Modes(invite_only=True).closed_to_new_workers
    assert not Modes(maintenance=True).silent


def test_a_silenced_refusal_keeps_its_code_and_drops_its_reason_and_time() -> None:
    loud = HordeError(
        RC.RequestRateExceeded, "your address is timed out for 312 s", retry_after=312
    )
    quiet = silenced(loud)
    assert quiet.rc is RC.RequestRateExceeded
    assert quiet.status == 429
    assert quiet.message == RC.RequestRateExceeded.default_message
    assert quiet.extra == {}


def test_a_name_reason_counts_once_and_speed_each_time() -> None:
    count, seen = added(0, 0, [Suspicion.WORKER_PROFANITY])
    assert (count, seen) == (1, 1 << 2)
    assert added(count, seen, [Suspicion.WORKER_PROFANITY]) == (1, seen)
    count, seen = added(count, seen, [Suspicion.UNREASONABLY_FAST])
    count, seen = added(count, seen, [Suspicion.UNREASONABLY_FAST])
    assert count == 3


def test_the_ai_hordes_name_bounds_and_the_operators_words() -> None:
    words = name_words(" Rude ,crude,, ")
    assert words == frozenset({"rude", "crude"})
    assert name_suspicions("polite", words) == []
    assert name_suspicions("x" * 100, words) == []
    assert name_suspicions("x" * 101, words) == [Suspicion.WORKER_NAME_LONG]
    assert name_suspicions("so-CRUDE" + "x" * 200, words) == [
        Suspicion.WORKER_NAME_LONG,
        Suspicion.WORKER_NAME_EXTREME,
        Suspicion.WORKER_PROFANITY,
    ]
    assert name_suspicions("rude", frozenset()) == []


def test_a_job_is_too_fast_past_the_bound_and_never_with_the_bound_off() -> None:
    assert too_fast(151, 1.0, 150)
    assert not too_fast(150, 1.0, 150)
    assert not too_fast(10_000, 0.001, 0)


def test_reset_suspicion_is_an_admins_field_of_a_worker_edit() -> None:
    edit = parse_worker_edit({"reset_suspicion": True})
    assert edit.reset_suspicion
    assert edit.admin_only
    with pytest.raises(HordeError) as raised:
        parse_worker_edit({"reset_suspicion": "yes"})
    assert raised.value.rc is RC.BadRequest
