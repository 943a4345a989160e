"""The legacy completions body as a native text request (decision 0057):
defaults, refusals by key, and the context a completion is routed with."""

from __future__ import annotations

from typing import Any

import pytest

from hordelite.contract.completion_request import (
    DEFAULT_MAX_TOKENS,
    CompletionRequest,
    completion_context,
    parse_completion_request,
    prompt_fits,
    with_context,
)
from hordelite.errors import HordeError


def parse(**fields: Any) -> CompletionRequest:
    return parse_completion_request({"model": "m1", "prompt": "Hi", **fields})


def test_openais_defaults_are_sent_where_the_client_left_them_out() -> None:
    req = parse()
    assert req.text.max_length == DEFAULT_MAX_TOKENS == 16
    params = req.text.params
    assert (params["temperature"], params["top_p"]) == (1.0, 1.0)
    assert (params["rep_pen"], params["top_k"], params["min_p"]) == (1.0, 0, 0.0)
    assert "stop_sequence" not in params
    assert (req.stream, req.echo, req.fail_fast) == (False, False, False)


def test_a_budget_below_the_native_minimum_is_kept_as_asked() -> None:
    # The native route's max_length starts at 16; a completion may ask for 1.
    assert parse(max_tokens=1).text.params["max_length"] == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"temperature": 2.5}, "temperature"),
        ({"horde": {"top_k": 500}}, "horde.top_k"),
        ({"horde": {"max_context_length": 8}}, "horde.max_context_length"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_a_value_out_of_bounds_is_refused_naming_its_key(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(HordeError) as caught:
        parse(**fields)
    assert caught.value.extra.get("param") == param


def test_the_smallest_context_that_certainly_holds_the_prompt_is_chosen() -> None:
    req = parse(prompt="x" * 3000, max_tokens=100)
    need = prompt_fits(req.text.prompt, 100)
    assert need == 3102
    context = completion_context(req, [2048, 4096, 8192, 4096])
    assert (context.length, context.may_trim) == (4096, False)
    text = with_context(req, context)
    assert text.max_context_length == text.params["max_context_length"] == 4096


def test_with_no_context_big_enough_the_largest_is_chosen_and_said_to_trim() -> None:
    req = parse(prompt="x" * 10_000, max_tokens=100)
    context = completion_context(req, [2048, 4096])
    assert (context.length, context.may_trim) == (4096, True)


def test_the_horde_objects_context_is_kept_and_checked_against_the_prompt() -> None:
    req = parse(prompt="x" * 3000, horde={"max_context_length": 2048})
    assert completion_context(req, [8192]).length == 2048
    assert completion_context(req, [8192]).may_trim is True
    assert completion_context(parse(horde={"max_context_length": 2048}), []).may_trim is False


def test_with_no_worker_online_the_context_certainly_holds_the_prompt() -> None:
    req = parse(prompt="x" * 5000, max_tokens=16)
    context = completion_context(req, [])
    assert (context.length, context.may_trim) == (5018, False)
