"""The X-Horde-Options header: the ``horde`` object of a client that cannot
add a body field (hordelite.contract.horde_header)."""

from __future__ import annotations

import json

import pytest

from hordelite.contract.chat_request import parse_chat_request
from hordelite.contract.horde_header import header_options, with_options
from hordelite.contract.limits import MAX_HORDE_OPTIONS_HEADER_CHARS
from hordelite.errors import RC, HordeError

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_no_header_leaves_the_body_as_it_is() -> None:
    assert header_options(None) == {}
    assert with_options(BODY, {}) is BODY


def test_the_header_sets_the_horde_options_of_a_body_without_them() -> None:
    options = header_options('{"conformance": "best_effort", "max_kudos": 50}')
    req = parse_chat_request(with_options(BODY, options))
    assert req.horde.conformance == "best_effort"
    assert req.horde.max_kudos == 50


def test_a_key_the_body_sets_wins_over_the_header() -> None:
    body = {**BODY, "horde": {"availability_mode": "fail_fast"}}
    options = header_options('{"availability_mode": "wait", "max_kudos": 7}')
    req = parse_chat_request(with_options(body, options))
    assert req.horde.availability_mode == "fail_fast"
    assert req.horde.max_kudos == 7


def test_an_unknown_key_in_the_header_is_refused_by_its_horde_name() -> None:
    with pytest.raises(HordeError) as caught:
        parse_chat_request(with_options(BODY, header_options('{"colour": "blue"}')))
    assert caught.value.extra.get("param") == "horde.colour"


@pytest.mark.parametrize(
    "header",
    ["not json", "[1, 2]", '"best_effort"', "{", "x" * (MAX_HORDE_OPTIONS_HEADER_CHARS + 1)],
)
def test_a_header_that_is_not_a_short_json_object_is_refused_naming_it(header: str) -> None:
    with pytest.raises(HordeError) as caught:
        header_options(header)
    assert caught.value.rc is RC.BadRequest
    assert "X-Horde-Options" in caught.value.extra["errors"]


def test_a_body_or_horde_value_of_the_wrong_type_is_left_for_its_own_check() -> None:
    assert with_options([1], {"max_kudos": 1}) == [1]
    body = {**BODY, "horde": "fast"}
    assert with_options(body, {"max_kudos": 1}) is body
    assert json.dumps(with_options(BODY, {"max_kudos": 1})["horde"]) == '{"max_kudos": 1}'
