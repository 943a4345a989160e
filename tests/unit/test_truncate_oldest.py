"""context_fit truncate_oldest: the same turns kept as flattening every
candidate would keep, in work linear in the conversation (admission runs it
for every request over the context, so a quadratic cut stalls the horde)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hordelite.contract import chat_request
from hordelite.contract.chat_request import estimate_tokens, flatten_messages, truncate_oldest


def reference_truncate_oldest(
    messages: list[dict[str, Any]],
    budget_tokens: int,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]] | None:
    """The rule as first written: flatten each candidate in turn (quadratic)."""
    turns: list[list[int]] = []
    for i, message in enumerate(messages):
        if message["role"] == "system":
            continue
        if message["role"] == "user" or not turns:
            turns.append([i])
        else:
            turns[-1].append(i)
    dropped: set[int] = set()
    for turn in turns[:-1]:
        kept = [m for i, m in enumerate(messages) if i not in dropped]
        if estimate_tokens(flatten_messages(kept, tools)) <= budget_tokens:
            return kept
        dropped.update(turn)
    kept = [m for i, m in enumerate(messages) if i not in dropped]
    if estimate_tokens(flatten_messages(kept, tools)) <= budget_tokens:
        return kept
    return None


TEXT = st.text(alphabet="ab c\n\u00e9\U0001f600", max_size=40)
CALL = st.builds(
    lambda name, args, n: {
        "id": f"call_{n}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    },
    st.sampled_from(["get_weather", "f"]),
    st.sampled_from(["{}", '{"city":"Paris"}']),
    st.integers(0, 99),
)
CONTENT = (
    TEXT | st.none() | st.lists(st.builds(lambda t: {"type": "text", "text": t}, TEXT), max_size=3)
)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    message: dict[str, Any] = {"role": role, "content": draw(CONTENT)}
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = draw(st.lists(CALL, min_size=1, max_size=2))
    if role == "tool":
        message["tool_call_id"] = "call_1"
    return message


TOOLS = st.none() | st.just(
    [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages(), max_size=14), st.integers(-1, 120), TOOLS)
def test_truncate_oldest_keeps_what_flattening_every_candidate_keeps(
    conversation: list[dict[str, Any]], budget: int, tools: list[dict[str, Any]] | None
) -> None:
    assert truncate_oldest(conversation, budget, tools) == reference_truncate_oldest(
        conversation, budget, tools
    )


def long_conversation(n: int) -> list[dict[str, Any]]:
    """A system message, then user and assistant turns: n messages in all."""
    conversation: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(n - 1):
        role = "user" if i % 2 == 0 else "assistant"
        conversation.append({"role": role, "content": f"message {i} " + "x" * 20})
    return conversation


@pytest.mark.parametrize("n", [1024, 4096])
def test_truncating_a_long_conversation_reads_each_message_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    # Work is counted as reads of a message's text: flattening every
    # candidate again (quadratic) reads about n * n / 4 of them here.
    reads = 0
    message_text = chat_request._message_text

    def counted(message: Mapping[str, Any]) -> str:
        nonlocal reads
        reads += 1
        return message_text(message)

    monkeypatch.setattr(chat_request, "_message_text", counted)
    conversation = long_conversation(n)
    # Room for the system message and the last few turns only: nearly every
    # turn is dropped, one at a time.
    kept = truncate_oldest(conversation, 60)
    assert kept is not None
    assert kept[0]["role"] == "system"
    assert 2 < len(kept) < 12
    assert reads <= 2 * n
