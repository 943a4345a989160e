"""Trimming a text prompt from its start (hordelite/worker/_trim.py)."""

from __future__ import annotations

import pytest

from hordelite.worker._trim import TEXT_MARGIN, PromptTrimmer, keep_end

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
