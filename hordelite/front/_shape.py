"""OpenAI response shapes built from a request's status: a chat completion
and a legacy text completion, and the chunks of a stream served from a
finished reply."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

from hordelite.contract.chat_reply import ChatReply
from hordelite.contract.completion_request import CompletionRequest, Context
from hordelite.contract.limits import CHARS_PER_TOKEN_PRICING
from hordelite.horde.results import Generation, RequestStatus


def estimated_tokens(chars: int) -> int:
    """The tokens a count the worker did not report is estimated at: 4
    characters a token, rounded up (the pricing rule)."""
    return math.ceil(chars / CHARS_PER_TOKEN_PRICING)


def reply_of(status: RequestStatus) -> tuple[Generation, ChatReply]:
    """The finished chat job of a done status (an OpenAI call asks for one),
    with its reply."""
    generation = status.generations[0]
    assert generation.reply is not None  # a chat job is done with its verified reply
    return generation, generation.reply


def usage(reply: ChatReply, prompt_chars: int) -> tuple[dict[str, Any], bool]:
    """OpenAI's usage from the worker's counts; counts it did not report are
    estimated from the text (4 characters a token). Returns (usage, estimated)."""
    calls = reply.tool_calls or []
    reasoning = reply.reasoning_content or ""
    out_chars = len(reply.content or "") + len(reasoning)
    out_chars += sum(len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in calls)
    prompt = reply.prompt_tokens
    completion = reply.completion_tokens
    reasoning_tokens = reply.reasoning_tokens
    estimated = prompt is None or completion is None or (reasoning and reasoning_tokens is None)
    if prompt is None:
        prompt = estimated_tokens(prompt_chars)
    if completion is None:
        completion = estimated_tokens(out_chars)
    if reasoning_tokens is None:
        reasoning_tokens = estimated_tokens(len(reasoning)) if reasoning else 0
    return (
        {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        },
        bool(estimated),
    )


def _message(reply: ChatReply, include_reasoning: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    if include_reasoning and reply.reasoning_content:
        message["reasoning_content"] = reply.reasoning_content
    return message


def x_horde(request_id: str, status: RequestStatus, estimated: bool) -> dict[str, Any]:
    generation = status.generations[0]
    return {
        "request_id": request_id,
        "kudos": status.kudos,
        "charge_basis": generation.charge_basis,
        "worker": {"id": generation.worker_id, "name": generation.worker_name},
        "model": generation.model,
        "estimated_usage": estimated,
    }


def completion(
    request_id: str, status: RequestStatus, prompt_chars: int, include_reasoning: bool
) -> dict[str, Any]:
    """The non-streamed answer: ``chat.completion`` with usage and x_horde."""
    generation, reply = reply_of(status)
    used, estimated = usage(reply, prompt_chars)
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": generation.model,
        "choices": [
            {
                "index": 0,
                "message": _message(reply, include_reasoning),
                "finish_reason": reply.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": used,
        "x_horde": x_horde(request_id, status, estimated),
    }


def sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def chunk_base(request_id: str, model: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }


def _chunk(base: dict[str, Any], delta: dict[str, Any], finish: str | None, usage: bool) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    return sse({**base, "choices": [choice], **({"usage": None} if usage else {})})


def finish_chunks(
    request_id: str, status: RequestStatus, prompt_chars: int, include_usage: bool
) -> Iterator[bytes]:
    """The end of every stream: the finish chunk, the usage chunk when asked
    for, then [DONE]."""
    generation, reply = reply_of(status)
    base = chunk_base(request_id, generation.model)
    yield _chunk(base, {}, reply.finish_reason, include_usage)
    if include_usage:
        used, estimated = usage(reply, prompt_chars)
        yield sse(
            {
                **base,
                "choices": [],
                "usage": used,
                "x_horde": x_horde(request_id, status, estimated),
            }
        )
    yield DONE


class TextCompletion:
    """OpenAI's legacy completion shapes (``text_completion``) of a done
    text request: the text its worker generated (after the prompt, with
    ``echo``), usage estimated from the text (the text path reports no
    counts), and ``x_horde`` with the context it was routed with."""

    def __init__(self, request_id: str, req: CompletionRequest, context: Context) -> None:
        self.request_id = request_id
        self.req = req
        self.context = context

    def _text(self, generation: Generation) -> str:
        text = generation.text or ""
        return self.req.text.prompt + text if self.req.echo else text

    def finish_reason(self, generation: Generation) -> str:
        """``content_filter`` for a censored generation; else ``length`` when
        the text is estimated to fill ``max_tokens`` (the text path does not
        say why its worker stopped), ``stop`` otherwise."""
        if generation.state == "censored":
            return "content_filter"
        full = estimated_tokens(len(generation.text or "")) >= self.req.text.max_length
        return "length" if full else "stop"

    def usage(self, generation: Generation) -> dict[str, Any]:
        prompt = estimated_tokens(len(self.req.text.prompt))
        completion = estimated_tokens(len(generation.text or ""))
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def x_horde(self, status: RequestStatus) -> dict[str, Any]:
        return {
            **x_horde(self.request_id, status, True),
            "context_length": self.context.length,
            "prompt_may_be_trimmed": self.context.may_trim,
        }

    def _base(self, model: str) -> dict[str, Any]:
        return {
            "id": f"cmpl-{self.request_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
        }

    def completion(self, status: RequestStatus) -> dict[str, Any]:
        """The non-streamed answer."""
        generation = status.generations[0]
        choice = {
            "text": self._text(generation),
            "index": 0,
            "logprobs": None,
            "finish_reason": self.finish_reason(generation),
        }
        return {
            **self._base(generation.model),
            "choices": [choice],
            "usage": self.usage(generation),
            "x_horde": self.x_horde(status),
        }

    def chunks(self, status: RequestStatus) -> Iterator[bytes]:
        """The answer as a stream: the text, the finish, the usage when
        asked for, then [DONE]."""
        generation = status.generations[0]
        base = self._base(generation.model)
        tail = {"usage": None} if self.req.include_usage else {}

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}

        yield sse({**base, "choices": [choice(self._text(generation), None)], **tail})
        yield sse({**base, "choices": [choice("", self.finish_reason(generation))], **tail})
        if self.req.include_usage:
            usage = {"usage": self.usage(generation), "x_horde": self.x_horde(status)}
            yield sse({**base, "choices": [], **usage})
        yield DONE
