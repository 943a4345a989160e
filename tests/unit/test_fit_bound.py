"""The worker's cheap fit bound (``TemplateBound``): measured once with an
exact counter, it is never below the exact count of a conversation it
answers for, whatever the text.

The exact counters here are pure models of a backend: a chat template
rendering a conversation, then a tokenizer counting the rendering. The fake
backend's own template and tokenizer (:func:`render_prompt`,
:func:`count_tokens`) are one; the others stand for the tokenizers the bound
argues about (a token a byte, a token a character, a prefix token added) and
for templates with more markup than the fake's, one injecting a default
system prompt when the conversation has none.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hordelite.testing import FakeBackendConfig, open_fake_backend
from hordelite.worker._backend import (
    Backend,
    LlamaCppCounter,
    TemplateBound,
    byte_bound,
    measure_bound,
)
from hordelite.worker.fake_backend import count_tokens, message_text, render_prompt

Template = Callable[[Sequence[Mapping[str, Any]]], str]
Tokenizer = Callable[[str], int]


def chatml(messages: Sequence[Mapping[str, Any]]) -> str:
    """ChatML, with a default system prompt when the conversation has none."""
    head = (
        ""
        if messages and messages[0]["role"] == "system"
        else (
            "<|im_start|>system\nYou are a helpful assistant built to answer briefly.<|im_end|>\n"
        )
    )
    turns = "".join(
        f"<|im_start|>{m['role']}\n{message_text(m['content'])}<|im_end|>\n" for m in messages
    )
    return head + turns + "<|im_start|>assistant\n"


def llama3(messages: Sequence[Mapping[str, Any]]) -> str:
    turns = "".join(
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n"
        f"{message_text(m['content']).strip()}<|eot_id|>"
        for m in messages
    )
    return "<|begin_of_text|>" + turns + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def verbose(messages: Sequence[Mapping[str, Any]]) -> str:
    """Markup far longer than a message's JSON: a positive cost a message."""
    frame = "=" * 120
    return "".join(
        f"{frame}[{m['role'].upper()}]\n{message_text(m['content'])}\n" for m in messages
    )


def fake(messages: Sequence[Mapping[str, Any]]) -> str:
    return render_prompt(list(messages))


def a_token_a_byte(text: str) -> int:
    return len(text.encode())


def a_token_a_character(text: str) -> int:
    return len(text)


def a_prefix_token_then_a_byte(text: str) -> int:
    """SentencePiece's worst case: the leading space, then byte fallback."""
    return 1 + len(text.encode())


def four_bytes_a_token(text: str) -> int:
    return count_tokens(text)


class ModelCounter:
    """An exact counter: the template's rendering, tokenized."""

    name = "a model backend"

    def __init__(self, template: Template, tokenizer: Tokenizer) -> None:
        self.template = template
        self.tokenizer = tokenizer
        self.calls = 0

    def exact(self, body: Mapping[str, Any]) -> int:
        return self.tokenizer(self.template(body["messages"]))

    async def count(self, body: Mapping[str, Any]) -> int:
        self.calls += 1
        return self.exact(body)


BACKENDS = {
    "fake template, fake tokenizer": (fake, four_bytes_a_token),
    "fake template, a token a byte": (fake, a_token_a_byte),
    "chatml, a token a byte": (chatml, a_token_a_byte),
    "chatml, a token a character": (chatml, a_token_a_character),
    "llama3, prefix token and byte fallback": (llama3, a_prefix_token_then_a_byte),
    "verbose markup, a token a byte": (verbose, a_token_a_byte),
}


def measured(counter: ModelCounter) -> TemplateBound:
    bound = anyio.run(measure_bound, counter)
    assert bound is not None
    return bound


MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant"]),
        # Any text: multibyte, emoji, quotes and control characters (escaped in JSON).
        "content": st.text(max_size=200)
        | st.lists(
            st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=60)), max_size=3
        ),
    }
)
CONVERSATION = st.tuples(
    st.none() | st.text(max_size=100).map(lambda t: {"role": "system", "content": t}),
    st.lists(MESSAGE, min_size=1, max_size=12),
).map(lambda parts: [*([parts[0]] if parts[0] else []), *parts[1]])


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_measured_bound_is_never_below_the_exact_count(backend: str) -> None:
    counter = ModelCounter(*BACKENDS[backend])
    bound = measured(counter)

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(CONVERSATION)
    def holds(messages: list[dict[str, Any]]) -> None:
        body = {"model": "m", "messages": messages, "max_tokens": 16}
        tokens = bound.tokens(body)
        assert tokens is not None
        assert tokens >= counter.exact(body)

    holds()


def test_the_bound_of_a_verbose_template_counts_its_markup_a_message() -> None:
    counter = ModelCounter(verbose, a_token_a_byte)
    bound = measured(counter)
    # 120 bytes of frame a message, against about 35 bytes of JSON framing.
    assert bound.per_message > 80


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "call f"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
            ]
        },
        {"messages": [{"role": "tool", "tool_call_id": "c", "content": "12:00"}]},
        {"messages": [{"role": "user", "content": "hi", "reasoning_content": "hmm"}]},
        {"messages": []},
    ],
    ids=["tools", "image", "tool calls", "tool message", "unmeasured key", "empty"],
)
def test_the_bound_answers_none_for_what_the_probes_cannot_measure(body: dict[str, Any]) -> None:
    assert TemplateBound(10, 2).tokens(body) is None


def test_the_bound_is_the_json_bytes_plus_the_overheads() -> None:
    messages = [{"role": "user", "content": "日本"}, {"role": "assistant", "content": "ok"}]
    body = {"messages": messages, "max_tokens": 16}
    expected = len(json.dumps(messages, ensure_ascii=False).encode()) + 10 + 2 * 3
    assert byte_bound(body) + 10 + 2 * 3 == expected
    assert TemplateBound(10, 3).tokens(body) == expected


def test_a_bound_that_falls_short_of_its_check_is_not_used() -> None:
    # A token for every half byte of the text: no byte-length bound holds.
    counter = ModelCounter(fake, lambda text: 2 * len(text.encode()))
    assert anyio.run(measure_bound, counter) is None


@pytest.mark.anyio
async def test_the_bound_measured_on_the_fake_backend_covers_its_prompt_tokens() -> None:
    async with open_fake_backend(FakeBackendConfig(template_overhead=40)) as fake_backend:
        backend = Backend(fake_backend.url, 10)
        try:
            bound = await measure_bound(LlamaCppCounter(backend))
        finally:
            await backend.aclose()
        assert bound is not None
        # The fixed part holds the template's 40 tokens.
        assert bound.fixed >= 40
        for text in ("", "hi", "ünïcödé 日本語 🙂" * 50):
            messages = [{"role": "system", "content": "s"}, {"role": "user", "content": text}]
            tokens = bound.tokens({"messages": messages})
            assert tokens is not None
            assert tokens >= fake_backend.prompt_tokens(messages)
