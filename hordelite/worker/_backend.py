"""The worker's one interface to its backend, an OpenAI-compatible server.

Routes used, and where each comes from:

- every backend: ``GET /v1/models`` (the model id; also the health check),
  ``POST /v1/chat/completions`` (chat jobs, streamed with ``stream: true``
  for jobs that stream progress), ``POST /v1/completions`` (text jobs);
- llama.cpp's server: ``GET /props`` (``default_generation_settings.n_ctx``,
  the context of one slot; ``total_slots``; ``modalities.vision``, whether
  a multimodal projector is loaded), ``POST /apply-template`` (the
  prompt a chat body renders to) and ``POST /tokenize`` (its tokens; also a
  text prompt's, to trim one over the context: hordelite/worker/_trim.py);
- koboldcpp: ``GET /api/extra/version`` (``{"result": "KoboldCpp"}``),
  ``GET /api/extra/true_max_context_length`` (``{"value": n}``),
  ``POST /api/extra/tokencount`` (``{"value": n}`` for ``{"prompt": text}``);
- vLLM: ``max_model_len`` on each model of ``/v1/models``, and ``POST
  /tokenize`` with ``messages`` (the chat template applied: ``{"count"}``)
  or with a text ``prompt`` (``{"tokens"}``, to trim one over the context);
- Ollama: ``GET /api/version``, ``POST /api/show`` (``parameters`` may set
  ``num_ctx``; ``capabilities`` lists ``vision`` for a model that reads images) and ``GET /api/ps`` (``context_length`` of a loaded model).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from hordelite.errors import HordeliteError
from hordelite.worker._client import Reply, Stream, TransportError, open_client

log = logging.getLogger("hordelite.worker")

# Seconds a health check or a discovery request may take.
_QUICK = 10.0
# Ollama's smallest default context (older releases; newer ones pick 4096 or
# more from the GPU's memory): what an Ollama worker declares when neither
# the model nor a loaded runner says more.
OLLAMA_FALLBACK_CONTEXT = 2048
_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)", re.MULTILINE)


class BackendError(HordeliteError):
    """The backend failed. ``down`` when it did not answer (a connection
    error, a timeout, a 5xx or a cut stream); ``status`` and ``code`` (the
    OpenAI error code) when it refused the request."""

    def __init__(
        self, message: str, *, down: bool, status: int | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.down = down
        self.status = status
        self.code = code


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """What discovery learned: the backend's kind, model and context, and
    whether it reads images (only where the backend says so)."""

    kind: str  # llamacpp, koboldcpp, vllm, ollama or openai (anything else)
    model: str  # the backend's model id, sent as "model"
    context: int | None  # tokens, None when the backend does not say
    context_source: str  # the route it came from
    slots: int | None = None  # llama.cpp's parallel slots
    vision: bool = False  # llama.cpp's modalities.vision, Ollama's "vision" capability


class Backend:
    """An OpenAI-compatible backend at ``url``. Every method raises
    BackendError for a failure; cancellation closes the request (a backend
    stops generating when its client goes away)."""

    def __init__(self, url: str, request_timeout: float) -> None:
        self.url = url.rstrip("/")
        self.client = open_client(self.url, {}, request_timeout, _QUICK)

    async def aclose(self) -> None:
        await self.client.aclose()

    # Plain requests -----------------------------------------------------------

    async def post_json(self, path: str, body: Any, *, quick: bool = False) -> Any:
        """The decoded answer of a POST; BackendError for anything but a 2xx JSON."""
        try:
            response = await self.client.request(
                "POST", path, body, within=_QUICK if quick else None
            )
        except TransportError as exc:
            raise BackendError(f"POST {path}: {exc!r}", down=True) from exc
        return self._decoded(response)

    async def get_json(self, path: str) -> Any:
        try:
            response = await self.client.request("GET", path, within=_QUICK)
        except TransportError as exc:
            raise BackendError(f"GET {path}: {exc!r}", down=True) from exc
        return self._decoded(response)

    async def optional_json(self, path: str, body: Any = None) -> Any:
        """The answer of a route this backend may not have; None when it
        answers anything but 2xx JSON."""
        try:
            if body is None:
                return await self.get_json(path)
            return await self.post_json(path, body, quick=True)
        except BackendError as exc:
            if exc.down and exc.status is None:
                raise  # not answering at all: not a missing route
            return None

    def _decoded(self, response: Reply) -> Any:
        if not response.is_success:
            raise _refusal(response)
        try:
            return response.json()
        except ValueError:
            raise BackendError(
                f"{response.method} {response.path}: not JSON",
                down=False,
                status=response.status_code,
            ) from None

    async def healthy(self) -> bool:
        """The backend answers ``/v1/models`` with a 2xx."""
        try:
            response = await self.client.request("GET", "/v1/models", within=_QUICK)
        except TransportError:
            return False
        return response.is_success

    # Generation ---------------------------------------------------------------

    async def chat(self, body: Mapping[str, Any]) -> Any:
        return await self.post_json("/v1/chat/completions", body)

    async def complete(self, body: Mapping[str, Any]) -> Any:
        return await self.post_json("/v1/completions", body)

    async def stream_chat(
        self, body: Mapping[str, Any], on_chunk: Callable[[dict[str, Any]], None]
    ) -> bool:
        """Stream a chat completion, calling ``on_chunk`` with each decoded
        chunk; returns whether the stream ended with ``[DONE]``. Cancelling
        closes the stream."""
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        try:
            async with self.client.stream("POST", "/v1/chat/completions", streamed) as response:
                if not response.is_success:
                    raise _refusal(await response.aread())
                return await _read_events(response, on_chunk)
        except TransportError as exc:
            raise BackendError(f"the stream broke: {exc!r}", down=True) from exc

    # Discovery ----------------------------------------------------------------

    async def discover(self, wanted_model: str = "") -> BackendInfo:
        """The kind, model and context of the backend (see the module docstring).

        The model is ``wanted_model`` when ``/v1/models`` lists it, else the
        first listed. Raises BackendError when ``/v1/models`` lists none.
        """
        listing = await self.get_json("/v1/models")
        entries = [
            m
            for m in (listing.get("data") if isinstance(listing, Mapping) else None) or ()
            if isinstance(m, Mapping) and isinstance(m.get("id"), str)
        ]
        if not entries:
            raise BackendError("/v1/models lists no model", down=False)
        chosen = next((m for m in entries if m["id"] == wanted_model), entries[0])
        if len(entries) > 1 and chosen["id"] != wanted_model:
            log.warning(
                "the backend lists %d models; serving the first, %r (pick one with --model-id)",
                len(entries),
                chosen["id"],
            )
        return await self._kind_and_context(chosen)

    async def _kind_and_context(self, model: Mapping[str, Any]) -> BackendInfo:
        name = model["id"]
        version = await self.optional_json("/api/extra/version")
        if isinstance(version, Mapping) and version.get("result") == "KoboldCpp":
            found = await self.optional_json("/api/extra/true_max_context_length")
            value = found.get("value") if isinstance(found, Mapping) else None
            return BackendInfo(
                "koboldcpp", name, _positive(value), "/api/extra/true_max_context_length"
            )
        props = await self.optional_json("/props")
        if isinstance(props, Mapping) and (
            "default_generation_settings" in props or "n_ctx" in props
        ):
            settings = props.get("default_generation_settings")
            n_ctx = settings.get("n_ctx") if isinstance(settings, Mapping) else None
            slots = _positive(props.get("total_slots"))
            context = _positive(n_ctx) or _positive(props.get("n_ctx"))
            # Older servers have no modalities: no vision, as without a projector.
            modalities = props.get("modalities")
            vision = isinstance(modalities, Mapping) and modalities.get("vision") is True
            return BackendInfo("llamacpp", name, context, "/props n_ctx", slots, vision)
        if "max_model_len" in model:
            context = _positive(model.get("max_model_len"))
            return BackendInfo("vllm", name, context, "/v1/models max_model_len")
        ollama = await self.optional_json("/api/version")
        if isinstance(ollama, Mapping) and "version" in ollama:
            return await self._ollama(name)
        return BackendInfo("openai", name, None, "no context route")

    async def _ollama(self, name: str) -> BackendInfo:
        shown = await self.optional_json("/api/show", {"model": name})
        parameters = shown.get("parameters") if isinstance(shown, Mapping) else None
        capabilities = shown.get("capabilities") if isinstance(shown, Mapping) else None
        vision = isinstance(capabilities, list) and "vision" in capabilities
        match = _NUM_CTX.search(parameters) if isinstance(parameters, str) else None
        if match:
            num_ctx = int(match.group(1))
            return BackendInfo("ollama", name, num_ctx, "/api/show num_ctx", vision=vision)
        running = await self.optional_json("/api/ps")
        for entry in (running.get("models") if isinstance(running, Mapping) else None) or ():
            if isinstance(entry, Mapping) and name in (entry.get("name"), entry.get("model")):
                context = _positive(entry.get("context_length"))
                if context:
                    source = "/api/ps context_length"
                    return BackendInfo("ollama", name, context, source, vision=vision)
        return BackendInfo(
            "ollama",
            name,
            OLLAMA_FALLBACK_CONTEXT,
            "Ollama's smallest default (not reported)",
            vision=vision,
        )


def _positive(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _refusal(response: Reply) -> BackendError:
    """A non-2xx answer as a BackendError: a 5xx means the backend is down."""
    message, code = response.text[:300], None
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, Mapping):
        message = str(error.get("message", message))[:300]
        code = error.get("code") if isinstance(error.get("code"), str) else None
        if code is None and isinstance(error.get("type"), str):
            # llama.cpp's server puts the HTTP status in "code" and the kind
            # of error in "type" (exceed_context_size_error, say).
            code = error["type"]
    elif isinstance(error, str):
        message = error[:300]
    return BackendError(
        f"{response.method} {response.path}: {response.status_code} {message}",
        down=response.status_code >= 500,
        status=response.status_code,
        code=code,
    )


async def _read_events(response: Stream, on_chunk: Callable[[dict[str, Any]], None]) -> bool:
    """Feed each ``data:`` chunk to ``on_chunk``; whether ``[DONE]`` came.

    The stream is read to its end even past ``[DONE]`` or an error chunk:
    leaving a line iterator half read leaves its generators to the garbage
    collector, which trio reports.
    """
    done = False
    error: BackendError | None = None
    async for line in response.aiter_lines():
        if done or error is not None or not line.startswith("data:"):
            continue  # past the end, or comments, event names, blank separators
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            done = True
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        if not isinstance(chunk, dict):
            continue
        if isinstance(chunk.get("error"), Mapping):
            error = BackendError(f"the stream reported: {chunk['error']}", down=False)
            continue
        on_chunk(chunk)
    if error is not None:
        raise error
    return done


# Counters -----------------------------------------------------------------------


class Counter(Protocol):
    """Counts a chat body's prompt tokens for the fit check."""

    @property
    def name(self) -> str: ...

    async def count(self, body: Mapping[str, Any]) -> int: ...


def _template_input(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the template renders: the conversation and the tool definitions."""
    keys = ("messages", "tools", "tool_choice", "parallel_tool_calls", "response_format")
    return {k: body[k] for k in keys if k in body}


class LlamaCppCounter:
    """llama.cpp's server: the prompt ``/apply-template`` renders, tokenized
    by ``/tokenize`` with the special tokens (BOS) its generation adds."""

    name = "llama.cpp /apply-template + /tokenize"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def count(self, body: Mapping[str, Any]) -> int:
        rendered = await self.backend.post_json("/apply-template", _template_input(body))
        prompt = rendered.get("prompt") if isinstance(rendered, Mapping) else None
        if not isinstance(prompt, str):
            raise BackendError("/apply-template answered no prompt", down=False)
        tokens = await self.backend.post_json(
            "/tokenize", {"content": prompt, "add_special": True, "parse_special": True}
        )
        ids = tokens.get("tokens") if isinstance(tokens, Mapping) else None
        if not isinstance(ids, list):
            raise BackendError("/tokenize answered no tokens", down=False)
        return len(ids)


class VllmCounter:
    """vLLM: ``/tokenize`` of the messages, its chat template applied."""

    name = "vLLM /tokenize (messages)"

    def __init__(self, backend: Backend, model: str) -> None:
        self.backend = backend
        self.model = model

    async def count(self, body: Mapping[str, Any]) -> int:
        request = {"model": self.model, "add_generation_prompt": True, **_template_input(body)}
        request.pop("response_format", None)
        answer = await self.backend.post_json("/tokenize", request)
        count = answer.get("count") if isinstance(answer, Mapping) else None
        if not isinstance(count, int):
            raise BackendError("/tokenize answered no count", down=False)
        return count


class KoboldCounter:
    """koboldcpp: the tokens of the JSON of the messages, tools and response
    format (the keys standing in for the role markup), plus 32, 16 a
    message and 512 an image, as koboldcpp's own worker counts."""

    name = "koboldcpp /api/extra/tokencount"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    async def count(self, body: Mapping[str, Any]) -> int:
        text = json.dumps(_template_input(body), ensure_ascii=False)
        answer = await self.backend.post_json("/api/extra/tokencount", {"prompt": text})
        value = answer.get("value") if isinstance(answer, Mapping) else None
        if not isinstance(value, int):
            raise BackendError("/api/extra/tokencount answered no value", down=False)
        messages = body.get("messages") or []
        return value + 32 + 16 * len(messages) + 512 * _images(messages)


def _images(messages: Any) -> int:
    return sum(
        1
        for m in messages
        if isinstance(m, Mapping) and isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, Mapping) and p.get("type") == "image_url"
    )


class ByteBound:
    """An upper bound without a tokenizer: a token is at least one UTF-8
    byte, so the byte length of the messages' JSON (the keys standing in for
    the role markup), with the tools and the response format, bounds their
    tokens; ``overhead`` covers the template's fixed part (BOS, injected
    system prompt, generation prompt), measured on the start probe."""

    def __init__(self, overhead: int) -> None:
        self.overhead = overhead
        self.name = f"byte-length bound + {overhead} tokens of template overhead"

    async def count(self, body: Mapping[str, Any]) -> int:
        return byte_bound(body) + self.overhead


def byte_bound(body: Mapping[str, Any]) -> int:
    """The UTF-8 bytes of the JSON of a chat body's messages, tools and response format."""
    return sum(
        len(json.dumps(body[key], ensure_ascii=False).encode())
        for key in ("messages", "tools", "response_format")
        if body.get(key) is not None
    )


# The cheap bound ------------------------------------------------------------------

# Tokens added to the measured fixed part of the template: a tokenizer's one
# added prefix token (SentencePiece's leading space), a template trimming or
# adding whitespace around a text, rounding.
BOUND_MARGIN = 8
# Tokens added to the measured cost of each message: the probe's one-letter
# text may merge into the markup around it, and the cost measured is the
# mean of a user and an assistant message.
BOUND_MESSAGE_MARGIN = 2
# Roles whose markup the probes measure; a message of another role (tool),
# with tool calls or a key the probes did not show, is counted exactly.
_BOUND_ROLES = frozenset({"system", "user", "assistant"})
_BOUND_KEYS = frozenset({"role", "content", "name"})
_USER = {"role": "user", "content": "x"}
_ASSISTANT = {"role": "assistant", "content": "x"}
_SYSTEM = {"role": "system", "content": "x"}
# A conversation the measured bound is checked against before it is used:
# every role, multibyte text (two-, three- and four-byte characters).
BOUND_CHECK: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "Réponds brièvement. 日本語も話せます。"},
    {"role": "user", "content": "¿Qué tal? 🙂 Ein Satz mit Umlauten: äöü ß."},
    {"role": "assistant", "content": "Très bien — merci ! 色々ありがとう。"},
    {"role": "user", "content": "Und jetzt? 🚀🚀"},
)


@dataclasses.dataclass(frozen=True)
class TemplateBound:
    """An upper bound on a plain conversation's prompt tokens, with no
    backend call: the UTF-8 bytes of its JSON (:func:`byte_bound`) plus
    ``fixed`` tokens a conversation and ``per_message`` tokens a message,
    both measured once with the exact counter (:func:`measure_bound`).

    Why it bounds the exact count: the rendered prompt is the template's
    fixed part (BOS, a default system prompt, the generation prompt), then
    each message's markup around its text. (1) Every token the tokenizer
    makes of a message's text covers at least one of its UTF-8 bytes: true
    of byte-level BPE, of SentencePiece with byte fallback (an unknown
    character becomes one token a byte), and of a vocabulary that maps an
    unknown character to one token; a token spanning text and markup covers
    a byte of the text too; the one prefix token a tokenizer may add is in
    ``BOUND_MARGIN``. The JSON holds every byte of the text (escapes only
    lengthen it). (2) A message's markup depends on its role, not its text,
    so the probes measure it: the cost of a message above its JSON bytes,
    ``per_message``, from a one-message and a three-message conversation
    (user/assistant/user) and from a system message added; the fixed part
    above the JSON, ``fixed``, from the one-message conversation less that
    message's cost. A conversation of ``n`` messages therefore counts at
    most ``bytes(JSON) + fixed + n * per_message``. Where (2) cannot hold
    (tools, whose preamble the probes do not show; images, counted per
    image; tool calls; tool messages; keys the probes did not show) the
    bound answers None and the exact counter counts. The bound is checked
    against the exact count of :data:`BOUND_CHECK` before it is used; it
    cannot catch every case of what the argument assumes away (a tokenizer
    normalising text into more bytes, NFKC say; a template adding text that
    depends on a message's content). Decision 0045.
    """

    fixed: int
    per_message: int

    @property
    def name(self) -> str:
        return f"the byte-length bound (+ {self.fixed} tokens, + {self.per_message} a message)"

    def tokens(self, body: Mapping[str, Any]) -> int | None:
        """The bound for ``body``, None when it has tools, images or tool
        calls (a conversation only the exact counter can count)."""
        messages = body.get("messages")
        if body.get("tools") or not isinstance(messages, list) or not messages:
            return None
        if not all(_plain(m) for m in messages):
            return None
        return byte_bound(body) + self.fixed + self.per_message * len(messages)


def _plain(message: Any) -> bool:
    """A message of measured role and keys whose content is text only."""
    if not isinstance(message, Mapping) or message.get("role") not in _BOUND_ROLES:
        return False
    if not _BOUND_KEYS.issuperset(message):
        return False
    content = message.get("content")
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    )


async def measure_bound(counter: Counter) -> TemplateBound | None:
    """The template's overheads measured with ``counter`` (see
    :class:`TemplateBound`), with margins; None when the bound falls short
    of the exact count of :data:`BOUND_CHECK`. Raises BackendError when the
    counter fails."""

    async def excess(messages: tuple[dict[str, str], ...]) -> int:
        body = {"messages": list(messages)}
        return await counter.count(body) - byte_bound(body)

    one = await excess((_USER,))
    three = await excess((_USER, _ASSISTANT, _USER))
    system = await excess((_SYSTEM, _USER))
    # The mean cost above its JSON of a user and an assistant message (the
    # separator between messages included), and of a system message (a
    # template dropping its default system prompt for it makes it negative).
    turn = -(-(three - one) // 2)
    per_message = max(turn, system - one, 0) + BOUND_MESSAGE_MARGIN
    fixed = max(one - turn, 0) + BOUND_MARGIN
    bound = TemplateBound(fixed, per_message)
    check = {"messages": list(BOUND_CHECK)}
    counted = await counter.count(check)
    measured = bound.tokens(check)
    if measured is None or measured < counted:
        log.warning(
            "%s counts %s tokens for a check conversation the "
            "backend counts %d: counting every conversation exactly",
            bound.name,
            measured,
            counted,
        )
        return None
    return bound


def exact_counter(backend: Backend, info: BackendInfo) -> Counter | None:
    """The backend's own counter, where it has one."""
    if info.kind == "llamacpp":
        return LlamaCppCounter(backend)
    if info.kind == "koboldcpp":
        return KoboldCounter(backend)
    if info.kind == "vllm":
        return VllmCounter(backend, info.model)
    return None
