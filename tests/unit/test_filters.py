"""The prompt filters' pure rules (hordelite/contract/filters.py): what a
text becomes before rules see it, which rules RE2 refuses when written, and
what a screen decides; hostile inputs throughout."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hordelite.contract.filters import (
    FilterEdit,
    FilterSet,
    FilterSpec,
    Rule,
    _normalised,
    chat_texts,
    combined_regex,
    compile_regex,
    normalise,
    parse_filter,
    parse_filter_edit,
    parse_filter_type,
    with_chat_texts,
)
from hordelite.contract.limits import MAX_FILTER_REGEX_CHARS
from hordelite.errors import RC, HordeError


def rule(rule_id: int, regex: str, action: str = "refuse", **kw: object) -> Rule:
    return Rule(
        rule_id,
        int(kw.get("filter_type", 10)),  # type: ignore[call-overload]
        action,
        str(kw.get("replacement", "")),
        compile_regex(regex),
    )


# Normalisation -------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "seen"),
    [
        ("Hello World", "hello world"),
        ("\uff26\uff35\uff2c\uff2c \uff57\uff49\uff44\uff54\uff48", "full width"),  # NFKC
        ("s\u200be\u200dx\u2060y\ufeff", "sexy"),  # zero-width and format characters
        ("so\u00adft", "soft"),  # a soft hyphen
        ("Crème brûlée NAÏVE", "creme brulee naive"),  # accents
        ("e\u0301\u0301\u0301", "e"),  # stacked combining marks
        ("STRASSE Straße", "strasse strasse"),  # case folding
        ("a (word:1.2) and (other:0.5)", "a word and other"),  # prompt weights
        ("I am s e x y", "i am sexy"),  # spacing tricks
        ("s e x at the start", "sex at the start"),
        ("s.e.x or s-e-x or s_e_x", "sex or sex or sex"),  # punctuation as spacing
        ("line\n\n\tbreaks   and\u00a0spaces", "line breaks and spaces"),
        ("a b", "a b"),  # two single characters are words, not a trick
        ("x\x00y\x1fz", "xyz"),  # control characters as spacing
        ("\u202eevil\u202c", "evil"),  # bidi overrides
    ],
)
def test_normalise_undoes_the_tricks_that_hide_a_word(sent: str, seen: str) -> None:
    assert normalise(sent) == seen


@given(st.text(max_size=200))
def test_normalise_is_idempotent_and_leaves_no_format_characters(text: str) -> None:
    once = normalise(text)
    assert normalise(once) == once
    assert "\u200b" not in once
    assert "  " not in once
    assert once == once.strip()


def test_normalise_of_hostile_prompts_is_linear() -> None:
    # Inputs that would make a backtracking weight or spacing pattern
    # quadratic: they must still come back (RE2 and a token walk).
    for hostile in ["(" * 100_000, "(a:" * 30_000, "a " * 50_000, "\u0301" * 100_000]:
        assert isinstance(normalise(hostile), str)


# Writing rules --------------------------------------------------------------


@pytest.mark.parametrize(
    ("regex", "why"),
    [
        (r"(a)\1", "RE2 cannot compile"),  # a backreference
        ("(?=a)b", "RE2 cannot compile"),  # lookahead
        ("(?<!a)b", "RE2 cannot compile"),  # lookbehind
        ("a++", "RE2 cannot compile"),  # possessive
        ("(", "RE2 cannot compile"),
        ("a*", "matches every text"),
        ("|x", "matches every text"),
        ("", "non-empty"),
        ("a" * (MAX_FILTER_REGEX_CHARS + 1), "at most"),
    ],
)
def test_a_rule_re2_cannot_run_boundedly_is_refused_naming_regex(regex: str, why: str) -> None:
    with pytest.raises(HordeError) as refused:
        compile_regex(regex)
    assert refused.value.rc is RC.BadRequest
    assert refused.value.extra["errors"].keys() == {"regex"}
    assert why in refused.value.message


def test_a_catastrophic_rule_compiles_and_runs_in_linear_time() -> None:
    # (a+)+$ explodes in a backtracking engine on "aaa...b"; RE2 answers.
    found = FilterSet([rule(1, "(a+)+$"), rule(2, "(a|aa)+b")])
    verdict = found.screen(["a" * 100_000 + "!"])
    assert verdict.refused == (1,)


def test_parse_filter_takes_the_ai_hordes_fields_and_the_action() -> None:
    spec = parse_filter({"regex": "ac.*", "filter_type": 20, "description": "d"})
    assert spec == FilterSpec("ac.*", 20, "d", "", "refuse")
    spec = parse_filter({"regex": "x", "filter_type": 10, "replacement": "y", "action": "replace"})
    assert spec.action == "replace"
    assert spec.replacement == "y"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"filter_type": 10}, "regex"),
        ({"regex": 5, "filter_type": 10}, "regex"),
        ({"regex": "x"}, "filter_type"),
        ({"regex": "x", "filter_type": 9}, "filter_type"),
        ({"regex": "x", "filter_type": 30}, "filter_type"),
        ({"regex": "x", "filter_type": True}, "filter_type"),
        ({"regex": "x", "filter_type": "10"}, "filter_type"),
        ({"regex": "x", "filter_type": 10, "action": "ban"}, "action"),
        ({"regex": "x", "filter_type": 10, "description": 1}, "description"),
        ({"regex": "x", "filter_type": 10, "replacement": "r" * 1001}, "replacement"),
        ([], "body"),
    ],
)
def test_parse_filter_refuses_a_bad_field_by_name(body: object, field: str) -> None:
    with pytest.raises(HordeError) as refused:
        parse_filter(body)
    assert refused.value.extra["errors"].keys() == {field}


def test_an_edit_changes_only_what_it_names_and_must_name_something() -> None:
    spec = FilterSpec("a", 10, "d", "", "refuse")
    edit = parse_filter_edit({"action": "flag", "description": None})
    assert edit == FilterEdit(action="flag")
    assert edit.applied(spec) == FilterSpec("a", 10, "d", "", "flag")
    with pytest.raises(HordeError) as refused:
        parse_filter_edit({"description": None})
    assert refused.value.rc is RC.NoFilterModSelected
    with pytest.raises(HordeError):
        parse_filter_edit({"regex": r"(x)\1"})


def test_a_query_filter_type_is_read_from_its_text() -> None:
    assert parse_filter_type(None) is None
    assert parse_filter_type("") is None
    assert parse_filter_type("11") == 11
    with pytest.raises(HordeError):
        parse_filter_type("abc")


# Screening ------------------------------------------------------------------


def test_a_screen_sorts_matches_by_action_and_matches_the_normalised_text() -> None:
    found = FilterSet(
        [
            rule(3, "dragon", "flag"),
            rule(1, "sex"),
            rule(2, "kitten", "replace", replacement="cat"),
            rule(4, "never"),
        ]
    )
    verdict = found.screen(["A dragon!", "s.e.x", "My Kitten, here."])
    assert (verdict.refused, verdict.flagged, verdict.replaced) == ((1,), (3,), (2,))
    assert verdict.texts == ("A dragon!", "s.e.x", "My cat, here.")
    assert verdict.matched == (1, 2, 3)


def test_a_screen_with_no_rules_or_no_match_changes_nothing() -> None:
    assert FilterSet([]).screen(["x"]).texts == ("x",)
    verdict = FilterSet([rule(1, "zebra")]).screen(["Hello, world."])
    assert verdict.matched == ()
    assert verdict.texts == ("Hello, world.",)


def test_a_replacement_is_literal_and_a_hidden_match_is_replaced_in_the_normalised_text() -> None:
    found = FilterSet([rule(1, "(k)itten", "replace", replacement=r"\1 $0 \g<0>")])
    assert found.screen(["a kitten"]).texts == (r"a \1 $0 \g<0>",)
    # Hidden by spacing: the text as sent has no match to replace, so the
    # normalised text is sent, replaced, as the AI Horde does.
    assert found.screen(["the k.i.t.t.e.n!"]).texts == (r"the \1 $0 \g<0>",)


def test_suspicion_counts_the_ai_hordes_groups_and_shows_the_matches() -> None:
    found = FilterSet(
        [rule(1, "alpha"), rule(2, "al", filter_type=11), rule(3, "beta", filter_type=20)]
    )
    assert found.suspicion("ALPHA and b e t a") == (2, ["alpha", "al", "beta"])
    assert found.suspicion("alpha", filter_type=11) == (1, ["al"])
    assert found.suspicion("nothing") == (0, [])


def test_combined_regex_joins_a_types_rules() -> None:
    assert combined_regex(["a", "b|c"]) == "a|b|c"


def test_every_text_of_every_message_is_screened_and_replaced_in_place() -> None:
    messages = [
        {"role": "system", "content": "be kind"},
        {"role": "user", "content": [{"type": "text", "text": "a kitten"}, {"type": "image_url"}]},
        {"role": "assistant", "tool_calls": [{"id": "1"}]},
        {"role": "user", "content": "kitten?"},
    ]
    places = chat_texts(messages)
    assert places == [(0, None, "be kind"), (1, 0, "a kitten"), (3, None, "kitten?")]
    verdict = FilterSet([rule(1, "kitten", "replace", replacement="cat")]).screen(
        [t for *_, t in places]
    )
    out = with_chat_texts(messages, places, verdict.texts)
    assert out[1]["content"] == [{"type": "text", "text": "a cat"}, {"type": "image_url"}]
    assert out[3]["content"] == "cat?"
    assert messages[1]["content"][0]["text"] == "a kitten"  # the request as parsed is kept


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=200))
def test_the_ascii_way_of_normalise_agrees_with_every_step(text: str) -> None:
    assert normalise(text) == _normalised(text)
