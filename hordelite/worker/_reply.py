"""From a job to a backend request, and from the backend's answer to a submit.

Pure functions, no I/O (the worker guide of the chat specification, steps 2, 6
and 7):

- ``chat_completion_body`` / ``text_completion_body``: the OpenAI-compatible
  request for a job, every sampling field applied as sent;
- ``check_sendable``: whether that request can be encoded at all;
- ``split_reasoning``: a ``<think>`` block split off the content;
- ``finish_reason``: the backend's reason mapped onto the four accepted;
- ``chat_reply_fields``: the structured submit of a backend's message;
- ``StreamedChat``: a streamed answer accumulated chunk by chunk, with the
  text that may be posted as progress at any point.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Mapping
from typing import Any

from hordelite.contract.chat_reply import FINISH_REASONS
from hordelite.contract.limits import MAX_NATIVE_FINISH_REASON, MAX_REPORTED_TOKENS
from hordelite.contract.unicode_rules import unsendable
from hordelite.errors import HordeliteError

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# The chat payload fields passed to /v1/chat/completions under the same name,
# when present (tools and response_format arrive only when they apply).
_CHAT_FIELDS = (
    "temperature",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "reasoning_effort",
)
# Samplers OpenAI does not have, under each backend's own name, where the
# backend takes them: llama.cpp's server, koboldcpp (its KoboldAI names, also
# on its OpenAI routes) and vLLM. Ollama's OpenAI routes take none of them.
_BACKEND_SAMPLERS: dict[str, dict[str, str]] = {
    "llamacpp": {
        "top_k": "top_k",
        "min_p": "min_p",
        "rep_pen": "repeat_penalty",
        "rep_pen_range": "repeat_last_n",
        "typical": "typical_p",
    },
    "koboldcpp": {
        name: name
        for name in (
            "top_k",
            "min_p",
            "rep_pen",
            "rep_pen_range",
            "rep_pen_slope",
            "typical",
            "tfs",
            "top_a",
        )
    },
    "vllm": {"top_k": "top_k", "min_p": "min_p", "rep_pen": "repetition_penalty"},
}
# Text payload fields with an OpenAI name on /v1/completions.
_TEXT_FIELDS = {"temperature": "temperature", "top_p": "top_p"}


def backend_samplers(kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The payload's backend-only samplers under the backend's names; none
    for a backend that does not take them."""
    names = _BACKEND_SAMPLERS.get(kind, {})
    extras = {names[k]: v for k, v in payload.items() if k in names and v is not None}
    if kind == "vllm" and extras.get("top_k") == 0:
        extras["top_k"] = -1  # vLLM's "all tokens"; older releases refuse 0
    return extras


def chat_completion_body(payload: Mapping[str, Any], model: str, kind: str) -> dict[str, Any]:
    """The /v1/chat/completions body of a chat job: the conversation, every
    sampling field as sent, max_tokens = max_length, the stop sequences."""
    body: dict[str, Any] = {
        "model": model,
        "messages": payload["messages"],
        "max_tokens": payload["max_length"],
    }
    body.update({key: payload[key] for key in _CHAT_FIELDS if key in payload})
    if payload.get("stop_sequence"):
        body["stop"] = list(payload["stop_sequence"])
    body.update(backend_samplers(kind, payload))
    return body


def text_completion_body(payload: Mapping[str, Any], model: str, kind: str) -> dict[str, Any]:
    """The /v1/completions body of a text job."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": payload["prompt"],
        "max_tokens": payload["max_length"],
    }
    body.update({name: payload[key] for key, name in _TEXT_FIELDS.items() if key in payload})
    if payload.get("stop_sequence"):
        body["stop"] = list(payload["stop_sequence"])
    body.update(backend_samplers(kind, payload))
    return body


class UnsendableJob(HordeliteError):
    """A job whose backend request cannot be encoded as UTF-8 JSON: a lone
    surrogate in its text, say, or a number JSON cannot carry. No backend can
    be sent it, so it is the request's doing, not the backend's."""


def check_sendable(body: Mapping[str, Any]) -> None:
    """Raise UnsendableJob unless ``body`` encodes as the backend client
    will send it (JSON in UTF-8, no NaN or infinity)."""
    try:
        json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, TypeError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        where = unsendable(body) or "the backend request"
        raise UnsendableJob(f"{where} cannot be sent as UTF-8 JSON ({exc})") from None


def split_reasoning(text: str, *, final: bool = True) -> tuple[str, str]:
    """``(reasoning, content)`` of a reply's raw text.

    A reply opening with a ``<think>`` block has it split off: the block's
    text is the reasoning, what follows ``</think>`` the content. A block
    that never closed is all reasoning, with an empty content (a reply cut at
    max_length while thinking). With ``final`` false the text is still being
    generated: what could yet turn out to be a tag is held back, so that each
    answer for a longer text extends the previous one.
    """
    stripped = text.lstrip()
    if not stripped.startswith(THINK_OPEN):
        if not final and THINK_OPEN.startswith(stripped):
            return "", ""  # nothing yet, or a tag half generated
        return "", text
    body = stripped[len(THINK_OPEN) :]
    end = body.find(THINK_CLOSE)
    if end >= 0:
        reasoning = body[:end]
        content = body[end + len(THINK_CLOSE) :].lstrip()
        return (reasoning.strip() if final else reasoning.lstrip()), content
    if final:
        return body.strip(), ""
    return _without_partial_tag(body, THINK_CLOSE).lstrip(), ""


def _without_partial_tag(text: str, tag: str) -> str:
    """``text`` less a suffix that is the start of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return text[:-size]
    return text


def finish_reason(native: Any, has_calls: bool) -> str:
    """The backend's finish reason mapped onto stop, length, content_filter
    and tool_calls (worker guide, step 6): length when generation reached the limit,
    tool_calls when the reply has calls and the backend says so, content_filter
    when the backend withheld the reply, stop otherwise."""
    if native in ("length", "max_tokens", "model_length"):
        return "length"
    if native == "content_filter":
        return "content_filter"
    if has_calls and native in ("tool_calls", "function_call", None):
        return "tool_calls"
    return "stop"


def reported_counts(usage: Any) -> dict[str, int]:
    """The token counts the backend reported, and only those: a missing
    count is left out, never sent as zero."""
    if not isinstance(usage, Mapping):
        return {}
    counts: dict[str, Any] = {key: usage.get(key) for key in ("prompt_tokens", "completion_tokens")}
    details = usage.get("completion_tokens_details")
    if isinstance(details, Mapping):
        counts["reasoning_tokens"] = details.get("reasoning_tokens")
    return {key: value for key, value in counts.items() if _is_count(value)}


def _is_count(value: Any) -> bool:
    return (
        isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_REPORTED_TOKENS
    )


def _text_of(content: Any) -> str:
    """A message content as text (some backends answer a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return ""


def _tool_call(call: Any) -> dict[str, Any] | None:
    """A backend's call as submitted: its own id, type function, the arguments
    as a JSON string. A call without a function name is dropped."""
    if not isinstance(call, Mapping):
        return None
    function = call.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        return None
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {})
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"call_{secrets.token_hex(8)}"  # the backend minted none
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def chat_reply_fields(message: Mapping[str, Any], native: Any, usage: Any) -> dict[str, Any]:
    """The structured submit's reply fields (message, finish_reason,
    native_finish_reason, token counts) of a backend's assistant message."""
    think, content = split_reasoning(_text_of(message.get("content")))
    separate = message.get("reasoning_content") or message.get("reasoning")
    reasoning = (separate if isinstance(separate, str) else "") + think
    calls = [c for c in map(_tool_call, message.get("tool_calls") or ()) if c is not None]
    reply: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        reply["tool_calls"] = calls
        if not content:
            reply["content"] = None  # the model only called tools
    if reasoning:
        reply["reasoning_content"] = reasoning
    fields: dict[str, Any] = {"message": reply, "finish_reason": finish_reason(native, bool(calls))}
    assert fields["finish_reason"] in FINISH_REASONS
    if isinstance(native, str) and native:
        fields["native_finish_reason"] = native[:MAX_NATIVE_FINISH_REASON]
    fields.update(reported_counts(usage))
    return fields


@dataclasses.dataclass
class StreamedChat:
    """A chat answer streamed as OpenAI chunks, accumulated."""

    content: str = ""  # the raw content, think block included
    reasoning: str = ""  # reasoning the backend streamed apart (reasoning_content)
    calls: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    native_finish: str | None = None
    usage: dict[str, Any] | None = None
    finished: bool = False  # a finish_reason arrived

    def feed(self, chunk: Mapping[str, Any]) -> None:
        """Add one chunk (a decoded ``data:`` line)."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                self._feed_delta(delta)
            if choice.get("finish_reason") is not None:
                self.native_finish = str(choice["finish_reason"])
                self.finished = True

    def _feed_delta(self, delta: Mapping[str, Any]) -> None:
        self.content += _text_of(delta.get("content"))
        separate = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(separate, str):
            self.reasoning += separate
        for part in delta.get("tool_calls") or ():
            if isinstance(part, Mapping):
                self._feed_call(part)

    def _feed_call(self, part: Mapping[str, Any]) -> None:
        index = part.get("index", len(self.calls))
        call = self.calls.setdefault(
            index if isinstance(index, int) else len(self.calls),
            {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if part.get("id"):
            call["id"] = part["id"]
        function = part.get("function")
        if isinstance(function, Mapping):
            call["function"]["name"] += function.get("name") or ""
            arguments = function.get("arguments") or ""
            call["function"]["arguments"] += (
                arguments if isinstance(arguments, str) else json.dumps(arguments)
            )

    def visible(self) -> tuple[str, str]:
        """``(reasoning, content)`` that may be posted now: each later answer
        extends it (a tag still being generated is held back)."""
        think, content = split_reasoning(self.content, final=False)
        return self.reasoning + think, content

    def message(self) -> dict[str, Any]:
        """The whole answer as a non-streamed assistant message."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return message

    def reply_fields(self) -> dict[str, Any]:
        """The structured submit's reply fields of the whole answer."""
        return chat_reply_fields(self.message(), self.native_finish, self.usage)
