"""The Unicode rules: worker name keys and text no worker can send."""

from __future__ import annotations

import math
from typing import Any

import pytest

from hordelite.unicode_rules import unsendable
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
