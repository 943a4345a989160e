"""The OpenAI Responses API's answers (decision 0078): the Response object
of a done chat request, of one that failed, was cancelled or is still
waiting, and the stream encoder that emits the Responses event sequence.

Pure, no I/O: each is built from the request's ``RequestStatus`` and the
call's ``ResponseContext`` (its ``ResponsesEcho``: what the Response
repeats of its request and how it names namespaced functions; its request
id; its prompt's size). Usage is priced as on the chat route
(``_shape.usage``); ``x_horde`` is the chat completion's, plus the hosted
tools dropped under best_effort.

Output items, in order: the reasoning item (the worker's reasoning as
``reasoning_text`` content; no summary, which a horde has no summariser
for), the assistant message with its ``output_text``, then a
``function_call`` item for each call. Their ids are the request id with the
item's kind and output index (``msg_<request id>_1``), so that a stream and
the same Response read later name them alike.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

from hordelite.contract.chat_reply import ChatReply
from hordelite.contract.responses_request import ResponsesEcho, response_id
from hordelite.errors import HordeError
from hordelite.front import _shape
from hordelite.horde.results import RequestStatus

_ITEM_PREFIXES = {"reasoning": "rs", "message": "msg", "function_call": "fc"}
# The chat finish reasons a Response reports as incomplete, with why.
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def reasoning_item(identifier: str, text: str, status: str) -> dict[str, Any]:
    """The reasoning item: the worker's reasoning as ``reasoning_text``
    content (none while it opens), never encrypted."""
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {
        "type": "reasoning",
        "id": identifier,
        "summary": [],
        "content": content,
        "encrypted_content": None,
        "status": status,
    }


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(identifier: str, text: str | None, status: str) -> dict[str, Any]:
    """The assistant message; ``text`` None while it opens (no part yet)."""
    return {
        "type": "message",
        "id": identifier,
        "role": "assistant",
        "status": status,
        "content": [] if text is None else [_output_text(text)],
    }


def function_call_item(
    identifier: str, call: dict[str, Any], echo: ResponsesEcho, arguments: str | None = None
) -> dict[str, Any]:
    """A reply's tool call as a function_call item: its call id is the
    call's, a namespaced function named by its namespace and name.
    ``arguments`` None: the whole arguments, done; else in progress."""
    function = call["function"]
    return {
        "type": "function_call",
        "id": identifier,
        "call_id": call["id"],
        **echo.function(function["name"]),
        "arguments": function["arguments"] if arguments is None else arguments,
        "status": "completed" if arguments is None else "in_progress",
    }


def outcome(reply: ChatReply) -> tuple[str, dict[str, str] | None]:
    """The Response's status and incomplete_details: ``incomplete`` when
    the reply stopped at max_output_tokens or was filtered."""
    reason = _INCOMPLETE.get(reply.finish_reason)
    if reason is None:
        return "completed", None
    return "incomplete", {"reason": reason}


def usage(reply: ChatReply, prompt_chars: int) -> tuple[dict[str, Any], bool]:
    """The Response's usage, from the chat route's (counts the worker did
    not report are estimated); (usage, estimated). A horde caches no
    prompt: no input token is ever cached."""
    used, estimated = _shape.usage(reply, prompt_chars)
    return (
        {
            "input_tokens": used["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": used["completion_tokens"],
            "output_tokens_details": used["completion_tokens_details"],
            "total_tokens": used["total_tokens"],
        },
        estimated,
    )


def error_object(exc: HordeError) -> dict[str, str]:
    """A refusal as the Response's ``error``: OpenAI's codes are few, so a
    rate limit is ``rate_limit_exceeded`` and anything else
    ``server_error``; the horde's return code is in ``x_horde.rc``."""
    code = "rate_limit_exceeded" if exc.status == 429 else "server_error"
    return {"code": code, "message": exc.message}


@dataclasses.dataclass(frozen=True)
class ResponseContext:
    """What every answer of one call is built from: the call's echo, its
    horde request, its prompt's size (usage the worker did not report is
    estimated from it) and when the Response was created (Unix seconds)."""

    echo: ResponsesEcho
    request_id: str
    prompt_chars: int = 0
    created_at: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def item_id(self, kind: str, index: int) -> str:
        """The id of the output item of ``kind`` at ``index``."""
        return f"{_ITEM_PREFIXES[kind]}_{self.request_id}_{index}"

    def x_horde(self, fields: dict[str, Any]) -> dict[str, Any]:
        """``x_horde``: ``fields``, and the hosted tools best_effort dropped."""
        if self.echo.dropped_tools:
            return {**fields, "dropped_tools": list(self.echo.dropped_tools)}
        return fields

    def envelope(self, model: str, state: str) -> dict[str, Any]:
        """A Response with no output yet, in ``state``."""
        return {
            "id": response_id(self.request_id),
            "object": "response",
            "created_at": self.created_at,
            "status": state,
            "model": model,
            "output": [],
            "error": None,
            "incomplete_details": None,
            "usage": None,
            **self.echo.fields,
            "x_horde": self.x_horde({"request_id": self.request_id}),
        }

    def finished(self, status: RequestStatus, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The Response of a done request, with its ``output`` items."""
        generation, reply = _shape.reply_of(status)
        state, details = outcome(reply)
        used, estimated = usage(reply, self.prompt_chars)
        return {
            **self.envelope(generation.model, state),
            "output": output,
            "incomplete_details": details,
            "usage": used,
            **({"completed_at": int(time.time())} if state == "completed" else {}),
            "x_horde": self.x_horde(_shape.x_horde(self.request_id, status, estimated)),
        }

    def failed(self, envelope: dict[str, Any], exc: HordeError) -> dict[str, Any]:
        """``envelope`` failed with ``exc``: its error, and the horde's
        return code (and the refusal's metadata) in ``x_horde``."""
        meta = {k: v for k, v in exc.extra.items() if k not in ("param", "errors")}
        fields = {"request_id": self.request_id, "rc": exc.rc.name, **meta}
        return {**envelope, "error": error_object(exc), "x_horde": self.x_horde(fields)}


def response(
    context: ResponseContext, status: RequestStatus, include_reasoning: bool
) -> dict[str, Any]:
    """The Response of a done request (the non-streamed answer, and a
    stored one read back)."""
    _, reply = _shape.reply_of(status)
    state, _ = outcome(reply)
    # The last text item is the one a stop cut short, as when streamed.
    text_status = "incomplete" if state == "incomplete" else "completed"
    has_message = bool(reply.content or not reply.tool_calls)
    output: list[dict[str, Any]] = []
    if include_reasoning and reply.reasoning_content:
        reasoning_status = "completed" if has_message else text_status
        identifier = context.item_id("reasoning", 0)
        output.append(reasoning_item(identifier, reply.reasoning_content, reasoning_status))
    if has_message:
        identifier = context.item_id("message", len(output))
        output.append(message_item(identifier, reply.content or "", text_status))
    for call in reply.tool_calls or ():
        identifier = context.item_id("function_call", len(output))
        output.append(function_call_item(identifier, call, context.echo))
    return context.finished(status, output)


def ended_response(
    context: ResponseContext, model: str, state: str, exc: HordeError | None = None
) -> dict[str, Any]:
    """The Response of a request with no reply to show, read back: ``failed``
    (with ``exc``, its fault), ``cancelled``, or still ``queued`` or
    ``in_progress``."""
    envelope = context.envelope(model, state)
    return envelope if exc is None else context.failed(envelope, exc)


# The stream ------------------------------------------------------------------------


@dataclasses.dataclass
class _OpenItem:
    """The reasoning item or message whose text is streaming."""

    kind: str
    index: int
    id: str
    text: str = ""


class ResponsesEncoder:
    """The Responses event stream of one call, built from the deltas the
    relay hands it (all the reasoning, then the content) and the finished
    status: ``opening``, ``delta``..., then ``closing`` (or ``failure``).

    Each event is ``event: <type>`` and ``data: <json>`` with its
    ``sequence_number``, from 0. An item opens at its first delta (added
    and content_part.added events) and closes (the text's done,
    content_part.done and output_item.done events) when the other kind's
    delta or the end comes; the function calls follow, each with its whole
    arguments as one delta. The last event is response.completed,
    response.incomplete (max_output_tokens, content_filter) or
    response.failed. No ``[DONE]``: OpenAI's Responses stream ends with the
    connection."""

    def __init__(self, context: ResponseContext, model: str) -> None:
        self.context = context
        self.model = model  # the model asked for, until the reply names the one that served
        self._sequence = 0
        self._output: list[dict[str, Any]] = []  # the items done, in order
        self._open: _OpenItem | None = None
        self._has_message = False

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        body = json.dumps(data, separators=(",", ":"))
        return f"event: {kind}\ndata: {body}\n\n".encode()

    def _snapshot(self, state: str) -> dict[str, Any]:
        return {**self.context.envelope(self.model, state), "output": list(self._output)}

    def opening(self) -> Iterator[bytes]:
        """response.created, then response.in_progress."""
        yield self._event("response.created", response=self._snapshot("in_progress"))
        yield self._event("response.in_progress", response=self._snapshot("in_progress"))

    def keepalive(self) -> bytes:
        """response.in_progress again, while the call waits: an event, not
        an SSE comment, because Codex times a stream out when no event
        comes for five minutes (its parser skips comments)."""
        return self._event("response.in_progress", response=self._snapshot("in_progress"))

    def delta(self, field: str, text: str) -> Iterator[bytes]:
        """``text`` of the reply's ``field`` (``reasoning_content`` or
        ``content``), as the text delta of its item, opened if need be."""
        if not text:
            return
        kind = "reasoning" if field == "reasoning_content" else "message"
        if self._open is None or self._open.kind != kind:
            yield from self._close("completed")
            yield from self._start(kind)
        item = self._open
        assert item is not None
        item.text += text
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if kind == "reasoning":
            yield self._event("response.reasoning_text.delta", **where, delta=text)
        else:
            yield self._event("response.output_text.delta", **where, delta=text, logprobs=[])

    def _start(self, kind: str) -> Iterator[bytes]:
        index = len(self._output)
        item = self._open = _OpenItem(kind, index, self.context.item_id(kind, index))
        if kind == "reasoning":
            added, part = reasoning_item(item.id, "", "in_progress"), {"type": "reasoning_text"}
        else:
            added, part = message_item(item.id, None, "in_progress"), _output_text("")
            self._has_message = True
        yield self._event("response.output_item.added", output_index=index, item=added)
        where = {"item_id": item.id, "output_index": index, "content_index": 0}
        yield self._event("response.content_part.added", **where, part={**part, "text": ""})

    def _close(self, status: str) -> Iterator[bytes]:
        """The open item's done events, in ``status``; nothing when none is open."""
        item, self._open = self._open, None
        if item is None:
            return
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if item.kind == "reasoning":
            done = reasoning_item(item.id, item.text, status)
            part = {"type": "reasoning_text", "text": item.text}
            yield self._event("response.reasoning_text.done", **where, text=item.text)
        else:
            done = message_item(item.id, item.text, status)
            part = _output_text(item.text)
            yield self._event("response.output_text.done", **where, text=item.text, logprobs=[])
        yield self._event("response.content_part.done", **where, part=part)
        yield self._event("response.output_item.done", output_index=item.index, item=done)
        self._output.append(done)

    def closing(self, status: RequestStatus) -> Iterator[bytes]:
        """After the last delta: the open item's end, the function calls,
        and response.completed or response.incomplete with the Response."""
        _, reply = _shape.reply_of(status)
        state, _ = outcome(reply)
        yield from self._close("incomplete" if state == "incomplete" else "completed")
        if not self._has_message and not reply.tool_calls:
            # An empty reply is still an assistant message, as unstreamed.
            yield from self._start("message")
            yield from self._close("incomplete" if state == "incomplete" else "completed")
        for call in reply.tool_calls or ():
            yield from self._function_call(call)
        final = self.context.finished(status, self._output)
        yield self._event(f"response.{state}", response=final)

    def _function_call(self, call: dict[str, Any]) -> Iterator[bytes]:
        index = len(self._output)
        identifier = self.context.item_id("function_call", index)
        arguments = call["function"]["arguments"]
        added = function_call_item(identifier, call, self.context.echo, arguments="")
        yield self._event("response.output_item.added", output_index=index, item=added)
        where = {"item_id": identifier, "output_index": index}
        if arguments:
            yield self._event("response.function_call_arguments.delta", **where, delta=arguments)
        yield self._event("response.function_call_arguments.done", **where, arguments=arguments)
        done = function_call_item(identifier, call, self.context.echo)
        yield self._event("response.output_item.done", output_index=index, item=done)
        self._output.append(done)

    def failure(self, exc: HordeError) -> Iterator[bytes]:
        """The end of a stream the horde cannot finish: the open item ends
        incomplete, then response.failed with the error."""
        yield from self._close("incomplete")
        failed = self.context.failed(self._snapshot("failed"), exc)
        yield self._event("response.failed", response=failed)
