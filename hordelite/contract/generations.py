"""How large a generation may be, and what it stores (decision 0069).

A job asked for at most ``max_length`` tokens. The horde runs no
tokenizer, so it bounds a generation by the specification's own measure
for a job's streamed text: PROGRESS_BYTES_PER_TOKEN bytes of UTF-8 per
token (a token is a few characters; even one of four-byte characters fits),
plus an allowance. A submit past the bound is the worker breaking the
contract: 400 BadRequest naming ``generation`` for a text job (what the AI
Horde answers a submit its validation refuses), 400 ChatSubmitInvalid naming
the message for a chat job (the worker guide's submit refusal, recorded on
the job so that the worker's fault then reports it).

A request reserves the bound of each of its ``n`` generations in its
requester's stored bytes when it is queued (``reserved_bytes``), while it is
held; once it is released, each generation it stored counts its own bytes
(``text_generation_bytes``, ``reply_stored_bytes``) until it is purged.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from hordelite.contract.chat_reply import ChatReply, output_estimate_chars, submit_invalid
from hordelite.contract.limits import (
    CHAT_REPLY_ALLOWANCE_BYTES,
    GENERATION_ALLOWANCE_BYTES,
    MAX_MAX_LENGTH,
    PROGRESS_BYTES_PER_TOKEN,
)
from hordelite.errors import HordeError, bad_request

# UTF-8 takes at most 4 bytes a character (a lone surrogate, written with
# surrogatepass, takes 3).
_MAX_UTF8_BYTES_PER_CHAR = 4


def allowed_bytes(kind: str, max_length: int | None) -> int:
    """The most bytes one generation of a job of this kind ("text" or
    "chat") and max_length may hold (None: the largest max_length)."""
    tokens = MAX_MAX_LENGTH if max_length is None else max(0, max_length)
    allowance = GENERATION_ALLOWANCE_BYTES
    if kind == "chat":
        allowance += CHAT_REPLY_ALLOWANCE_BYTES
    return PROGRESS_BYTES_PER_TOKEN * tokens + allowance


# No generation of any job is longer than this many characters: a submit
# is refused at parsing past it, before its job is looked up.
MAX_GENERATION_CHARS = allowed_bytes("chat", MAX_MAX_LENGTH)


def stored_bound(kind: str, max_length: int | None) -> int:
    """The most bytes one generation of such a job stores: its bound, twice
    for a chat reply, whose content is kept as the native status's text and
    in the stored reply the OpenAI answer is built from."""
    return allowed_bytes(kind, max_length) * (2 if kind == "chat" else 1)


def reserved_bytes(kind: str, max_length: int, n: int) -> int:
    """What a request of ``n`` generations reserves of its requester's
    stored bytes when it is queued: each generation at its stored bound."""
    return n * stored_bound(kind, max_length)


def _fits(chars: int, measure: Callable[[], int], bound: int) -> bool:
    """Whether text of ``chars`` characters fits ``bound`` bytes of UTF-8;
    ``measure`` (its bytes, which costs a pass over the text) is called only
    when the characters alone do not settle it: a character takes 1 to 4
    bytes."""
    if chars * _MAX_UTF8_BYTES_PER_CHAR <= bound:
        return True
    return chars <= bound and measure() <= bound


def text_generation_bytes(generation: str) -> int:
    """The bytes a text generation stores (UTF-8)."""
    return len(generation.encode("utf-8", "surrogatepass"))


def reply_stored_bytes(reply: ChatReply) -> int:
    """The bytes a chat reply stores: ``reply_bytes``, and its content again
    (``stored_bound``)."""
    return reply_bytes(reply) + len((reply.content or "").encode("utf-8", "surrogatepass"))


def reply_bytes(reply: ChatReply) -> int:
    """The bytes a chat reply's generated text stores (UTF-8): its content,
    its reasoning, and each tool call's name and arguments."""
    texts = [reply.content, reply.reasoning_content]
    for call in reply.tool_calls or ():
        texts += [call["function"]["name"], call["function"]["arguments"]]
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in texts if t)


def text_refusal(generation: str, max_length: int) -> HordeError | None:
    """400 BadRequest naming ``generation`` for a text generation larger
    than its job's bound, or None."""
    bound = allowed_bytes("text", max_length)
    if _fits(len(generation), lambda: text_generation_bytes(generation), bound):
        return None
    return bad_request(
        "generation",
        f"is larger than this job allows: {bound} bytes of UTF-8 for max_length "
        f"{max_length} ({PROGRESS_BYTES_PER_TOKEN} per token and {GENERATION_ALLOWANCE_BYTES} more)",
    )


def reply_refusal(reply: ChatReply, max_length: int | None) -> HordeError | None:
    """400 ChatSubmitInvalid naming ``message`` for a chat reply whose
    content, reasoning and tool calls together are larger than its job's
    bound, or None."""
    bound = allowed_bytes("chat", max_length)
    if _fits(output_estimate_chars(reply), lambda: reply_bytes(reply), bound):
        return None
    shown = "the largest max_length" if max_length is None else f"max_length {max_length}"
    return submit_invalid(
        "message",
        f"content, reasoning_content and tool_calls together are larger than this job "
        f"allows: {bound} bytes of UTF-8 for {shown} ({PROGRESS_BYTES_PER_TOKEN} per token "
        f"and {GENERATION_ALLOWANCE_BYTES + CHAT_REPLY_ALLOWANCE_BYTES} more)",
    )
