"""Kudos arithmetic (the AI Horde text formula) and the model reference.

Expected values are worked out by hand from the formula:
tokens = min(max_length, max(20, ceil(chars / 4))),
reward = round(tokens x billions / 21, 2), cost = reward + 1 per job,
and a waiting request gains 50 priority every 10 seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hordelite.contract.kudos import (
    Settlement,
    billed_tokens,
    job_cost,
    job_reward,
    priority_key,
    request_quote,
    unread,
)
from hordelite.contract.models import DEFAULT_REFERENCE, ModelReference
from hordelite.errors import ConfigError

# billed_tokens -------------------------------------------------------------


@pytest.mark.parametrize("chars", [0, 1, 40, 79, 80])
def test_a_short_generation_is_billed_the_20_token_floor(chars: int) -> None:
    assert billed_tokens(chars, max_length=512) == 20


@pytest.mark.parametrize(
    ("chars", "tokens"),
    [(81, 21), (83, 21), (84, 21), (85, 22), (88, 22), (89, 23), (400, 100), (401, 101)],
)
def test_tokens_are_characters_divided_by_4_rounded_up(chars: int, tokens: int) -> None:
    assert billed_tokens(chars, max_length=512) == tokens


@pytest.mark.parametrize(("chars", "max_length"), [(401, 100), (10_000, 100), (404, 100)])
def test_tokens_are_capped_at_max_length(chars: int, max_length: int) -> None:
    assert billed_tokens(chars, max_length) == max_length


def test_exactly_max_length_worth_of_characters_is_billed_max_length() -> None:
    assert billed_tokens(400, max_length=100) == 100


def test_the_cap_wins_over_the_floor_when_max_length_is_below_20() -> None:
    # min(16, max(20, 0)) = 16: a job never costs more tokens than it may produce.
    assert billed_tokens(0, max_length=16) == 16


# job_reward, job_cost, request_quote ----------------------------------------


@pytest.mark.parametrize(
    ("tokens", "billions", "reward"),
    [
        (21, 1.0, 1.0),  # 21 x 1 / 21
        (42, 8.0, 16.0),  # 336 / 21
        (100, 7.0, 33.33),  # 700 / 21 = 33.333...
        (20, 1.0, 0.95),  # 20 / 21 = 0.952...
        (80, 70.0, 266.67),  # 5600 / 21 = 266.666...
    ],
)
def test_a_job_reward_is_tokens_times_billions_over_21_rounded_to_cents(
    tokens: int, billions: float, reward: float
) -> None:
    assert job_reward(tokens, billions) == reward


@pytest.mark.parametrize(
    ("reward", "cost"), [(0.0, 1.0), (16.0, 17.0), (33.33, 34.33), (0.95, 1.95)]
)
def test_a_job_costs_its_reward_plus_1(reward: float, cost: float) -> None:
    assert job_cost(reward) == pytest.approx(cost, abs=1e-9)


def test_a_quote_prices_every_job_at_full_max_length() -> None:
    # 210 tokens on a 1 B model: reward 10, cost 11, for 2 jobs 22.
    assert request_quote(210, 2, 1.0) == pytest.approx(22.0, abs=1e-9)


def test_a_quote_rounds_each_job_before_multiplying_by_n() -> None:
    # 100 x 7 / 21 = 33.33 (rounded), + 1 = 34.33 a job, 3 jobs = 102.99.
    assert request_quote(100, 3, 7.0) == pytest.approx(102.99, abs=1e-9)


# priority_key ----------------------------------------------------------------

NOW = 1_700_000_000.0


def test_a_request_waiting_10_s_longer_gains_exactly_50() -> None:
    older = priority_key(100.0, created=NOW)
    newer = priority_key(100.0, created=NOW + 10)
    assert older - newer == 50.0


def test_aging_is_linear_at_5_a_second() -> None:
    older = priority_key(100.0, created=NOW)
    newer = priority_key(100.0, created=NOW + 1)
    assert older - newer == 5.0


def test_with_equal_kudos_the_older_request_ranks_first() -> None:
    assert priority_key(0.0, created=NOW) > priority_key(0.0, created=NOW + 0.5)


def test_a_richer_newer_request_outranks_until_age_makes_up_the_kudos_difference() -> None:
    # 200 kudos more is worth 200 / 50 x 10 = 40 seconds of waiting.
    poorer_older = priority_key(100.0, created=NOW)

    def richer(after: float) -> float:
        return priority_key(300.0, created=NOW + after)

    assert richer(after=1) > poorer_older
    assert richer(after=39) > poorer_older
    assert richer(after=40) == poorer_older
    assert richer(after=41) < poorer_older


# ModelReference ------------------------------------------------------------

LLAMA_8B = 8_030_261_248


def reference() -> ModelReference:
    return ModelReference.from_json(
        {"Llama-3.1-8B-Instruct": {"parameters": LLAMA_8B}, "tiny": {"parameters": 500_000_000}}
    )


def test_an_exact_name_gives_its_size_in_billions() -> None:
    assert reference().billions("Llama-3.1-8B-Instruct") == pytest.approx(LLAMA_8B / 1e9)


@pytest.mark.parametrize("name", ["llama-3.1-8b-instruct", "LLAMA-3.1-8B-INSTRUCT"])
def test_a_name_matches_case_insensitively(name: str) -> None:
    assert reference().billions(name) == pytest.approx(LLAMA_8B / 1e9)


@pytest.mark.parametrize(
    "name",
    [
        "koboldcpp/Llama-3.1-8B-Instruct",
        "koboldcpp/llama-3.1-8b-instruct",
        "aphrodite/org/Llama-3.1-8B-Instruct",
    ],
)
def test_a_backend_prefixed_name_matches_by_the_part_after_its_last_slash(name: str) -> None:
    assert reference().billions(name) == pytest.approx(LLAMA_8B / 1e9)


@pytest.mark.parametrize(
    "name", ["Llama-3.1-8B-Instruct::alice#3", "koboldcpp/Llama-3.1-8B-Instruct::bob#12"]
)
def test_a_user_suffix_after_a_double_colon_is_ignored(name: str) -> None:
    assert reference().billions(name) == pytest.approx(LLAMA_8B / 1e9)


def test_a_model_below_a_billion_keeps_its_fraction() -> None:
    assert reference().billions("tiny") == pytest.approx(0.5)


@pytest.mark.parametrize("name", ["mystery-model", "koboldcpp/mystery", "", "Llama-3.1-8B"])
def test_an_unknown_model_is_priced_as_1_billion(name: str) -> None:
    assert reference().billions(name) == 1.0


@pytest.mark.parametrize(
    "data",
    [
        [],
        "models",
        {"m": 7},
        {"m": {}},
        {"m": {"parameters": "7B"}},
        {"m": {"parameters": 0}},
        {"m": {"parameters": -5}},
        {"m": {"parameters": True}},
    ],
    ids=[
        "array",
        "string",
        "bare-number",
        "no-parameters",
        "string-size",
        "zero",
        "negative",
        "boolean",
    ],
)
def test_a_malformed_reference_is_a_ConfigError(data: Any) -> None:
    with pytest.raises(ConfigError):
        ModelReference.from_json(data)


def test_a_malformed_entry_error_names_the_model() -> None:
    with pytest.raises(ConfigError, match=r"broken-model\.parameters"):
        ModelReference.from_json({"good": {"parameters": 1e9}, "broken-model": {"size": 7}})


def test_a_reference_file_that_is_not_json_is_a_ConfigError_naming_the_key(tmp_path: Path) -> None:
    file = tmp_path / "models.json"
    file.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"horde\.model_reference"):
        ModelReference.load(file)


def test_a_missing_reference_file_is_a_ConfigError_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"horde\.model_reference"):
        ModelReference.load(tmp_path / "absent.json")


def test_a_reference_file_is_loaded_from_its_path(tmp_path: Path) -> None:
    file = tmp_path / "models.json"
    file.write_text(json.dumps({"my-13b": {"parameters": 13_000_000_000}}), encoding="utf-8")
    assert ModelReference.load(file).billions("koboldcpp/my-13b") == pytest.approx(13.0)


def test_the_shipped_reference_loads_and_prices_every_model_it_lists() -> None:
    shipped = json.loads(DEFAULT_REFERENCE.read_text(encoding="utf-8"))
    loaded = ModelReference.load()
    assert shipped
    for name, entry in shipped.items():
        assert loaded.billions(name) == pytest.approx(entry["parameters"] / 1e9), name


def test_a_reply_nobody_can_read_charges_nothing_and_pays_a_worker_not_the_requesters() -> None:
    paid = Settlement(tokens=40, reward=2.5, cost=3.5, seconds=1.0)
    assert unread(paid, own_worker=False) == Settlement(40, 2.5, 0.0, 1.0)
    assert unread(paid, own_worker=True) == Settlement(40, 0.0, 0.0, 1.0)
