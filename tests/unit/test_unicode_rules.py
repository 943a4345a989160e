"""The Unicode rules: worker name keys and text no worker can send."""

from __future__ import annotations

import math
import unicodedata
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hordelite.contract.unicode_rules import (
    MAX_NAME_KEY,
    fold_name,
    unsendable,
    user_name_refusal,
    worker_name_key,
)
from hordelite.errors import RC, HordeError
from hordelite.worker._reply import UnsendableJob, chat_completion_body, check_sendable

# Text no worker can send --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"stop_sequence": ["ok", "\ud800"]}, "stop_sequence[1]"),
        ([None, {"chat": {"messages": [{"content": "a\udfffb"}]}}], "[1].chat.messages[0].content"),
        ({"seed": math.inf}, "seed"),
        ({"temperature": math.nan}, "temperature"),
        ({"\udc80": 1}, "\\udc80"),  # a key, named printably
        ({"fine": ["ä", "😀", "\u0000", 1.5, 10**400]}, None),  # NUL and big ints encode
    ],
)
def test_unsendable_names_the_first_lone_surrogate_or_non_finite_number(
    value: Any, path: str | None
) -> None:
    assert unsendable(value) == path


def test_unsendable_walks_deep_nesting_without_recursing() -> None:
    value: Any = "\ud800"
    for _ in range(100_000):
        value = [value]
    assert unsendable(value) == "[0]" * 100_000


def test_a_backend_request_with_a_lone_surrogate_is_unsendable_and_names_the_field() -> None:
    payload = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_length": 16,
        "stop_sequence": ["\ud800"],
    }
    body = chat_completion_body(payload, "m", "llamacpp")
    with pytest.raises(UnsendableJob, match=r"^stop\[0\] cannot be sent"):
        check_sendable(body)
    check_sendable(chat_completion_body({**payload, "stop_sequence": ["END"]}, "m", "llamacpp"))


# Worker name keys -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "key"),
    [
        (["Alice", "ALICE", "alice", " Alice "], "alice"),
        (["\uff21\uff4c\uff49\uff43\uff45", "\U0001d400lice"], "alice"),  # full-width, math bold
        (["Al\u200dice", "Al\u200bice", "\ufeffAlice", "Ali\u00adce", "Alic\ufe0fe"], "alice"),
        (["Stra\u00dfe", "STRASSE"], "strasse"),
        (["\u00c1rbol", "A\u0301rbol"], "\u00e1rbol"),  # composed and decomposed
        (["\ufb01sh"], "fish"),  # the fi ligature
    ],
)
def test_names_that_differ_in_case_compatibility_or_invisible_characters_share_a_key(
    names: list[str], key: str
) -> None:
    assert {worker_name_key(name) for name in names} == {key}
    assert {fold_name(name) for name in names} == {key}


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a\u0000b", "control character (U+0000)"),
        ("line\nbreak", "control character (U+000A)"),
        ("del\u007f", "control character (U+007F)"),
        ("c1\u0085x", "control character (U+0085)"),
        ("lone\ud800", "lone surrogate (U+D800)"),
        ("\u200d\u2060", "visible character"),
        ("\ufdfa" * 20, "longer than 255"),  # one character, eighteen once normalised
    ],
)
def test_a_name_no_worker_can_have_is_400_naming_the_field(name: str, why: str) -> None:
    with pytest.raises(HordeError) as refused:
        worker_name_key(name, "worker.name")
    assert refused.value.rc is RC.BadRequest
    assert refused.value.extra["errors"].keys() == {"worker.name"}
    assert why in refused.value.message


def test_a_name_key_is_at_most_255_characters() -> None:
    assert len(worker_name_key("x" * MAX_NAME_KEY)) == MAX_NAME_KEY


@given(st.text(st.characters(max_codepoint=0x7F)))
def test_an_ascii_name_folds_as_the_full_rule_folds_it(name: str) -> None:
    # fold_name takes a shortcut for ASCII: it must agree with NFKC, case
    # folding and the removal of ignorables, which leave ASCII but its case.
    full = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())
    assert fold_name(name) == full.strip()


# User names (decision 0073) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("req\u200b2", "format or bidi control character (U+200B)"),
        ("\u202egnp.exe", "format or bidi control character (U+202E)"),
        ("\u2066root\u2069", "format or bidi control character (U+2066)"),
        ("ro\u00adot", "format or bidi control character (U+00AD)"),
        ("a\u2028b", "line separator (U+2028)"),
        ("a\u2029b", "paragraph separator (U+2029)"),
        ("a\u0007b", "control character (U+0007)"),
        ("a\ud800b", "lone surrogate (U+D800)"),
        ("\u3164", "visible character"),  # a Hangul filler: nothing left once folded
        ("\ufdfa" * 15, "once normalised"),  # 15 characters, 270 once NFKC'd
    ],
)
def test_a_user_name_with_a_control_format_or_separator_character_is_refused(
    name: str, why: str
) -> None:
    refusal = user_name_refusal(name)
    assert refusal is not None
    assert why in refusal


@pytest.mark.parametrize(
    "name",
    [
        "req2",
        "Zo\u00eb",
        "\uff52\uff45\uff51\uff12",
        "\u2764\ufe0f fan",
        "Jos\u00e9",
        "\u540d\u524d",
    ],
)
def test_a_user_name_of_visible_characters_is_accepted(name: str) -> None:
    assert user_name_refusal(name) is None
