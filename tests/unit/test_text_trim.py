"""Trimming a text prompt from its start (hordelite/worker/_trim.py)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from hordelite.worker._backend import Backend, BackendError
from hordelite.worker._trim import (
    TEXT_MARGIN,
    LlamaCppTokenizer,
    PromptTrimmer,
    VllmTokenizer,
    keep_end,
    prompt_trimmer,
)

pytestmark = pytest.mark.anyio

BOS = 1


class CharTokenizer:
    """One token a character (its code point), after a BOS with ``special``."""

    name = "characters"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def tokenize(self, text: str, *, special: bool) -> list[int]:
        self.calls.append(text)
        return ([BOS] if special else []) + [ord(c) for c in text]


@pytest.mark.parametrize(
    ("size", "kept"),
    [(0, ""), (1, "d"), (2, "d"), (3, "éd"), (4, "céd"), (6, "abcéd"), (99, "abcéd")],
)
def test_keep_end_keeps_whole_characters_within_the_bytes(size: int, kept: str) -> None:
    assert keep_end("abcéd", size) == kept


async def test_a_prompt_whose_bytes_fit_is_sent_uncounted() -> None:
    tokenizer = CharTokenizer()
    trimmer = PromptTrimmer(tokenizer, (BOS,))
    assert await trimmer.fit("x" * (10 - TEXT_MARGIN), 10) is None
    assert tokenizer.calls == []


async def test_a_prompt_whose_tokens_fit_is_counted_and_sent_whole() -> None:
    tokenizer = CharTokenizer()
    trimmer = PromptTrimmer(tokenizer, (BOS,))
    prompt = "é" * 9  # 18 bytes, BOS + 9 tokens
    assert await trimmer.fit(prompt, 10) is None
    assert tokenizer.calls == [prompt]


async def test_a_prompt_over_the_limit_keeps_the_bos_and_its_last_tokens() -> None:
    trimmer = PromptTrimmer(CharTokenizer(), (BOS,))
    trimmed = await trimmer.fit("abcdefghij", 5)
    assert trimmed is not None
    assert trimmed.prompt == [BOS, *map(ord, "ghij")]
    assert (trimmed.before, trimmed.after, trimmed.unit) == (11, 5, "tokens")


async def test_a_limit_with_room_for_the_bos_alone_keeps_no_text() -> None:
    trimmed = await PromptTrimmer(CharTokenizer(), (BOS,)).fit("abcdef", 1)
    assert trimmed is not None
    assert trimmed.prompt == [BOS]


async def test_without_a_tokenizer_the_prompt_keeps_its_last_bytes_less_the_margin() -> None:
    trimmed = await PromptTrimmer(None).fit("ééééé", 8)  # 10 bytes
    assert trimmed is not None
    assert trimmed.prompt == "ééé"  # 8 - 2 bytes
    assert (trimmed.before, trimmed.after, trimmed.unit) == (10, 6, "bytes")


class StubBackend:
    """Answers ``post_json`` with ``answer`` (or raises it), recording the calls."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, Any]] = []

    async def post_json(self, path: str, body: Any, *, quick: bool = False) -> Any:
        self.calls.append((path, body))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_the_llamacpp_tokenizer_asks_tokenize_with_the_special_tokens_parsed() -> None:
    backend = StubBackend({"tokens": [1, 72, 105]})
    ids = await LlamaCppTokenizer(cast(Backend, backend)).tokenize("Hi", special=True)
    assert ids == [1, 72, 105]
    assert backend.calls == [
        ("/tokenize", {"content": "Hi", "add_special": True, "parse_special": True})
    ]


async def test_the_vllm_tokenizer_asks_tokenize_with_the_model_and_the_prompt() -> None:
    backend = StubBackend({"count": 2, "max_model_len": 8192, "tokens": [9906, 0]})
    ids = await VllmTokenizer(cast(Backend, backend), "m").tokenize("Hi", special=False)
    assert ids == [9906, 0]
    assert backend.calls == [
        ("/tokenize", {"model": "m", "prompt": "Hi", "add_special_tokens": False})
    ]


async def test_a_tokenize_answer_without_token_ids_is_a_backend_error() -> None:
    backend = StubBackend({"tokens": [{"id": 1, "piece": "<s>"}]})
    with pytest.raises(BackendError, match="no token ids"):
        await LlamaCppTokenizer(cast(Backend, backend)).tokenize("", special=True)


@pytest.mark.parametrize(
    ("kind", "answer", "tokenizer", "prefix"),
    [
        ("llamacpp", {"tokens": [1]}, "llama.cpp /tokenize", (1,)),
        ("vllm", {"tokens": []}, "vLLM /tokenize", ()),
        ("llamacpp", BackendError("404", down=False, status=404), None, ()),
        ("koboldcpp", {"tokens": [1]}, None, ()),
        ("ollama", {"tokens": [1]}, None, ()),
        ("openai", {"tokens": [1]}, None, ()),
    ],
)
async def test_the_trimmer_uses_the_backends_tokenizer_where_it_answers(
    kind: str, answer: Any, tokenizer: str | None, prefix: tuple[int, ...]
) -> None:
    trimmer = await prompt_trimmer(cast(Backend, StubBackend(answer)), kind, "m")
    assert (trimmer.tokenizer.name if trimmer.tokenizer else None) == tokenizer
    assert trimmer.prefix == prefix


async def test_a_backend_down_at_the_tokenizer_probe_is_raised() -> None:
    backend = StubBackend(BackendError("down", down=True))
    with pytest.raises(BackendError):
        await prompt_trimmer(cast(Backend, backend), "llamacpp", "m")
