"""How a front's stream is written, whatever its API.

The relay (``_relay``) and a stream served from a finished reply
(``from_reply``) speak to an ``Encoder``: the opening, text deltas in order
(all reasoning before content), keep-alives while it waits, and the closing
built from the done status (tool calls, the finish, usage). Each API has its
own: OpenAI's chat chunks here, the Responses events (``_responses``) and
Anthropic's events (``_messages``). An encoder is pure: bytes in, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from hordelite.errors import HordeError
from hordelite.front import _shape
from hordelite.horde.results import RequestStatus
from hordelite.http import envelopes

# The two texts a reply streams, by their OpenAI delta field names.
REASONING = "reasoning_content"
CONTENT = "content"
# An idle stream's comment while its call waits (OpenAI's streams).
KEEPALIVE = b": waiting for a worker\n\n"


class Encoder(Protocol):
    """A stream's events in one API. ``model``: the model its events name,
    updated by the relay as the worker's posts name theirs."""

    model: str

    def opening(self) -> Iterator[bytes]:
        """The events before any text."""
        ...

    def delta(self, field: str, text: str) -> Iterator[bytes]:
        """More of ``field`` (REASONING or CONTENT)."""
        ...

    def keepalive(self) -> bytes:
        """What keeps an idle stream open (a comment, or a ping event)."""
        ...

    def closing(self, status: RequestStatus) -> Iterator[bytes]:
        """Everything after the last delta of the done ``status``."""
        ...

    def failure(self, exc: HordeError) -> Iterator[bytes]:
        """The stream's end when it fails after its headers left."""
        ...


def from_reply(
    encoder: Encoder, status: RequestStatus, include_reasoning: bool, *, opened: bool = False
) -> Iterator[bytes]:
    """A finished reply as a stream: the opening (unless ``opened``: sent
    before the wait), its reasoning (when it is relayed) and content, then
    the closing."""
    generation, reply = _shape.reply_of(status)
    encoder.model = generation.model
    if not opened:
        yield from encoder.opening()
    if include_reasoning and reply.reasoning_content:
        yield from encoder.delta(REASONING, reply.reasoning_content)
    if reply.content:
        yield from encoder.delta(CONTENT, reply.content)
    yield from encoder.closing(status)


class ChatChunks:
    """``/v1/chat/completions``' stream: ``chat.completion.chunk`` events,
    then ``[DONE]``."""

    def __init__(self, request_id: str, model: str, prompt_chars: int, include_usage: bool) -> None:
        self.request_id = request_id
        self.model = model
        self.prompt_chars = prompt_chars
        self.include_usage = include_usage
        self._base = _shape.chunk_base(request_id, model)

    def _chunk(self, delta: dict[str, Any]) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}
        tail = {"usage": None} if self.include_usage else {}
        return _shape.sse({**self._base, "model": self.model, "choices": [choice], **tail})

    def opening(self) -> Iterator[bytes]:
        yield self._chunk({"role": "assistant", "content": ""})

    def delta(self, field: str, text: str) -> Iterator[bytes]:
        yield self._chunk({field: text})

    def keepalive(self) -> bytes:
        return KEEPALIVE

    def closing(self, status: RequestStatus) -> Iterator[bytes]:
        _, reply = _shape.reply_of(status)
        if reply.tool_calls:
            calls = [{"index": i, **call} for i, call in enumerate(reply.tool_calls)]
            yield self._chunk({"tool_calls": calls})
        yield from _shape.finish_chunks(
            self.request_id, status, self.prompt_chars, self.include_usage
        )

    def failure(self, exc: HordeError) -> Iterator[bytes]:
        yield _shape.sse(envelopes.openai_error(exc, {"request_id": self.request_id}))
        yield _shape.DONE
