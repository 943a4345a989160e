"""The bound of a generation and what it stores (contract/generations.py,
decision 0069), and the status cache's bound in bytes."""

from __future__ import annotations

from hordelite.contract.chat_reply import ChatReply
from hordelite.contract.generations import (
    allowed_bytes,
    reply_bytes,
    reply_refusal,
    reply_stored_bytes,
    reserved_bytes,
    text_refusal,
)
from hordelite.contract.limits import (
    CHAT_REPLY_ALLOWANCE_BYTES,
    GENERATION_ALLOWANCE_BYTES,
    MAX_MAX_LENGTH,
    MIN_MAX_LENGTH,
)
from hordelite.errors import RC
from hordelite.horde.caches import StatusCache
from hordelite.horde.results import Generation, RequestStatus


def reply(content: str | None = None, reasoning: str | None = None, **calls: str) -> ChatReply:
    tool_calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
        for i, (name, args) in enumerate(calls.items())
    ]
    return ChatReply(content, tool_calls or None, reasoning, "stop", None, None, None, None)


def test_the_bound_is_16_bytes_a_max_length_token_and_an_allowance() -> None:
    assert allowed_bytes("text", 16) == 256 + GENERATION_ALLOWANCE_BYTES
    assert (
        allowed_bytes("chat", 16) == 256 + GENERATION_ALLOWANCE_BYTES + CHAT_REPLY_ALLOWANCE_BYTES
    )
    assert allowed_bytes("chat", None) == allowed_bytes("chat", MAX_MAX_LENGTH)
    assert reserved_bytes("text", 16, 20) == 20 * allowed_bytes("text", 16)
    assert reserved_bytes("chat", 16, 1) == 2 * allowed_bytes("chat", 16)  # content kept twice


def test_a_normal_reply_at_the_smallest_max_length_fits() -> None:
    # 16 tokens of four-byte characters, and a stop sequence of 1000 of them left in.
    assert text_refusal("😀" * 16 + "😀" * 1000, MIN_MAX_LENGTH) is None


def test_a_text_generation_is_measured_in_bytes_of_utf8() -> None:
    bound = allowed_bytes("text", 16)
    assert text_refusal("é" * (bound // 2), 16) is None
    refusal = text_refusal("é" * (bound // 2 + 1), 16)
    assert refusal is not None
    assert refusal.rc is RC.BadRequest
    assert list(refusal.extra["errors"]) == ["generation"]
    assert text_refusal("x" * (bound + 1), 16) is not None


def test_a_chat_reply_counts_content_reasoning_and_calls_together() -> None:
    bound = allowed_bytes("chat", 32)
    third = bound // 3
    fits = reply("a" * third, "b" * third, lookup="c" * (bound - 2 * third - len("lookup")))
    assert reply_bytes(fits) == bound
    assert reply_refusal(fits, 32) is None
    over = reply("a" * third, "b" * third, lookup="c" * (bound - 2 * third - len("lookup") + 1))
    refusal = reply_refusal(over, 32)
    assert refusal is not None
    assert refusal.rc is RC.ChatSubmitInvalid
    assert "message" in refusal.extra["errors"]
    # Reasoning alone past the bound, with a short content.
    assert reply_refusal(reply("ok", "r" * bound), 32) is not None
    assert reply_stored_bytes(reply("é" * 10)) == 40  # the content, kept twice


def status(chars: int) -> RequestStatus:
    generations = (Generation("w", "worker", "m", "ok", text="x" * chars),) if chars else ()
    return RequestStatus("text", 1, 0, 0, 0, True, False, 0, 0, 0.0, True, generations)


def test_the_status_cache_holds_a_bounded_number_of_bytes() -> None:
    cache = StatusCache(max_bytes=8000)
    for i in range(10):
        cache.put(("text", str(i), False, False), 1, 0.0, status(900))
    assert cache.bytes <= 8000
    assert cache.get(("text", "9", False, False), 1, 0.0) is not None  # the newest kept
    assert cache.get(("text", "0", False, False), 1, 0.0) is None  # the oldest gone
    held = cache.bytes
    # An entry replaced counts once.
    cache.put(("text", "9", False, False), 2, 0.0, status(900))
    assert cache.bytes == held
    # A status larger than an eighth of the bound is answered, not kept.
    cache.put(("text", "big", False, False), 1, 0.0, status(1001))
    assert cache.get(("text", "big", False, False), 1, 0.0) is None
    assert cache.bytes == held
