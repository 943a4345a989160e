"""Anthropic Messages API answers built from a request's status (decision 0079).

- ``message(shape, status)``: the Message object of a done chat request;
- ``MessageStream``: the stream encoder the relay drives (opening, deltas,
  keepalive, closing or failure), as Anthropic's server-sent events;
- ``token_count(call)``: the count_tokens answer, estimated;
- ``model_entry`` and ``models_page``: the models list in Anthropic's shape.

Pure: no I/O. Usage counts are the worker's when it reported them, else
estimated as on the OpenAI routes (``_shape.usage``); the cache counts are
always 0 (a horde caches no prompt).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hordelite.contract.chat_reply import ChatReply
from hordelite.contract.chat_request import flatten_messages
from hordelite.contract.messages_request import MessagesCall
from hordelite.errors import RC, HordeError
from hordelite.front import _shape
from hordelite.horde.results import RequestStatus
from hordelite.http import envelopes

# A thinking block's signature: what Anthropic signs so that it can check a
# block carried back. A horde sends no earlier thinking to a worker, so it
# has nothing to check: the signature names the request the thinking came
# from (SIGNATURE_PREFIX and its id), so that a block carried back can be
# traced to its request's status.
SIGNATURE_PREFIX = "hordelite:"
# The models list's created_at: a horde does not know when a model was released.
MODEL_CREATED_AT = "1970-01-01T00:00:00Z"

_STOP_REASONS = {"length": "max_tokens", "content_filter": "refusal"}
PING = b'event: ping\ndata: {"type":"ping"}\n\n'


@dataclasses.dataclass(frozen=True)
class MessageShape:
    """What shapes the answer of a queued Messages call, beside its status."""

    request_id: str
    model: str  # as the call named it (the stream's message_start)
    prompt_chars: int  # the flattened conversation: estimated input tokens
    # Thinking blocks: None for none, else their display ("summarized" or
    # "omitted"): MessagesCall.thinking, None when horde.include_reasoning is false.
    thinking: str | None
    adjustments: tuple[dict[str, Any], ...] = ()  # MessagesCall.adjustments

    @property
    def id(self) -> str:
        return f"msg_{self.request_id}"

    @property
    def signature(self) -> str:
        return SIGNATURE_PREFIX + self.request_id

    def thinking_text(self, reasoning: str) -> str:
        """A thinking block's text: the reasoning, or nothing when omitted."""
        return reasoning if self.thinking == "summarized" else ""

    def usage(self, reply: ChatReply) -> tuple[dict[str, Any], bool]:
        """Anthropic's usage, and whether a count of it was estimated."""
        used, estimated = _shape.usage(reply, self.prompt_chars)
        return {
            "input_tokens": used["prompt_tokens"],
            "output_tokens": used["completion_tokens"],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens_details": {
                "thinking_tokens": used["completion_tokens_details"]["reasoning_tokens"]
            },
        }, estimated

    def x_horde(self, status: RequestStatus, estimated: bool) -> dict[str, Any]:
        """The OpenAI routes' x_horde, with the changes made for the horde to
        take the request (this call's and admission's) as context_adjustments."""
        out = _shape.x_horde(self.request_id, status, estimated)
        adjustments = [*self.adjustments, *(status.context_adjustments or ())]
        if adjustments:
            out["context_adjustments"] = adjustments
        return out


def stop_reason(reply: ChatReply) -> str:
    """Anthropic's stop_reason: tool_use for a reply with calls, max_tokens
    for one cut at its budget, refusal for one filtered, else end_turn. A
    worker does not say which stop sequence ended a reply, so a reply one
    ended also reads end_turn (stop_sequence is always null)."""
    if reply.tool_calls:
        return "tool_use"
    return _STOP_REASONS.get(reply.finish_reason, "end_turn")


def tool_input(call: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call's arguments as the tool_use block's input object (blank
    arguments are the empty object). Arguments that are not a JSON object
    cannot be shown in the Messages shape: 502 ChatWorkerFault."""
    arguments = call["function"]["arguments"]
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise HordeError(
            RC.ChatWorkerFault,
            f"The worker called {call['function']['name']!r} with arguments that are not a JSON "
            "object, which a tool_use block cannot hold; the reply is on the request's status.",
        )
    return value


def _tool_use(call: Mapping[str, Any], input_: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": input_}


def message(shape: MessageShape, status: RequestStatus) -> dict[str, Any]:
    """The non-streamed answer: the Message, with x_horde."""
    generation, reply = _shape.reply_of(status)
    content: list[dict[str, Any]] = []
    if shape.thinking is not None and reply.reasoning_content:
        content.append(
            {
                "type": "thinking",
                "thinking": shape.thinking_text(reply.reasoning_content),
                "signature": shape.signature,
            }
        )
    if reply.content:
        content.append({"type": "text", "text": reply.content})
    content.extend(_tool_use(call, tool_input(call)) for call in reply.tool_calls or ())
    used, estimated = shape.usage(reply)
    return {
        "id": shape.id,
        "type": "message",
        "role": "assistant",
        "model": generation.model,
        "content": content,
        "stop_reason": stop_reason(reply),
        "stop_sequence": None,
        "usage": used,
        "x_horde": shape.x_horde(status, estimated),
    }


def event(data: dict[str, Any]) -> bytes:
    """One server-sent event, named by its type (the anthropic SDK reads
    the name: an event without one is skipped)."""
    return b"event: " + str(data["type"]).encode() + b"\n" + _shape.sse(data)


class MessageStream:
    """The Messages stream of one call, as the relay drives it: ``opening``,
    ``delta`` for each text in order, then ``closing`` with the final
    status, or ``failure``; ``keepalive`` while it waits.

    A delta opens a block of its kind (thinking or text) when the open one
    is of the other kind, closing that one; a thinking block closes with its
    signature. Tool calls come whole at the closing, each a tool_use block
    whose input arrives as one input_json_delta."""

    def __init__(self, shape: MessageShape) -> None:
        self.shape = shape
        # The model message_start names: the one asked for, until a relayed
        # post or the finished reply (from_reply) names the one serving.
        self.model = shape.model
        self.index = -1  # the last block started
        self.open: str | None = None  # the kind of the block open, if any

    def opening(self) -> Iterator[bytes]:
        """message_start (usage: the input estimated, no output yet), then a ping."""
        shape = self.shape
        start: dict[str, Any] = {
            "id": shape.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": _shape.estimated_tokens(shape.prompt_chars),
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        yield event({"type": "message_start", "message": start})
        yield PING

    def delta(self, field: str, text: str) -> Iterator[bytes]:
        """``text`` of ``field`` ("reasoning_content" or "content"). Reasoning
        is dropped when the call shows no thinking."""
        if not text:
            return
        if field == "reasoning_content":
            if self.shape.thinking is None:
                return
            yield from self._into("thinking")
            shown = self.shape.thinking_text(text)
            if shown:
                yield self._delta({"type": "thinking_delta", "thinking": shown})
        else:
            yield from self._into("text")
            yield self._delta({"type": "text_delta", "text": text})

    def keepalive(self) -> bytes:
        return PING

    def closing(self, status: RequestStatus) -> Iterator[bytes]:
        """The open block's end, a tool_use block per call, message_delta
        (stop_reason, the final usage and x_horde), message_stop."""
        _, reply = _shape.reply_of(status)
        calls = [(call, tool_input(call)) for call in reply.tool_calls or ()]  # refused first
        yield from self._close()
        for call, _input in calls:
            yield from self._start(_tool_use(call, {}))
            yield self._delta({"type": "input_json_delta", "partial_json": _arguments(call)})
            yield from self._close()
        used, estimated = self.shape.usage(reply)
        yield event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(reply), "stop_sequence": None},
                "usage": used,
                "x_horde": self.shape.x_horde(status, estimated),
            }
        )
        yield event({"type": "message_stop"})

    def failure(self, exc: HordeError) -> Iterator[bytes]:
        """The stream's end on a failure: Anthropic's error event."""
        yield event(envelopes.anthropic_error(exc, {"request_id": self.shape.request_id}))

    def _into(self, kind: str) -> Iterator[bytes]:
        """Make a block of ``kind`` the open one."""
        if self.open == kind:
            return
        yield from self._close()
        if kind == "thinking":
            yield from self._start({"type": "thinking", "thinking": "", "signature": ""})
        else:
            yield from self._start({"type": "text", "text": ""})

    def _start(self, block: dict[str, Any]) -> Iterator[bytes]:
        self.index += 1
        self.open = block["type"]
        yield event({"type": "content_block_start", "index": self.index, "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event({"type": "content_block_delta", "index": self.index, "delta": delta})

    def _close(self) -> Iterator[bytes]:
        if self.open is None:
            return
        if self.open == "thinking":
            yield self._delta({"type": "signature_delta", "signature": self.shape.signature})
        yield event({"type": "content_block_stop", "index": self.index})
        self.open = None


def _arguments(call: Mapping[str, Any]) -> str:
    """A call's arguments as one input_json_delta: as the worker sent them
    (a JSON object, checked), or nothing for blank arguments."""
    arguments: str = call["function"]["arguments"]
    return arguments if arguments.strip() else ""


def token_count(call: MessagesCall) -> dict[str, Any]:
    """The count_tokens answer. A horde runs no tokenizer: the count is the
    estimate a Message's usage gives when its worker reports none, the
    conversation flattened as the horde's estimates read it (tools
    included, images not) at 4 characters a token, rounded up."""
    chars = len(flatten_messages(call.chat["messages"], call.chat.get("tools")))
    return {"input_tokens": _shape.estimated_tokens(chars), "x_horde": {"estimated_usage": True}}


def model_entry(name: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    """A model as Anthropic lists it: its limits are the largest its online
    chat workers declare (a worker checks the exact fit), and its chat
    summary is beside them as /v1/models gives it on the OpenAI routes."""
    return {
        "type": "model",
        "id": name,
        "display_name": name,
        "created_at": MODEL_CREATED_AT,
        "lifecycle": "active",
        "max_input_tokens": summary["max_context_length"],
        "max_tokens": summary["max_length"],
        "chat": dict(summary),
    }


def models_page(
    entries: Sequence[Mapping[str, Any]],
    *,
    limit: int,
    after_id: str | None = None,
    before_id: str | None = None,
) -> dict[str, Any]:
    """One page of ``entries`` (model_entry's, in list order): the first
    ``limit``, those after ``after_id``, or those just before ``before_id``.
    A cursor that names no model listed is 404 model_not_found naming it."""
    ids = [entry["id"] for entry in entries]
    if after_id is not None and before_id is not None:
        raise HordeError(RC.BadRequest, "Send after_id or before_id, not both.", param="before_id")
    for param, cursor in (("after_id", after_id), ("before_id", before_id)):
        if cursor is not None and cursor not in ids:
            raise HordeError(
                RC.model_not_found, f"No model {cursor!r} is listed on this front.", param=param
            )
    if before_id is not None:
        stop = ids.index(before_id)
        start = max(0, stop - limit)
        more = start > 0
    else:
        start = 0 if after_id is None else ids.index(after_id) + 1
        stop = min(len(ids), start + limit)
        more = stop < len(ids)
    page = list(entries[start:stop])
    return {
        "data": page,
        "has_more": more,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }
