"""The body gate (contract.json_body): strict UTF-8, no surrogate halves, no
NUL, finite numbers, bounded nesting, each refusal naming its field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hordelite.contract.json_body import check_text, decode_json_body
from hordelite.contract.limits import MAX_JSON_DEPTH
from hordelite.errors import HordeError


def refused_field(raw: bytes) -> str:
    with pytest.raises(HordeError) as caught:
        decode_json_body(raw)
    assert caught.value.rc.name == "BadRequest"
    [field] = caught.value.extra["errors"]
    assert caught.value.message.startswith(f"{field}: ")
    return str(field)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        pytest.param(rb'{"prompt": "a\ud800"}', "prompt", id="high-half"),
        pytest.param(rb'{"prompt": "\udfff b"}', "prompt", id="low-half"),
        pytest.param(rb'{"prompt": "\ude00\ud83d"}', "prompt", id="halves-reversed"),
        pytest.param(rb'{"stop": ["ok", "\uD800"]}', "stop.1", id="upper-case-escape"),
        pytest.param(
            rb'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}',
            "messages.0.content.0.text",
            id="deep-field",
        ),
        pytest.param(rb'{"prompt": "a\u0000b"}', "prompt", id="nul"),
        pytest.param(rb'{"params": {"a\u0000": 1}}', "params", id="nul-in-key"),
        pytest.param(rb'{"\ud800": 1}', "body", id="surrogate-top-key"),
        pytest.param(rb'"\ud800"', "body", id="top-level-string"),
    ],
)
def test_a_string_with_a_surrogate_half_or_nul_is_refused_naming_its_path(
    raw: bytes, field: str
) -> None:
    assert refused_field(raw) == field


def test_raw_surrogate_bytes_are_refused_as_invalid_utf8() -> None:
    # json.loads(bytes) would decode these with surrogatepass and let them in.
    field = refused_field(b'{"prompt": "a\xed\xa0\x80"}')
    assert field == "body"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        pytest.param(b'{"seed": Infinity}', "seed", id="infinity"),
        pytest.param(b'{"seed": -Infinity}', "seed", id="minus-infinity"),
        pytest.param(b'{"params": {"top_p": NaN}}', "params.top_p", id="nan"),
        pytest.param(b'{"seed": 1e400}', "seed", id="overflow"),
        pytest.param(b'{"a": [0, -1e400]}', "a.1", id="negative-overflow-in-array"),
    ],
)
def test_a_non_finite_number_is_refused_naming_its_path(raw: bytes, field: str) -> None:
    assert refused_field(raw) == field


def test_an_integer_with_more_digits_than_python_parses_is_refused() -> None:
    assert refused_field(b'{"seed": ' + b"9" * 5000 + b"}") == "body"


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_nesting_up_to_the_limit_is_accepted_and_one_more_is_refused() -> None:
    assert decode_json_body(nested(MAX_JSON_DEPTH)) is not None
    # The field named is the container one level too deep.
    assert refused_field(nested(MAX_JSON_DEPTH + 1)) == ".".join(["0"] * MAX_JSON_DEPTH)


def test_deep_nesting_inside_a_field_names_the_field() -> None:
    raw = b'{"response_format": ' + nested(MAX_JSON_DEPTH) + b"}"
    assert refused_field(raw).startswith("response_format")


@pytest.mark.parametrize("depth", [1_000, 100_000, 5_000_000])
def test_nesting_far_past_the_parsers_recursion_is_a_400_not_a_recursion_error(
    depth: int,
) -> None:
    assert refused_field(nested(depth)) == "body"
    assert refused_field(b'{"a": ' * depth + b"1" + b"}" * depth) == "body"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(rb'{"p": "\ud83d\ude00"}', {"p": "\U0001f600"}, id="escaped-pair"),
        pytest.param('{"p": "😀 ü"}'.encode(), {"p": "😀 ü"}, id="raw-utf8"),
        pytest.param(rb'{"p": "\\ud800"}', {"p": "\\ud800"}, id="escaped-backslash"),
        pytest.param(rb'{"p": "\\u0000"}', {"p": "\\u0000"}, id="escaped-backslash-nul"),
        pytest.param(b'{"n": -0.0, "m": 1e308}', {"n": -0.0, "m": 1e308}, id="extreme-finite"),
    ],
)
def test_valid_documents_pass_unchanged(raw: bytes, expected: Any) -> None:
    assert decode_json_body(raw) == expected


# Any document of valid text and finite numbers within the depth passes unchanged.
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
DOCUMENTS = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


@given(DOCUMENTS, st.booleans())
def test_any_valid_document_round_trips(document: Any, ascii_only: bool) -> None:
    raw = json.dumps(document, ensure_ascii=ascii_only).encode()
    assert decode_json_body(raw) == document


@given(DOCUMENTS, st.sampled_from(["\ud800", "\udbff", "\udc00", "\x00"]))
def test_any_document_with_a_bad_character_is_refused(document: Any, bad: str) -> None:
    raw = json.dumps({"valid": document, "bad": ["x", f"a{bad}b"]}).encode()
    assert refused_field(raw) == "bad.1"


def test_text_outside_a_body_follows_the_same_rule() -> None:
    check_text("name", "scribe ü")
    with pytest.raises(HordeError) as caught:
        check_text("name", "a\x00")
    assert caught.value.extra["errors"] == {"name": caught.value.extra["errors"]["name"]}
