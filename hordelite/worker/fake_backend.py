"""A fake OpenAI-compatible LLM backend: deterministic, no model, no randomness.

    async with open_fake_backend(FakeBackendConfig(reasoning="hmm")) as backend:
        ...  # point a worker at backend.url; flip backend.config.fail; read backend.requests

It serves the routes a worker uses on llama.cpp's server (and the
``max_model_len`` vLLM puts in ``/v1/models``), in the caller's event loop
(trio or asyncio), on 127.0.0.1 with an ephemeral port.

It lives outside ``hordelite.testing`` (which re-exports it) because the
worker's ``--backend fake`` serves it: the worker imports nothing of the
server. Its logger and app keep the name ``hordelite.worker.fake_backend``.

The tokenizer and the template
------------------------------
The fake tokenizer counts ``ceil(utf8_bytes / 4)`` tokens for any text
(:func:`count_tokens`). The fake chat template (:func:`render_prompt`, served
by ``POST /apply-template``) renders a conversation as

* a fixed header of exactly ``4 * template_overhead`` ASCII bytes, standing
  for the BOS token and the generation prompt (``template_overhead`` tokens);
* when the request has ``tools``, a tool preamble ``<|tools|>{tools JSON}<|end|>\\n``;
* per message ``<|{role}|>\\n{text}{<tool_call>{function JSON}</tool_call>...}<|end|>\\n``,
  where the text of a list content joins its text parts and renders each
  image part as ``<image>``.

The arithmetic a worker's fit check is tested against:

* ``usage.prompt_tokens`` of a chat = ``count_tokens(render_prompt(...))``
  = ``template_overhead + ceil(bytes(tool preamble + messages) / 4)``;
  of a text completion = ``count_tokens(prompt)`` (no template).
* ``POST /tokenize`` of a text answers ``max(0, count_tokens(text) - undercount)``
  tokens: the ids of its 4-byte pieces (each piece's bytes as a little-endian
  number), no BOS. ``POST /detokenize`` joins the pieces of ``tokens`` again
  (a NUL byte ending a piece is lost). ``/v1/completions`` takes a prompt of
  token ids too, as llama.cpp's server does: ``prompt_tokens`` is their
  number, the text echoed their pieces (invalid UTF-8 replaced). An exact counter (``/apply-template`` then ``/tokenize``) therefore
  matches ``usage.prompt_tokens`` when ``undercount == 0`` and is short by
  ``undercount`` otherwise.
* The byte-length bound: each message renders (markup included) to about
  as many bytes as its JSON, and the fake counts four bytes a token, so the
  byte length of the messages' JSON bounds the message part of
  ``prompt_tokens``; the fixed part, ``template_overhead`` tokens, is not
  bounded by it. A probe conversation's ``prompt_tokens`` includes it, so a
  worker adding the probe-measured overhead to the bound is never short.
  The probe has no tools; the fake's tool preamble is the tools' JSON plus
  17 bytes of markup, so a bound that counts the tools' JSON bytes covers
  it too (a real template's preamble adds instructions on top, which is
  what ``--template-overhead`` is for).
  Since the fake counts four bytes per token, the bound without the overhead
  falls short only when ``template_overhead`` is large against the
  conversation (a test sets it to, say, 1000).

The reply
---------
The reply is a sequence of tokens, each streamed as one chunk:

* with ``reasoning`` set (chat only), ``<think>``, the reasoning's words and
  ``</think>``;
* then the answer's words (``re.findall(r"\\s*\\S+")``, each with the
  whitespace before it): ``echo: <last user text>`` (a text completion echoes
  its prompt), or, under ``response_format``, a JSON instance of the schema
  (:func:`minimal_instance`; ``{}`` for ``json_object``).

The reply is cut at ``max_tokens`` (or ``max_completion_tokens``) tokens, with
``finish_reason`` ``"length"``, else ``"stop"``; ``completion_tokens`` is the
number of tokens sent. Tool calls: when the request has ``tools``, its
``tool_choice`` is not ``"none"`` and either names a function, is
``"required"`` (the first tool unless one is mentioned) or the last user text
says ``call <name>`` for an offered tool (each mentioned tool, in order; the
first only under ``parallel_tool_calls: false``) and no tool message follows
it (once the calls' results are in, the reply is text, so that an agent's
loop of call and result ends), the reply is those calls
with ids ``call_1``, ``call_2``, ... (counted over the backend's life),
arguments built from each tool's ``parameters`` schema (``{}`` without
required properties), ``finish_reason`` ``"tool_calls"`` and content null (or
just the reasoning block); each call counts ``count_tokens(name) +
count_tokens(arguments)`` completion tokens, and ``max_tokens`` does not cut
calls. A request whose ``prompt_tokens`` plus ``max_tokens`` exceed
``context`` is refused with 400 ``context_length_exceeded``, as vLLM does
(or, with ``overflow_error="llamacpp"``, as llama.cpp's server does: the
error's ``type`` ``exceed_context_size_error``, its ``code`` 400).
Sampling fields (``temperature``, ``stop``, ``seed``...) change nothing; they
are recorded in :attr:`FakeBackend.requests` as sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import anyio
import anyio.abc
from quart import Quart, Response, request

from hordelite.config import ServerConfig
from hordelite.errors import HordeliteError
from hordelite.http.loop import current_backend, quart_app
from hordelite.http.server import serve_http

log = logging.getLogger("hordelite.worker.fake_backend")

JSON = dict[str, Any]

# Seconds a stopping fake gives open requests (a stream in flight) before
# cancelling them: short, a test's exit should not wait on a slow stream.
_GRACE_PERIOD = 1.0
_WORD = re.compile(r"\s*\S+")
_CALL = re.compile(r"\bcall\s+([A-Za-z0-9_-]+)")
_MAX_SCHEMA_DEPTH = 32


@dataclasses.dataclass
class FakeBackendConfig:
    """What the fake backend reports and how it answers; mutable at run time."""

    #: The model id in ``/v1/models`` and in every answer.
    model: str = "fake-model"
    #: Reported context size (``/props`` ``n_ctx``, ``/v1/models`` ``max_model_len``);
    #: a request whose prompt plus ``max_tokens`` exceed it is refused with 400.
    context: int = 4096
    #: Seconds before a non-streamed answer, and before each streamed token.
    delay: float = 0.0
    #: ``/tokenize`` reports this many tokens fewer than ``usage.prompt_tokens`` counts.
    undercount: int = 0
    #: Tokens the template's fixed part (BOS, generation prompt) adds to every chat prompt.
    template_overhead: int = 12
    #: When set, chat replies start with ``<think>{reasoning}</think>``, streamed word by word.
    reasoning: str | None = None
    #: Include ``usage`` in answers (a stream's usage: see :func:`open_fake_backend`).
    report_usage: bool = True
    #: A backend outage: every route, ``/health`` included, answers 503, and a
    #: stream in flight ends at its next token without a finish or ``[DONE]``.
    fail: bool = False
    #: Serve llama.cpp's counter routes ``/tokenize``, ``/detokenize`` and ``/apply-template``;
    #: ``False`` answers them 404, as a backend without a counter (vLLM, Ollama).
    counter: bool = True
    #: Report a loaded multimodal projector (``/props`` ``modalities.vision``,
    #: as newer llama.cpp servers do): the worker then declares ``vision``.
    vision: bool = False
    #: How a prompt over the context is refused: ``"vllm"`` (the error's
    #: ``code`` ``context_length_exceeded``) or ``"llamacpp"`` (its ``type``
    #: ``exceed_context_size_error``).
    overflow_error: str = "vllm"


def count_tokens(text: str) -> int:
    """The fake tokenizer's count: one token per started 4 bytes of UTF-8."""
    return math.ceil(len(text.encode()) / 4)


def render_prompt(
    messages: Sequence[JSON], tools: Sequence[JSON] | None = None, *, template_overhead: int = 12
) -> str:
    """The fake chat template's rendering (what ``/apply-template`` answers).

    Raises ``ValueError`` for a message that is not an object with a role,
    or ``tools`` that are not an array.
    """
    if not isinstance(messages, list | tuple):
        raise ValueError("messages must be an array")
    if tools is not None and not isinstance(tools, list | tuple):
        raise ValueError("tools must be an array")
    header = ("<bos>" + "~" * 4 * template_overhead)[: 4 * template_overhead]
    preamble = f"<|tools|>{json.dumps(list(tools))}<|end|>\n" if tools else ""
    return header + preamble + "".join(_render_message(m) for m in messages)


def _render_message(message: Any) -> str:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ValueError("each message is an object with a role")
    calls = "".join(
        f"<tool_call>{json.dumps(call.get('function'), ensure_ascii=False)}</tool_call>"
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict)
    )
    return f"<|{message['role']}|>\n{message_text(message.get('content'))}{calls}<|end|>\n"


def message_text(content: Any) -> str:
    """A message content's text: a string as is, text parts joined, images as ``<image>``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(_part_text(part) for part in content)


def _part_text(part: Any) -> str:
    if not isinstance(part, dict):
        return ""
    if part.get("type") == "text":
        return str(part.get("text", ""))
    return "<image>" if part.get("type") == "image_url" else ""


def minimal_instance(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """A small JSON value valid against ``schema`` for the shapes tools and
    response formats use: objects with their required properties, strings
    ``"x"``, numbers 0 (moved into ``minimum``/``maximum``), booleans true,
    arrays of ``minItems`` items, the first ``enum`` value, ``const``, the
    first branch of ``anyOf``/``oneOf``/``allOf``, local ``$ref``.

    Raises ``ValueError`` on a ``$ref`` it cannot resolve or a schema nested
    (or recursing) deeper than 32 levels.
    """
    root = schema if root is None else root
    if depth > _MAX_SCHEMA_DEPTH:
        raise ValueError("the schema nests too deep")
    if not isinstance(schema, dict):
        return "x"  # true, or a schema without constraints
    if "$ref" in schema:
        return minimal_instance(_resolve(root, schema["$ref"]), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return minimal_instance(schema[key][0], root, depth + 1)
    return _instance_of_type(schema, _schema_type(schema), root, depth)


def _schema_type(schema: JSON) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return str(kinds[0]) if kinds else "null"
    if isinstance(kind, str):
        return kind
    return "object" if "properties" in schema or "required" in schema else "string"


def _instance_of_type(schema: JSON, kind: str, root: Any, depth: int) -> Any:
    if kind == "object":
        properties = schema.get("properties") or {}
        return {
            name: minimal_instance(properties.get(name, {}), root, depth + 1)
            for name in schema.get("required") or ()
        }
    if kind == "array":
        count = int(schema.get("minItems", 0))
        return [minimal_instance(schema.get("items", {}), root, depth + 1) for _ in range(count)]
    if kind == "string":
        length = max(int(schema.get("minLength", 0)), 1)
        return "x" * min(length, int(schema.get("maxLength", length)))
    if kind in ("integer", "number"):
        return _number(schema)
    return True if kind == "boolean" else None


def _number(schema: JSON) -> int | float:
    value: int | float = 0
    if "minimum" in schema:
        value = max(value, schema["minimum"])
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        value = math.floor(schema["exclusiveMinimum"]) + 1
    if "maximum" in schema:
        value = min(value, schema["maximum"])
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        value = math.ceil(schema["exclusiveMaximum"]) - 1
    return value


def _resolve(root: Any, ref: Any) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise ValueError(f"cannot resolve $ref {ref!r}")
    node = root
    for key in filter(None, ref[1:].split("/")):
        if not isinstance(node, dict) or key not in node:
            raise ValueError(f"cannot resolve $ref {ref!r}")
        node = node[key]
    return node


# The reply, as pure functions of the request body and the configuration.


@dataclasses.dataclass(frozen=True)
class _Reply:
    tokens: list[str]  # the content, token by token
    tool_calls: list[JSON]
    finish_reason: str
    completion_tokens: int

    @property
    def content(self) -> str | None:
        return "".join(self.tokens) if self.tokens or not self.tool_calls else None


class _BadRequest(HordeliteError):
    def __init__(
        self,
        message: str,
        *,
        code: str | int | None = None,
        param: str | None = None,
        kind: str | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.param = param
        self.kind = kind


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def _max_tokens(body: JSON) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _BadRequest("max_tokens must be a non-negative integer", param="max_tokens")
    return value


def _cut(tokens: list[str], limit: int | None) -> tuple[list[str], str]:
    if limit is not None and len(tokens) > limit:
        return tokens[:limit], "length"
    return tokens, "stop"


def _last_user_text(messages: Sequence[JSON]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message.get("content"))
    return ""


def _answered(messages: Sequence[JSON]) -> bool:
    """Whether a tool message follows the last user message: the calls its
    text asked for were made, and asking again would loop forever."""
    for message in reversed(messages):
        if message.get("role") == "tool":
            return True
        if message.get("role") == "user":
            return False
    return False


def _answer_text(body: JSON) -> str:
    response_format = body.get("response_format")
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_object":
        return "{}"
    if kind == "json_schema":
        spec = response_format.get("json_schema") if isinstance(response_format, dict) else None
        schema = spec.get("schema", {}) if isinstance(spec, dict) else {}
        try:
            return json.dumps(minimal_instance(schema))
        except ValueError as exc:
            raise _BadRequest(str(exc), param="response_format") from None
    return f"echo: {_last_user_text(body['messages'])}"


def _offered_tools(body: JSON) -> dict[str, JSON]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise _BadRequest("tools must be an array", param="tools")
    functions = (t.get("function") for t in tools if isinstance(t, dict))
    return {f["name"]: f for f in functions if isinstance(f, dict) and "name" in f}


def _called_functions(body: JSON) -> list[JSON]:
    """The functions the reply calls: see the module docstring."""
    tools = _offered_tools(body)
    choice = body.get("tool_choice", "auto")
    if not tools or choice == "none":
        return []
    if isinstance(choice, dict):
        name = str((choice.get("function") or {}).get("name"))
        return [tools.get(name, {"name": name})]
    messages = body["messages"]
    named = [] if _answered(messages) else _CALL.findall(_last_user_text(messages))
    called = [tools[n] for n in dict.fromkeys(named) if n in tools]
    if not called and choice == "required":
        called = [next(iter(tools.values()))]
    return called[:1] if body.get("parallel_tool_calls") is False else called


def _tool_call(function: JSON, call_id: int) -> JSON:
    try:
        instance = minimal_instance(function.get("parameters") or {"type": "object"})
    except ValueError as exc:
        raise _BadRequest(str(exc), param="tools") from None
    arguments = json.dumps(instance, separators=(",", ":")) if instance != {} else "{}"
    return {
        "id": f"call_{call_id}",
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def _chat_reply(body: JSON, config: FakeBackendConfig, call_ids: Iterator[int]) -> _Reply:
    limit = _max_tokens(body)
    thinking = ["<think>", *_words(config.reasoning), "</think>"] if config.reasoning else []
    functions = _called_functions(body)
    if functions:
        calls = [_tool_call(f, next(call_ids)) for f in functions]
        spent = sum(
            count_tokens(c["function"]["name"]) + count_tokens(c["function"]["arguments"])
            for c in calls
        )
        return _Reply(thinking, calls, "tool_calls", len(thinking) + spent)
    tokens, finish = _cut(thinking + _words(_answer_text(body)), limit)
    return _Reply(tokens, [], finish, len(tokens))


def _text_reply(body: JSON, prompt: str) -> _Reply:
    tokens, finish = _cut(_words(f"echo: {prompt}"), _max_tokens(body))
    return _Reply(tokens, [], finish, len(tokens))


def _check_fit(prompt_tokens: int, body: JSON, config: FakeBackendConfig) -> None:
    requested = prompt_tokens + (_max_tokens(body) or 0)
    if requested > config.context and config.overflow_error == "llamacpp":
        raise _BadRequest(
            f"request ({requested} tokens) exceeds the available context size "
            f"({config.context} tokens), try increasing it",
            code=400,
            kind="exceed_context_size_error",
        )
    if requested > config.context:
        raise _BadRequest(
            f"This model's maximum context length is {config.context} tokens. However, you "
            f"requested {requested} tokens ({prompt_tokens} in the messages, "
            f"{requested - prompt_tokens} in the completion).",
            code="context_length_exceeded",
        )


class FakeBackend:
    """A running fake backend.

    ``url`` is its base URL (``http://127.0.0.1:PORT``); ``config`` may be
    changed while it runs (tests flip ``fail`` and ``delay``); ``requests``
    holds every request received, in order, as ``{"path", "body"}`` with the
    decoded JSON body (``None`` for a GET), failed ones included.
    """

    url: str
    config: FakeBackendConfig
    requests: list[JSON]

    def __init__(self, config: FakeBackendConfig) -> None:
        self.url = ""
        self.config = config
        self.requests = []
        self._call_ids = itertools.count(1)
        self._reply_ids = itertools.count(1)

    def render(self, messages: Sequence[JSON], tools: Sequence[JSON] | None = None) -> str:
        """What ``/apply-template`` answers for this conversation now."""
        return render_prompt(messages, tools, template_overhead=self.config.template_overhead)

    def prompt_tokens(self, messages: Sequence[JSON], tools: Sequence[JSON] | None = None) -> int:
        """The ``usage.prompt_tokens`` a chat completion of this conversation reports now."""
        return count_tokens(self.render(messages, tools))

    def tokenize(self, text: str) -> list[int]:
        """What ``/tokenize`` answers: ids of 4-byte pieces, ``undercount`` fewer."""
        raw = text.encode()
        ids = [int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4)]
        return ids[: max(0, len(ids) - self.config.undercount)]

    @staticmethod
    def detokenize(ids: Sequence[int]) -> str:
        """What ``/detokenize`` answers: the pieces joined, invalid UTF-8 replaced."""
        return b"".join(_piece(i) for i in ids).decode(errors="replace")

    def _reply_to_chat(self, body: JSON) -> tuple[_Reply, int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("messages must be a non-empty array", param="messages")
        try:
            prompt_tokens = self.prompt_tokens(messages, body.get("tools"))
        except ValueError as exc:
            raise _BadRequest(str(exc), param="messages") from None
        _check_fit(prompt_tokens, body, self.config)
        return _chat_reply(body, self.config, self._call_ids), prompt_tokens

    def _reply_to_text(self, body: JSON) -> tuple[_Reply, int]:
        prompt: Any = body.get("prompt")
        if _token_ids(prompt):
            prompt_tokens, text = len(prompt), self.detokenize(prompt)
        elif isinstance(prompt, str):
            prompt_tokens, text = count_tokens(prompt), prompt
        else:
            raise _BadRequest("prompt must be a string or token ids", param="prompt")
        _check_fit(prompt_tokens, body, self.config)
        return _text_reply(body, text), prompt_tokens

    def _next_reply_id(self) -> int:
        return next(self._reply_ids)


def _piece(token: int) -> bytes:
    """The bytes of a fake token id (a NUL byte ending its piece is lost)."""
    if not 0 <= token < 2**32:
        raise _BadRequest(f"no such token: {token}", param="tokens")
    return token.to_bytes(4, "little").rstrip(b"\x00")


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    )


# The HTTP surface.


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json")


def _error(
    status: int,
    message: str,
    *,
    code: str | int | None = None,
    param: str | None = None,
    kind: str | None = None,
) -> Response:
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    return _json(
        {"error": {"message": message, "type": kind, "param": param, "code": code}}, status
    )


def _usage(reply: _Reply, prompt_tokens: int) -> JSON:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": prompt_tokens + reply.completion_tokens,
    }


def _sse(data: Any) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


@dataclasses.dataclass(frozen=True)
class _Shape:
    """How one endpoint's answers look: chat completions or text completions."""

    object: str
    chunk_object: str
    id_prefix: str
    choice: Callable[[_Reply], JSON]
    delta: Callable[[str], JSON]
    first: JSON | None  # the first streamed choice, before any token
    end: JSON  # the finishing streamed choice, without its finish_reason


def _chat_message(reply: _Reply) -> JSON:
    message: JSON = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return {"index": 0, "message": message, "finish_reason": reply.finish_reason}


_CHAT = _Shape(
    object="chat.completion",
    chunk_object="chat.completion.chunk",
    id_prefix="chatcmpl",
    choice=_chat_message,
    delta=lambda token: {"index": 0, "delta": {"content": token}, "finish_reason": None},
    first={"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},
    end={"index": 0, "delta": {}},
)
_TEXT = _Shape(
    object="text_completion",
    chunk_object="text_completion",
    id_prefix="cmpl",
    choice=lambda reply: {
        "index": 0,
        "text": reply.content or "",
        "logprobs": None,
        "finish_reason": reply.finish_reason,
    },
    delta=lambda token: {"index": 0, "text": token, "logprobs": None, "finish_reason": None},
    first=None,
    end={"index": 0, "text": "", "logprobs": None},
)


@dataclasses.dataclass(eq=False)
class _Exchange:
    """One completion request being answered, whole or as a stream."""

    backend: FakeBackend
    shape: _Shape
    body: JSON
    reply: _Reply
    prompt_tokens: int
    id: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.id = f"{self.shape.id_prefix}-{self.backend._next_reply_id()}"

    def envelope(self, obj: str, choices: list[JSON]) -> JSON:
        return {
            "id": self.id,
            "object": obj,
            "created": 0,
            "model": self.backend.config.model,
            "choices": choices,
        }

    async def whole(self) -> Response:
        await anyio.sleep(self.backend.config.delay)
        if self.backend.config.fail:
            return _error(503, "the backend is unavailable")
        answer = self.envelope(self.shape.object, [self.shape.choice(self.reply)])
        if self.backend.config.report_usage:
            answer["usage"] = _usage(self.reply, self.prompt_tokens)
        return _json(answer)

    def stream(self) -> Response:
        response = Response(self.events(), status=200, content_type="text/event-stream")
        response.headers["Cache-Control"] = "no-cache"
        response.timeout = None
        return response

    def chunk(self, choice: JSON) -> bytes:
        return _sse(self.envelope(self.shape.chunk_object, [choice]))

    def deltas(self) -> Iterator[JSON]:
        """The streamed choices after the first: a token, or a whole tool call, each."""
        for token in self.reply.tokens:
            yield self.shape.delta(token)
        for index, call in enumerate(self.reply.tool_calls):
            delta = {"tool_calls": [{"index": index, **call}]}
            yield {"index": 0, "delta": delta, "finish_reason": None}

    async def events(self) -> AsyncIterator[bytes]:
        if self.shape.first is not None:
            yield self.chunk(self.shape.first)
        for choice in self.deltas():
            await anyio.sleep(self.backend.config.delay)
            if self.backend.config.fail:
                return  # an outage cuts the stream short: no finish, no [DONE]
            yield self.chunk(choice)
        for piece in self.ending():
            yield piece

    def ending(self) -> Iterator[bytes]:
        """The finishing chunk, the usage and ``[DONE]``.

        Usage comes as OpenAI sends it, in a last chunk without choices,
        when the request asks with ``stream_options.include_usage``; else on
        the finishing chunk, as llama.cpp's server sends it.
        """
        finish = {**self.shape.end, "finish_reason": self.reply.finish_reason}
        usage = _usage(self.reply, self.prompt_tokens)
        options = self.body.get("stream_options")
        separate = isinstance(options, dict) and options.get("include_usage") is True
        finishing = self.envelope(self.shape.chunk_object, [finish])
        if self.backend.config.report_usage and not separate:
            finishing["usage"] = usage
        yield _sse(finishing)
        if self.backend.config.report_usage and separate:
            yield _sse({**self.envelope(self.shape.chunk_object, []), "usage": usage})
        yield b"data: [DONE]\n\n"


async def _body() -> Any:
    raw = await request.get_data(cache=True, as_text=False, parse_form_data=False)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw.decode(errors="replace")


async def _json_body() -> JSON:
    body = await _body()
    if not isinstance(body, dict):
        raise _BadRequest("the body must be a JSON object")
    return body


def create_fake_backend_app(backend: FakeBackend, loop: str = "trio") -> Quart:
    """The fake's Quart app (QuartTrio on ``loop == "trio"``) answering for ``backend``."""
    app = quart_app("hordelite.worker.fake_backend", loop)
    _add_guards(app, backend)
    _add_info_routes(app, backend)
    _add_counter_routes(app, backend)
    _add_generation_routes(app, backend)
    return app


def _add_guards(app: Quart, backend: FakeBackend) -> None:
    """Record every request, and answer as a backend that is down, one
    without the counters, or one refusing a bad body or an unknown path."""

    @app.before_request
    async def _record() -> Response | None:
        backend.requests.append({"path": request.path, "body": await _body()})
        if backend.config.fail:
            return _error(503, "the backend is unavailable")
        counters = ("/tokenize", "/detokenize", "/apply-template")
        if request.path in counters and not backend.config.counter:
            return _error(404, f"{request.path} is not served by this backend")
        return None

    @app.errorhandler(_BadRequest)
    async def _bad_request(exc: _BadRequest) -> Response:
        return _error(400, str(exc), code=exc.code, param=exc.param, kind=exc.kind)

    @app.errorhandler(404)
    async def _not_found(exc: Exception) -> Response:
        return _error(404, f"{request.path} is not served by this backend")


def _add_info_routes(app: Quart, backend: FakeBackend) -> None:
    """Health, the model and its context, as vLLM and llama.cpp tell them."""

    @app.get("/health")
    async def _health() -> Response:
        return _json({"status": "ok"})

    @app.get("/v1/models")
    async def _models() -> Response:
        model = {"id": backend.config.model, "object": "model"}
        return _json(
            {"object": "list", "data": [{**model, "max_model_len": backend.config.context}]}
        )

    @app.get("/props")
    async def _props() -> Response:
        context = backend.config.context
        modalities = {"vision": backend.config.vision, "audio": False}
        return _json(
            {
                "default_generation_settings": {"n_ctx": context},
                "n_ctx": context,
                "modalities": modalities,
            }
        )


def _add_counter_routes(app: Quart, backend: FakeBackend) -> None:
    """llama.cpp's template and token counters."""

    @app.post("/apply-template")
    async def _apply_template() -> Response:
        body = await _json_body()
        try:
            return _json({"prompt": backend.render(body.get("messages") or [], body.get("tools"))})
        except ValueError as exc:
            raise _BadRequest(str(exc), param="messages") from None

    @app.post("/tokenize")
    async def _tokenize() -> Response:
        content = (await _json_body()).get("content")
        if not isinstance(content, str):
            raise _BadRequest("content must be a string", param="content")
        return _json({"tokens": backend.tokenize(content)})

    @app.post("/detokenize")
    async def _detokenize() -> Response:
        tokens = (await _json_body()).get("tokens")
        if not isinstance(tokens, list) or not (tokens == [] or _token_ids(tokens)):
            raise _BadRequest("tokens must be an array of token ids", param="tokens")
        return _json({"content": backend.detokenize(tokens)})


def _add_generation_routes(app: Quart, backend: FakeBackend) -> None:
    """The chat and text completions, whole or streamed."""

    @app.post("/v1/chat/completions")
    async def _chat() -> Response:
        body = await _json_body()
        return await _answer(backend, _CHAT, body, *backend._reply_to_chat(body))

    @app.post("/v1/completions")
    async def _completions() -> Response:
        body = await _json_body()
        return await _answer(backend, _TEXT, body, *backend._reply_to_text(body))


async def _answer(
    backend: FakeBackend, shape: _Shape, body: JSON, reply: _Reply, prompt_tokens: int
) -> Response:
    exchange = _Exchange(backend, shape, body, reply, prompt_tokens)
    return exchange.stream() if body.get("stream") is True else await exchange.whole()


async def _serve_until(
    app: Quart,
    shutdown: anyio.Event,
    stopped: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    server = ServerConfig(host="127.0.0.1", port=0, grace_period=_GRACE_PERIOD)
    try:
        await serve_http(app, server, shutdown, task_status=task_status)
    finally:
        stopped.set()


@contextlib.asynccontextmanager
async def open_fake_backend(config: FakeBackendConfig | None = None) -> AsyncIterator[FakeBackend]:
    """Run a fake backend in the caller's event loop until the block exits.

    Yields the running :class:`FakeBackend` once it listens. On exit it stops
    accepting, gives open requests (a stream in flight) one second, then
    cancels them; an exception from the block propagates as itself, not in
    an exception group. Works under pytest's anyio plugin and under a CLI's
    ``anyio.run`` on either backend.
    """
    backend = FakeBackend(config or FakeBackendConfig())
    app = create_fake_backend_app(backend, current_backend())
    shutdown = anyio.Event()
    stopped = anyio.Event()
    error: Exception | None = None
    async with anyio.create_task_group() as tg:
        backend.url = await tg.start(_serve_until, app, shutdown, stopped)
        try:
            yield backend
        except Exception as exc:
            # Re-raised outside the task group, so the caller gets its own
            # exception rather than a group around it.
            error = exc
        finally:
            shutdown.set()
            with anyio.move_on_after(_GRACE_PERIOD + 1, shield=True):
                await stopped.wait()
            tg.cancel_scope.cancel()
    if error is not None:
        raise error
