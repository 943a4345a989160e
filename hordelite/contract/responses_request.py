"""The OpenAI Responses API request (``POST /v1/responses``) as a native chat request.

Pure, no I/O (decision 0078). ``parse_responses_request(body)`` checks a
Responses body and translates it into the OpenAI chat-completions body that
``parse_chat_request`` validates, so that the call is the chat request
``/v1/chat/completions`` would queue; it keeps what the Response object
repeats (``ResponsesEcho``). Every key is honoured, a documented no-op, or
refused by name, ``param`` the Responses path (``input[3].type``,
``tools[1].type``, ``text.format.name``), never the chat body's: a refusal
of the chat contract is renamed on the way out (``ResponsesCall.chat_request``).

The mapping (docs/reference/responses_api.md has the whole table):

- ``instructions`` is the first system message. ``input`` is a string (one
  user message) or items: messages (a ``developer`` message is sent as
  system, as on the chat route), ``function_call`` items as the assistant's
  tool calls (consecutive calls, and the assistant message just before them,
  make one assistant message), ``function_call_output`` items as tool
  messages; ``reasoning`` items are accepted and not sent (the chat contract
  carries no past reasoning to a worker).
- Function tools are chat functions; a ``namespace`` tool's functions are
  flattened to ``<namespace>__<name>`` (Codex's own flat name) and split
  again in the answer. Hosted tools are refused by name, except web search
  under ``conformance: best_effort``: dropped, and listed in the answer's
  ``x_horde.dropped_tools``.
- ``text.format`` is ``response_format``, ``reasoning.effort``
  ``reasoning_effort``, ``max_output_tokens`` ``max_completion_tokens``, and
  ``truncation: "auto"`` the horde's ``context_fit: "truncate_oldest"``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from hordelite.contract._fields import kind_name, parse_uuid
from hordelite.contract.chat_request import (
    IMAGE_DETAILS,
    IMAGE_URL_PREFIXES,
    ChatRequest,
    check_top_level,
    invalid,
    parse_chat_request,
    parse_stream_options,
    unsupported,
)
from hordelite.contract.limits import (
    MAX_RESPONSE_METADATA_KEY_CHARS,
    MAX_RESPONSE_METADATA_PAIRS,
    MAX_RESPONSE_METADATA_VALUE_CHARS,
)
from hordelite.errors import HordeError

# A response's id is its horde request's, with OpenAI's prefix.
RESPONSE_ID_PREFIX = "resp_"

# Keys translated onto the chat body, or read here. The chat contract's
# no-ops (user, store, metadata, service_tier, safety_identifier,
# prompt_cache_key) pass check_top_level too; they are checked below.
_KNOWN_TOP = frozenset(
    {
        "model",
        "models",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "reasoning",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "stream_options",
        "truncation",
        "previous_response_id",
        "include",
        "horde",
        # No-ops: a prompt cache's retention (the horde has no prompt
        # cache), the bound on calls to hosted tools (none runs here), and
        # the client's own tags (Codex sends its session and turn ids).
        "prompt_cache_retention",
        "max_tool_calls",
        "client_metadata",
    }
)

# Keys accepted only at their default (or null).
_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {"background": (False,), "top_logprobs": (0,)}

# Keys refused whatever their value, with why.
_REFUSED = {
    "conversation": "Conversations are OpenAI's stored objects, which a horde does not have: "
    "send the conversation as 'input', or chain responses with 'previous_response_id'.",
    "prompt": "Stored prompt templates are OpenAI's, which a horde does not have: "
    "send the prompt as 'instructions' and 'input'.",
    "context_management": "Server-side compaction is not available on a horde: "
    "the conversation is sent to the worker as it is.",
    "prompt_cache_options": "A horde has no prompt cache to configure.",
}

# The hosted web search tool's types: refused under strict, dropped under
# best_effort (decision 0078: Codex sends one by default).
WEB_SEARCH_TOOLS = frozenset(
    {"web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11"}
)

# Includables that ask for more of items a horde never produces, or for
# what its items carry anyway: accepted, and change nothing. The reasoning
# item carries the worker's reasoning as text, never encrypted.
_INCLUDE_NO_OPS = frozenset(
    {
        "reasoning.encrypted_content",
        "message.input_image.image_url",
        "web_search_call.results",
        "web_search_call.action.sources",
        "file_search_call.results",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
    }
)

_ROLES = ("user", "assistant", "system", "developer")
_SUMMARIES = ("auto", "concise", "detailed")
_PROMPT_CACHE_RETENTIONS = ("in_memory", "24h")
_NAMESPACE_DELIMITER = "__"


def response_id(request_id: str) -> str:
    """The Response id of a horde request."""
    return RESPONSE_ID_PREFIX + request_id


def request_id_of(value: Any) -> str | None:
    """The horde request id a Response id names (``resp_<uuid>``), or None
    when ``value`` is not one."""
    if not isinstance(value, str) or not value.startswith(RESPONSE_ID_PREFIX):
        return None
    return parse_uuid(value[len(RESPONSE_ID_PREFIX) :])


def flat_name(namespace: str, name: str) -> str:
    """A namespaced function's chat name: Codex's canonical flat name (the
    namespace's trailing and the name's leading underscores trimmed, joined
    by ``__``)."""
    return namespace.rstrip("_") + _NAMESPACE_DELIMITER + name.lstrip("_")


@dataclasses.dataclass(frozen=True)
class ResponsesEcho:
    """What a Response repeats of its request, and how it names function
    calls: all the answer needs, so that a route can keep it with the
    request and build the Response again later (``to_json``/``from_json``).

    ``fields``: the Response's fields taken from the request (instructions,
    tools, tool_choice, text, reasoning, metadata...). ``namespaced``: each
    flattened chat function name and its (namespace, name).
    ``dropped_tools``: the hosted tools dropped under best_effort, each
    ``{"param": "tools[i]", "type": ...}``."""

    fields: dict[str, Any]
    namespaced: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    dropped_tools: tuple[dict[str, str], ...] = ()

    def function(self, chat_name: str) -> dict[str, str]:
        """A reply's call of ``chat_name`` as a function_call item names it:
        ``name``, plus ``namespace`` for a namespaced function."""
        if chat_name in self.namespaced:
            namespace, name = self.namespaced[chat_name]
            return {"name": name, "namespace": namespace}
        return {"name": chat_name}

    def to_json(self) -> dict[str, Any]:
        return {
            "fields": self.fields,
            "namespaced": {k: list(v) for k, v in self.namespaced.items()},
            "dropped_tools": list(self.dropped_tools),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResponsesEcho:
        return cls(
            fields=dict(data["fields"]),
            namespaced={k: (v[0], v[1]) for k, v in data["namespaced"].items()},
            dropped_tools=tuple(data["dropped_tools"]),
        )


@dataclasses.dataclass(frozen=True)
class ResponsesCall:
    """A checked Responses body.

    ``chat_body``: the chat-completions body of the call (``chat_request``
    validates it). ``message_origins`` and ``tool_origins``: the Responses
    path each chat message and tool came from, which a chat refusal is
    renamed to."""

    chat_body: dict[str, Any]
    echo: ResponsesEcho
    stream: bool
    store: bool
    previous_response_id: str | None
    message_origins: tuple[str, ...]
    tool_origins: tuple[str, ...]
    has_instructions: bool

    def chat_request(self, history: Sequence[Mapping[str, Any]] = ()) -> ChatRequest:
        """The chat request of the call; ``history`` (chat messages: the
        conversation of ``previous_response_id``, without its instructions)
        goes after this call's instructions and before its input. A refusal
        names the Responses field."""
        body, origins = self.chat_body, self.message_origins
        if history:
            at = 1 if self.has_instructions else 0
            messages = body["messages"]
            body = {**body, "messages": [*messages[:at], *history, *messages[at:]]}
            origins = (*origins[:at], *["previous_response_id"] * len(history), *origins[at:])
        try:
            return parse_chat_request(body)
        except HordeError as exc:
            raise _renamed(exc, origins, self.tool_origins) from None


def parse_responses_request(body: Any) -> ResponsesCall:
    """Check a Responses body and translate it; raises HordeError naming
    the Responses field."""
    check_top_level(body, _KNOWN_TOP, _DEFAULT_ONLY)
    for key, why in _REFUSED.items():
        if body.get(key) is not None:
            raise unsupported(key, f"Unsupported parameter: {key!r}. {why}")
    stream = _flag(body, "stream", False)
    store = _flag(body, "store", True)
    # include_obfuscation is a no-op: the events carry no obfuscation padding.
    parse_stream_options(body.get("stream_options"), stream, "include_obfuscation")
    _check_include(body.get("include"))
    tools = _Tools(best_effort=_best_effort(body))
    tools.read(body.get("tools"))
    conversation = _Conversation()
    conversation.read(body.get("instructions"), body.get("input"))
    chat: dict[str, Any] = {
        **{key: body[key] for key in ("model", "models") if key in body},
        "messages": conversation.messages,
        "stream": stream,
        **_sampling(body),
        **tools.chat_fields(body),
    }
    text_fields, text_echo = _text(body.get("text"))
    reasoning_fields, reasoning_echo = _reasoning(body.get("reasoning"))
    horde, truncation = _horde(body.get("horde"), body.get("truncation"))
    chat.update(text_fields)
    chat.update(reasoning_fields)
    if horde is not None:
        chat["horde"] = horde
    previous = _optional_str(body, "previous_response_id")
    fields = {
        **_echoed(body, chat),
        "instructions": body.get("instructions"),
        "tools": tools.echo,
        "tool_choice": _tool_choice_echo(body.get("tool_choice")),
        "text": text_echo,
        "reasoning": reasoning_echo,
        "truncation": truncation,
        "previous_response_id": previous,
        "store": store,
    }
    return ResponsesCall(
        chat_body=chat,
        echo=ResponsesEcho(fields, tools.namespaced, tuple(tools.dropped)),
        stream=stream,
        store=store,
        previous_response_id=previous,
        message_origins=tuple(conversation.origins),
        tool_origins=tuple(tools.origins),
        has_instructions=body.get("instructions") is not None,
    )


# Top-level fields --------------------------------------------------------------


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(key, f"Invalid type for '{key}': expected a boolean.")
    return value


def _optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise invalid(
            key, f"Invalid type for '{key}': expected a string, but got {kind_name(value)} instead."
        )
    return value


def _best_effort(body: Mapping[str, Any]) -> bool:
    """Whether the call asks for best_effort conformance (the chat contract
    checks the horde object itself later)."""
    horde = body.get("horde")
    return isinstance(horde, Mapping) and horde.get("conformance") == "best_effort"


def _check_include(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise invalid("include", "Invalid type for 'include': expected an array of strings.")
    for i, entry in enumerate(value):
        if isinstance(entry, str) and entry in _INCLUDE_NO_OPS:
            continue
        if entry == "message.output_text.logprobs":
            raise unsupported(
                f"include[{i}]",
                "Unsupported value for 'include': log probabilities are not available from a horde's workers.",
            )
        raise unsupported(f"include[{i}]", f"Invalid value for 'include[{i}]': {entry!r}.")


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat body's sampling and length keys (the chat contract checks
    their values; a refusal is renamed back)."""
    out = {key: body[key] for key in ("temperature", "top_p") if body.get(key) is not None}
    if body.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = body["max_output_tokens"]
    return out


def _horde(value: Any, truncation: Any) -> tuple[Any, str]:
    """The chat body's ``horde`` object, and the truncation the Response
    repeats. ``truncation: "auto"`` (drop items from the beginning of the
    conversation until it fits) is the horde's ``context_fit:
    "truncate_oldest"``; ``"disabled"``, the default, is its ``"none"``."""
    if truncation is None or truncation == "disabled":
        return value, "disabled"
    if truncation != "auto":
        raise invalid(
            "truncation",
            f"Invalid value for 'truncation': {truncation!r}; expected 'auto' or 'disabled'.",
        )
    if value is not None and not isinstance(value, Mapping):
        return value, "auto"  # the chat contract refuses the horde object
    horde = dict(value or {})
    if horde.get("context_fit") not in (None, "truncate_oldest"):
        raise unsupported(
            "truncation",
            "'truncation: auto' asks for horde.context_fit 'truncate_oldest', "
            f"and the horde object asks for {horde['context_fit']!r}: send one of them.",
        )
    horde["context_fit"] = "truncate_oldest"
    return horde, "auto"


def _echoed(body: Mapping[str, Any], chat: Mapping[str, Any]) -> dict[str, Any]:
    """The Response's fields that repeat no-op and sampling keys as given."""
    for key in ("user", "safety_identifier", "prompt_cache_key"):
        _optional_str(body, key)
    retention = body.get("prompt_cache_retention")
    if retention is not None and retention not in _PROMPT_CACHE_RETENTIONS:
        raise invalid(
            "prompt_cache_retention",
            f"Invalid value for 'prompt_cache_retention': {retention!r}; expected 'in_memory' or '24h'.",
        )
    if not isinstance(body.get("client_metadata") or {}, Mapping):
        raise invalid("client_metadata", "Invalid type for 'client_metadata': expected an object.")
    max_tool_calls = body.get("max_tool_calls")
    if max_tool_calls is not None and (
        isinstance(max_tool_calls, bool)
        or not isinstance(max_tool_calls, int)
        or max_tool_calls < 0
    ):
        raise invalid("max_tool_calls", "'max_tool_calls' must be a non-negative integer.")
    parallel = body.get("parallel_tool_calls")
    return {
        "metadata": _metadata(body.get("metadata")),
        "user": body.get("user"),
        "safety_identifier": body.get("safety_identifier"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "prompt_cache_retention": retention,
        "max_tool_calls": max_tool_calls,
        "max_output_tokens": body.get("max_output_tokens"),
        # OpenAI's defaults where the call left them out, as the chat
        # contract sends them.
        "temperature": chat.get("temperature", 1.0),
        "top_p": chat.get("top_p", 1.0),
        "parallel_tool_calls": True if parallel is None else parallel,
        # The tier a horde serves every request in (the key is a no-op).
        "service_tier": "default",
        "background": False,
        "top_logprobs": 0,
    }


def _metadata(value: Any) -> dict[str, str]:
    """Up to 16 string pairs, repeated in the Response; never sent to a worker."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > MAX_RESPONSE_METADATA_PAIRS:
        raise invalid(
            "metadata",
            f"Invalid 'metadata': expected an object of at most {MAX_RESPONSE_METADATA_PAIRS} pairs.",
        )
    for key, entry in value.items():
        if len(key) > MAX_RESPONSE_METADATA_KEY_CHARS:
            raise invalid(
                "metadata",
                f"Invalid 'metadata': a key is longer than {MAX_RESPONSE_METADATA_KEY_CHARS} characters.",
            )
        if not isinstance(entry, str) or len(entry) > MAX_RESPONSE_METADATA_VALUE_CHARS:
            raise invalid(
                f"metadata.{key}",
                f"Invalid 'metadata.{key}': expected a string of at most "
                f"{MAX_RESPONSE_METADATA_VALUE_CHARS} characters.",
            )
    return dict(value)


def _text(value: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``text``: (the chat body's keys, the Response's ``text``). Its
    ``format`` is the chat ``response_format`` (json_schema's name, schema,
    description and strict inside it); ``verbosity`` is the chat body's,
    which the chat contract takes only absent."""
    if value is None:
        return {}, {"format": {"type": "text"}}
    if not isinstance(value, Mapping):
        raise invalid("text", "Invalid type for 'text': expected an object.")
    for key in value:
        if key not in ("format", "verbosity"):
            raise unsupported(f"text.{key}", f"Unrecognized argument 'text.{key}'.")
    chat: dict[str, Any] = {}
    if value.get("verbosity") is not None:
        chat["verbosity"] = value["verbosity"]
    form = value.get("format")
    if form is None:
        return chat, {"format": {"type": "text"}}
    if not isinstance(form, Mapping):
        raise invalid("text.format", "Invalid type for 'text.format': expected an object.")
    if form.get("type") == "json_schema":
        spec = {key: entry for key, entry in form.items() if key != "type"}
        chat["response_format"] = {"type": "json_schema", "json_schema": spec}
    else:
        chat["response_format"] = dict(form)
    return chat, {"format": dict(form)}


def _reasoning(value: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``reasoning``: ``effort`` is the chat ``reasoning_effort``;
    ``summary`` (and its old name ``generate_summary``) is a no-op: a horde
    has no summariser, and the reasoning item carries the worker's
    reasoning itself."""
    if value is None:
        return {}, {"effort": None, "summary": None}
    if not isinstance(value, Mapping):
        raise invalid("reasoning", "Invalid type for 'reasoning': expected an object.")
    for key, entry in value.items():
        if key == "effort":
            continue
        if key not in ("summary", "generate_summary"):
            raise unsupported(f"reasoning.{key}", f"Unrecognized argument 'reasoning.{key}'.")
        if entry is not None and entry not in _SUMMARIES:
            raise invalid(
                f"reasoning.{key}",
                f"Invalid value for 'reasoning.{key}': {entry!r}; expected auto, concise or detailed.",
            )
    effort = value.get("effort")
    summary = value.get("summary", value.get("generate_summary"))
    chat = {} if effort is None else {"reasoning_effort": effort}
    return chat, {"effort": effort, "summary": summary}


def _tool_choice_echo(value: Any) -> Any:
    return "auto" if value is None else value


# Tools ---------------------------------------------------------------------------


class _Tools:
    """The call's tools: chat function definitions (``chat``), each with
    the Responses path it came from (``origins``), the Response's ``tools``
    (``echo``), the flattened names of namespaced functions, and the hosted
    tools dropped under best_effort."""

    def __init__(self, best_effort: bool) -> None:
        self.best_effort = best_effort
        self.chat: list[dict[str, Any]] = []
        self.origins: list[str] = []
        self.echo: list[dict[str, Any]] = []
        self.namespaced: dict[str, tuple[str, str]] = {}
        self.dropped: list[dict[str, str]] = []

    def read(self, value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, list):
            raise invalid("tools", "Invalid type for 'tools': expected an array.")
        for i, tool in enumerate(value):
            at = f"tools[{i}]"
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            if kind == "function":
                self.echo.append(self._function(tool, at, None))
            elif kind == "namespace":
                self.echo.append(self._namespace(tool, at))
            elif _is_web_search(kind) and self.best_effort:
                self.dropped.append({"param": at, "type": kind})
            else:
                raise _refused_tool(tool, at)

    def _function(self, tool: Mapping[str, Any], at: str, namespace: str | None) -> dict[str, Any]:
        """One function tool as a chat function; returns its echo. The chat
        contract checks its name, description, parameters and strict."""
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid(f"{at}.name", f"'{at}.name' is required.")
        if tool.get("defer_loading"):
            raise unsupported(
                f"{at}.defer_loading",
                "Deferred tools are found through OpenAI's hosted tool search, which a horde "
                "does not run: send the tool without 'defer_loading'.",
            )
        function: dict[str, Any] = {"name": name}
        if namespace is not None:
            function["name"] = flat_name(namespace, name)
            self.namespaced[function["name"]] = (namespace, name)
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        self.chat.append({"type": "function", "function": function})
        self.origins.append(at)
        return {
            "type": "function",
            "name": name,
            "description": tool.get("description"),
            "parameters": tool.get("parameters"),
            "strict": tool.get("strict") is True,
        }

    def _namespace(self, tool: Mapping[str, Any], at: str) -> dict[str, Any]:
        """A namespace's functions, each a chat function of its flat name."""
        name, nested = tool.get("name"), tool.get("tools")
        if not isinstance(name, str) or not name:
            raise invalid(f"{at}.name", f"'{at}.name' is required.")
        if not isinstance(nested, list):
            raise invalid(f"{at}.tools", f"'{at}.tools' must be an array of function tools.")
        functions = []
        for j, function in enumerate(nested):
            where = f"{at}.tools[{j}]"
            if not isinstance(function, Mapping) or function.get("type") != "function":
                raise _refused_tool(function, where)
            functions.append(self._function(function, where, name))
        description = tool.get("description")
        return {"type": "namespace", "name": name, "description": description, "tools": functions}

    def chat_fields(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The chat body's tools, tool_choice and parallel_tool_calls.

        With no tool left to call, ``tool_choice`` ``auto`` or ``none`` and
        ``parallel_tool_calls`` change nothing and are left out; the chat
        contract refuses any other choice then."""
        out: dict[str, Any] = {}
        choice = _chat_tool_choice(body.get("tool_choice"))
        parallel = body.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):
            raise invalid(
                "parallel_tool_calls", "Invalid type for 'parallel_tool_calls': expected a boolean."
            )
        if self.chat:
            out["tools"] = self.chat
            if parallel is not None:
                out["parallel_tool_calls"] = parallel
        if choice is not None and (self.chat or choice not in ("auto", "none")):
            out["tool_choice"] = choice
        return out


def _is_web_search(kind: Any) -> TypeGuard[str]:
    return isinstance(kind, str) and kind in WEB_SEARCH_TOOLS


def _refused_tool(tool: Any, at: str) -> HordeError:
    """The refusal of a tool a horde cannot offer its workers, by its type."""
    if not isinstance(tool, Mapping):
        return invalid(at, f"Invalid type for '{at}': expected an object.")
    kind = tool.get("type")
    if _is_web_search(kind):
        return unsupported(
            f"{at}.type",
            f"The hosted tool {kind!r} searches the web from OpenAI's servers; a horde's workers "
            'cannot. Leave it out (Codex: web_search = "disabled"), or ask for '
            "conformance 'best_effort' (the horde object, or the X-Horde-Options header) to have "
            "it dropped and listed in the answer's x_horde.dropped_tools.",
        )
    return unsupported(
        f"{at}.type",
        f"Unsupported tool type {kind!r} in '{at}': a horde's workers run no hosted tools; "
        "only 'function' and 'namespace' tools are supported.",
    )


def _chat_tool_choice(value: Any) -> str | dict[str, Any] | None:
    """``tool_choice`` in the chat body's shape: ``none``, ``auto`` and
    ``required`` as they are, ``{"type": "function", "name"}`` as the chat
    contract's named function; a hosted tool's type or ``allowed_tools`` is
    refused."""
    if value is None or value in ("none", "auto", "required"):
        return value  # type: ignore[no-any-return]
    if not isinstance(value, Mapping):
        raise invalid(
            "tool_choice",
            "Invalid 'tool_choice': expected 'none', 'auto', 'required' or {'type': 'function', 'name': ...}.",
        )
    if value.get("type") != "function":
        raise unsupported(
            "tool_choice.type",
            f"Unsupported value for 'tool_choice.type': {value.get('type')!r}; "
            "only a function may be chosen.",
        )
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("tool_choice.name", "'tool_choice.name' is required.")
    return {"type": "function", "function": {"name": name}}


# Input -------------------------------------------------------------------------


class _Conversation:
    """The chat messages of ``instructions`` and ``input``, each with the
    Responses path it came from."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.origins: list[str] = []
        # The assistant message a function_call item joins: the last
        # message, when it is the assistant's.
        self._assistant: dict[str, Any] | None = None

    def _add(self, message: dict[str, Any], origin: str) -> None:
        self.messages.append(message)
        self.origins.append(origin)
        self._assistant = message if message["role"] == "assistant" else None

    def read(self, instructions: Any, value: Any) -> None:
        if instructions is not None:
            if not isinstance(instructions, str):
                raise invalid("instructions", "Invalid type for 'instructions': expected a string.")
            self._add({"role": "system", "content": instructions}, "instructions")
        if isinstance(value, str):
            self._add({"role": "user", "content": value}, "input")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                self._item(item, f"input[{i}]")
        elif value is not None:
            raise invalid(
                "input", "Invalid type for 'input': expected a string or an array of input items."
            )

    def _item(self, item: Any, at: str) -> None:
        if not isinstance(item, Mapping):
            raise invalid(at, f"Invalid type for '{at}': expected an object.")
        kind = item.get("type", "message")
        if kind == "message":
            self._message(item, at)
        elif kind == "function_call":
            self._function_call(item, at)
        elif kind == "function_call_output":
            self._function_call_output(item, at)
        elif kind != "reasoning":
            # A reasoning item carried back is accepted and not sent: the
            # chat contract gives a worker no past reasoning.
            raise unsupported(
                f"{at}.type",
                f"Unsupported input item type {kind!r} in '{at}': a horde takes messages, "
                "function_call, function_call_output and reasoning items.",
            )

    def _message(self, item: Mapping[str, Any], at: str) -> None:
        role = item.get("role")
        if role not in _ROLES:
            raise invalid(
                f"{at}.role",
                f"Invalid value for '{at}.role': {role!r}; expected one of {', '.join(_ROLES)}.",
            )
        content = item.get("content")
        if isinstance(content, list):
            parts = [_part(part, role, f"{at}.content[{j}]") for j, part in enumerate(content)]
            self._add({"role": role, "content": parts}, at)
        elif isinstance(content, str):
            self._add({"role": role, "content": content}, at)
        else:
            raise invalid(
                f"{at}.content",
                f"Invalid type for '{at}.content': expected a string or an array of content parts.",
            )

    def _function_call(self, item: Mapping[str, Any], at: str) -> None:
        """A call the model made: a tool call of the assistant message it
        joins (the last message, when it is the assistant's)."""
        call_id, name = _required_str(item, "call_id", at), _required_str(item, "name", at)
        arguments, namespace = item.get("arguments"), item.get("namespace")
        if not isinstance(arguments, str):
            raise invalid(f"{at}.arguments", f"'{at}.arguments' must be a string.")
        if namespace is not None:
            name = flat_name(_required_str(item, "namespace", at), name)
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        if self._assistant is None:
            self._add({"role": "assistant"}, at)
        assert self._assistant is not None
        self._assistant.setdefault("tool_calls", []).append(call)

    def _function_call_output(self, item: Mapping[str, Any], at: str) -> None:
        call_id = _required_str(item, "call_id", at)
        output = item.get("output")
        if isinstance(output, list):
            content: Any = [
                _output_part(part, f"{at}.output[{j}]") for j, part in enumerate(output)
            ]
        elif isinstance(output, str):
            content = output
        else:
            raise invalid(
                f"{at}.output",
                f"Invalid type for '{at}.output': expected a string or an array of content parts.",
            )
        self._add({"role": "tool", "tool_call_id": call_id, "content": content}, at)


def _required_str(item: Mapping[str, Any], key: str, at: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise invalid(f"{at}.{key}", f"'{at}.{key}' is required: a non-empty string.")
    return value


def _part(part: Any, role: str, at: str) -> dict[str, Any]:
    """A message's content part in the chat shape: text parts (an
    assistant's output_text and refusal too) as text, a user's input_image
    as an image_url part."""
    if not isinstance(part, Mapping):
        raise invalid(at, f"Invalid type for '{at}': expected an object.")
    kind = part.get("type")
    if kind == "input_text" or (kind == "output_text" and role == "assistant"):
        return {"type": "text", "text": _text_of(part, "text", at)}
    if kind == "refusal" and role == "assistant":
        return {"type": "text", "text": _text_of(part, "refusal", at)}
    if kind == "input_image" and role == "user":
        return _image(part, at)
    raise unsupported(
        f"{at}.type", f"Unsupported content part type {kind!r} in '{at}' (a {role} message)."
    )


def _output_part(part: Any, at: str) -> dict[str, Any]:
    """A function_call_output's part: text only (a tool message carries no
    image on the chat contract)."""
    if isinstance(part, Mapping) and part.get("type") in ("input_text", "output_text"):
        return {"type": "text", "text": _text_of(part, "text", at)}
    if not isinstance(part, Mapping):
        raise invalid(at, f"Invalid type for '{at}': expected an object.")
    raise unsupported(
        f"{at}.type",
        f"Unsupported content part type {part.get('type')!r} in '{at}': "
        "a function call's output can hold only text on a horde.",
    )


def _text_of(part: Mapping[str, Any], key: str, at: str) -> str:
    text = part.get(key)
    if not isinstance(text, str):
        raise invalid(f"{at}.{key}", f"'{at}.{key}' must be a string.")
    return text


def _image(part: Mapping[str, Any], at: str) -> dict[str, Any]:
    """An input_image part as the chat image_url part: its URL (http(s) or
    data:image/) and detail (auto, low or high; auto when absent)."""
    url = part.get("image_url")
    if url is None and part.get("file_id") is not None:
        raise unsupported(
            f"{at}.file_id",
            "Images by file id need OpenAI's Files API, which a horde does not have: "
            "send 'image_url' (an http(s) or data:image/ URL).",
        )
    if not isinstance(url, str) or not url.startswith(IMAGE_URL_PREFIXES):
        raise invalid(f"{at}.image_url", f"'{at}.image_url' must be an http(s) or data:image/ URL.")
    detail = part.get("detail")
    if detail is None:
        detail = "auto"
    if detail not in IMAGE_DETAILS:
        raise unsupported(
            f"{at}.detail",
            f"Unsupported value for '{at}.detail': {detail!r}; supported values are "
            f"{', '.join(IMAGE_DETAILS)}.",
        )
    return {"type": "image_url", "image_url": {"url": url, "detail": detail}}


# A chat refusal, renamed -----------------------------------------------------------

# Chat body keys and the Responses fields they come from (a key names its
# sub-keys too: response_format.json_schema.name is text.format.name).
_RENAMES = (
    ("max_completion_tokens", "max_output_tokens"),
    ("reasoning_effort", "reasoning.effort"),
    ("verbosity", "text.verbosity"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("messages", "input"),
)
_MESSAGE_PARAM = re.compile(r"^messages\.?\[(\d+)\]")
_TOOL_PARAM = re.compile(r"^tools\[(\d+)\](?:\.function)?")


def responses_param(param: str, messages: Sequence[str], tools: Sequence[str]) -> str:
    """The Responses field a chat body's ``param`` comes from: a message's
    refusal names the item it came from (``messages`` its origins), a
    tool's the tool's path (``tools``) with the rest of the param."""
    found = _MESSAGE_PARAM.match(param)
    if found and int(found[1]) < len(messages):
        return messages[int(found[1])]
    found = _TOOL_PARAM.match(param)
    if found and int(found[1]) < len(tools):
        return tools[int(found[1])] + param[found.end() :]
    for chat, responses in _RENAMES:
        if param == chat or param.startswith(chat + "."):
            return responses + param[len(chat) :]
    return param


def _renamed(exc: HordeError, messages: Sequence[str], tools: Sequence[str]) -> HordeError:
    """``exc`` naming the Responses field in its param and message."""
    param = exc.extra.get("param")
    if not isinstance(param, str):
        return exc
    renamed = responses_param(param, messages, tools)
    if renamed == param:
        return exc
    # The param where the message quotes it whole (not inside a longer path).
    message = re.sub(rf"(?<![\w.\[]){re.escape(param)}(?![\w.\[])", renamed, exc.message)
    extra = {**exc.extra, "param": renamed}
    if "errors" in extra:
        extra["errors"] = {renamed: message}
    return HordeError(exc.rc, message, **extra)
