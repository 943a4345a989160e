"""The chat request contract: an OpenAI chat-completions body plus ``horde``.

One module for the native chat route and the OpenAI front (pure, no I/O):

- ``parse_chat_request(body)`` validates and normalises the body, refusing
  every unknown or unimplemented top-level key or value with 400
  UnsupportedChatParameter naming it, and every shape OpenAI refuses with
  OpenAI's message and ``param``;
- ``required_chat_features(req)`` derives the capabilities and guarantees the
  request needs (the conformance decision), computed once at submit and stored;
- ``flatten_messages`` gives the prompt string the horde's estimates read;
- ``truncate_oldest`` is the ``context_fit`` rewrite.

A field at its documented default counts as omitted; keys in ``DEFAULT_NO_OPS``
are dropped whatever their value, since they never change a reply; unknown keys
inside messages and their parts, tool definitions and the tool_choice object
are dropped (OpenAI ignores them there), while ``response_format``,
``stream_options`` and ``horde`` refuse them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from hordelite.contract._fields import is_number, kind_name, parse_uuid
from hordelite.contract.chat_features import ChatFeature, ChatGuarantee, to_mask, transport_mask
from hordelite.contract.limits import (
    CHARS_PER_TOKEN_ESTIMATE,
    MAX_CHAT_MESSAGES,
    MAX_CHAT_NAME_CHARS,
    MAX_CHAT_STOP,
    MAX_CHAT_TOOLS,
    MAX_MAX_LENGTH,
    MAX_MODELS,
    MAX_NAME,
    MAX_SEED,
    MAX_STOP_SEQUENCE_CHARS,
    MAX_WORKER_IDS,
    MIN_SEED,
)
from hordelite.errors import RC, HordeError

# Keys that never change a reply: dropped whatever their value.
DEFAULT_NO_OPS = frozenset(
    {"user", "store", "metadata", "service_tier", "safety_identifier", "prompt_cache_key"}
)

# Top-level keys that are accepted only at their documented default, which
# counts as omitted.
_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "modalities": (["text"],),
    "function_call": (),
    "functions": (),
    "audio": (),
    "prediction": (),
    "web_search_options": (),
    "verbosity": (),
}

_KNOWN_TOP = frozenset(
    {
        "model",
        "models",
        "messages",
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "seed",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning_effort",
        "horde",
    }
)

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
CONFORMANCE_MODES = ("strict", "best_effort")
AVAILABILITY_MODES = ("wait", "fail_fast")
CONTEXT_FITS = ("none", "truncate_oldest")
_ROLES = ("system", "developer", "user", "assistant", "tool")
# How an image part may be sent: its URL's schemes, and the details OpenAI
# names (the chat contract drops any other detail).
IMAGE_URL_PREFIXES = ("https://", "http://", "data:image/")
IMAGE_DETAILS = ("auto", "low", "high")
# A function (tool) name, as OpenAI bounds it; the Messages API's tools are held to it too.
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

# OpenAI's defaults, sent to every worker where the client left them out
# (the chat specification), so that an omission means the same on every backend.
OPENAI_SAMPLING_DEFAULTS: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
}
# Backend samplers OpenAI does not have, neutralised.
NEUTRAL_BACKEND_SAMPLERS: dict[str, float] = {"rep_pen": 1.0, "top_k": 0, "min_p": 0.0}


@dataclasses.dataclass(frozen=True)
class HordeOptions:
    """The request's ``horde`` object."""

    conformance: str = "strict"
    availability_mode: str = "wait"
    include_reasoning: bool = True
    max_kudos: float | None = None
    context_fit: str = "none"
    openai_guards: bool = False
    workers: tuple[str, ...] = ()
    worker_blacklist: bool = False
    trusted_workers: bool = False
    slow_workers: bool = True

    @property
    def strict(self) -> bool:
        return self.conformance == "strict"


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A validated chat body. ``messages`` are normalised (developer sent as
    system, unknown keys dropped); sampling values are the client's, with
    OpenAI's defaults where it left them out."""

    models: tuple[str, ...]
    messages: list[dict[str, Any]]
    sampling: dict[str, float]
    max_length: int | None  # None: as long as the serving worker allows
    stop: list[str] | None
    seed: int | None
    reasoning_effort: str | None
    tools: list[dict[str, Any]] | None
    tool_choice: str | dict[str, Any] | None
    parallel_tool_calls: bool
    response_format: dict[str, Any] | None
    stream: bool
    include_usage: bool
    horde: HordeOptions
    has_images: bool

    @property
    def forwards_tools(self) -> bool:
        """Tools reach the worker (the conformance decision's narrowing: none sends none)."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def named_function(self) -> str | None:
        if isinstance(self.tool_choice, dict):
            return str(self.tool_choice["function"]["name"])
        return None

    @property
    def response_type(self) -> str:
        return str((self.response_format or {}).get("type", "text"))

    def fingerprint(self) -> str:
        """A digest of what was asked: reordering ``models`` does not change it."""
        data = self.to_json()
        data["models"] = sorted(self.models)
        raw = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(raw.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        """The stored form; ``from_json`` reads it back.

        Shallow: the messages, tools and schemas are the request's own
        objects, not copies (``dataclasses.asdict`` deep-copies them, which
        cost a large conversation a millisecond per call); the result is
        serialised, never changed."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["horde"] = dataclasses.asdict(self.horde)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChatRequest:
        fields = dict(data)
        fields["models"] = tuple(fields["models"])
        h = dict(fields["horde"])
        h["workers"] = tuple(h["workers"])
        fields["horde"] = HordeOptions(**h)
        return cls(**fields)


# How a stored request refers to an image the horde took in and stored
# (hordelite.horde.images); a client's URL can never take this form, since
# only http(s) and data:image/ URLs are accepted.
BLOB_REFERENCE = "hordelite-blob:"


# Errors ----------------------------------------------------------------------


def unsupported(param: str, message: str | None = None) -> HordeError:
    """400 UnsupportedChatParameter naming the key."""
    return HordeError(
        RC.UnsupportedChatParameter,
        message or f"Unsupported parameter: {param!r} is not supported by this horde.",
        param=param,
    )


def invalid(param: str, message: str) -> HordeError:
    """400 for a value of the wrong type or out of range, naming the key."""
    return HordeError(RC.BadRequest, message, param=param, errors={param: message})


def openai_refusal(param: str | None, message: str) -> HordeError:
    """A shape OpenAI refuses, with OpenAI's message and param."""
    return HordeError(RC.ChatRequestInvalid, message, param=param)


# Parsing ---------------------------------------------------------------------


def check_top_level(
    body: Any, known: frozenset[str], default_only: Mapping[str, tuple[Any, ...]]
) -> None:
    """An OpenAI body's top-level keys, as the front takes them: an object;
    ``known`` keys and no-ops pass, ``default_only`` keys only at a default
    (or null), any other key is refused naming it."""
    if not isinstance(body, Mapping):
        raise invalid("body", f"Expected a JSON object as the body, got {kind_name(body)}.")
    for key, value in body.items():
        if key in DEFAULT_NO_OPS or key in known:
            continue
        if key in default_only:
            if value is None or value in default_only[key]:
                continue
            raise unsupported(
                key, f"Unsupported parameter: {key!r} is supported only at its default."
            )
        raise unsupported(key, f"Unrecognized request argument supplied: {key}")


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a chat body; raises HordeError naming the offending key."""
    check_top_level(body, _KNOWN_TOP, _DEFAULT_ONLY)
    messages, has_images = _parse_messages(body.get("messages"))
    tools = _parse_tools(body.get("tools"))
    tool_choice = _parse_tool_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise invalid(
                "parallel_tool_calls", "Invalid type for 'parallel_tool_calls': expected a boolean."
            )
        if not tools:
            raise openai_refusal(
                "parallel_tool_calls",
                "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when 'tools' are specified.",
            )
    response_format = _parse_response_format(body.get("response_format"))
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream", "Invalid type for 'stream': expected a boolean.")
    include_usage = parse_stream_options(body.get("stream_options"), bool(stream))
    horde = _parse_horde(body.get("horde"))
    req = ChatRequest(
        models=parse_models(body),
        messages=messages,
        sampling=_parse_sampling(body),
        max_length=_parse_max_length(body),
        stop=parse_stop(body.get("stop")),
        seed=_parse_seed(body.get("seed")),
        reasoning_effort=_parse_enum(body, "reasoning_effort", REASONING_EFFORTS),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=True if parallel is None else parallel,
        response_format=response_format,
        stream=bool(stream),
        include_usage=include_usage,
        horde=horde,
        has_images=has_images,
    )
    _check_tool_history(messages)
    if horde.openai_guards and req.response_type == "json_object":
        if not any("json" in _message_text(m).lower() for m in messages):
            raise openai_refusal(
                "messages",
                "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'.",
            )
    return req


def parse_models(body: Mapping[str, Any]) -> tuple[str, ...]:
    model, models = body.get("model"), body.get("models")
    if model is not None and models is not None:
        raise unsupported("models", "Send either 'model' or 'models', not both.")
    if models is None:
        if not isinstance(model, str) or not model:
            raise invalid("model", "'model' is required: a model name.")
        if len(model) > MAX_NAME:
            raise invalid("model", f"'model' is longer than {MAX_NAME} characters.")
        return (model,)
    if not isinstance(models, list) or not models:
        raise invalid("models", "'models' must be a non-empty array of model names.")
    if len(models) > MAX_MODELS:
        raise invalid("models", f"'models' has more than {MAX_MODELS} entries.")
    for i, name in enumerate(models):
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise invalid(f"models[{i}]", f"'models[{i}]' must be a model name.")
    return tuple(dict.fromkeys(models))


def openai_number(
    body: Mapping[str, Any], key: str, lo: float, hi: float, name: str | None = None
) -> float | None:
    """``body[key]`` as a number within bounds; errors name it ``name`` (default ``key``)."""
    value = body.get(key)
    key = name or key
    if value is None:
        return None
    if not is_number(value):
        raise invalid(
            key,
            f"Invalid type for '{key}': expected a number, but got {kind_name(value)} instead.",
        )
    if not lo <= value <= hi:
        raise invalid(key, f"Invalid '{key}': {value} is outside {lo} to {hi}.")
    return float(value)


def openai_integer(
    key: str, value: Any, lo: int, hi: int, outside: str | None = None
) -> int | None:
    """``value``, the body's ``key``, as an integer within bounds (None when
    absent); a refusal names ``key``, and says ``outside`` (by default the
    bounds) when the value is out of them."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(
            key,
            f"Invalid type for '{key}': expected an integer, but got {kind_name(value)} instead.",
        )
    if not lo <= value <= hi:
        raise invalid(key, f"Invalid '{key}': {outside or f'{value} is outside {lo} to {hi}'}.")
    return value


def _parse_sampling(body: Mapping[str, Any]) -> dict[str, float]:
    bounds = {
        "temperature": (0.0, 2.0),
        "top_p": (0.0, 1.0),
        "frequency_penalty": (-2.0, 2.0),
        "presence_penalty": (-2.0, 2.0),
    }
    sampling = dict(OPENAI_SAMPLING_DEFAULTS)
    for key, (lo, hi) in bounds.items():
        value = openai_number(body, key, lo, hi)
        if value is not None:
            sampling[key] = value
    return sampling


def _parse_max_length(body: Mapping[str, Any]) -> int | None:
    found: list[int] = []
    for key in ("max_completion_tokens", "max_tokens"):
        value = openai_integer(key, body.get(key), 1, MAX_MAX_LENGTH)
        if value is not None:
            found.append(value)
    # Both bound the reply: the smaller one is the budget.
    return min(found) if found else None


def parse_stop(value: Any, name: str = "stop") -> list[str] | None:
    """Stop sequences: a string or up to MAX_CHAT_STOP strings; refusals
    name the field ``name`` (the Messages API calls it stop_sequences)."""
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid(name, f"Invalid type for '{name}': expected a string or an array of strings.")
    if len(stops) > MAX_CHAT_STOP:
        raise invalid(name, f"Invalid '{name}': at most {MAX_CHAT_STOP} sequences are allowed.")
    if any(not s or len(s) > MAX_STOP_SEQUENCE_CHARS for s in stops):
        raise invalid(
            name,
            f"Invalid '{name}': each sequence must be 1 to {MAX_STOP_SEQUENCE_CHARS} characters.",
        )
    return stops or None


def _parse_seed(value: Any) -> int | None:
    return openai_integer("seed", value, MIN_SEED, MAX_SEED, "outside the 64-bit integer range")


def _parse_enum(body: Mapping[str, Any], key: str, values: Sequence[str]) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if value not in values:
        raise unsupported(
            key, f"Invalid value for '{key}': {value!r}; supported values are {', '.join(values)}."
        )
    return str(value)


# Messages --------------------------------------------------------------------


def _parse_messages(value: Any) -> tuple[list[dict[str, Any]], bool]:
    if not isinstance(value, list) or not value:
        raise invalid("messages", "'messages' is required: a non-empty array of messages.")
    if len(value) > MAX_CHAT_MESSAGES:
        raise invalid("messages", f"'messages' has more than {MAX_CHAT_MESSAGES} entries.")
    out: list[dict[str, Any]] = []
    has_images = False
    for i, raw in enumerate(value):
        message, images = _parse_message(raw, f"messages[{i}]")
        has_images |= images
        out.append(message)
    return out, has_images


def _parse_message(raw: Any, where: str) -> tuple[dict[str, Any], bool]:
    role = _message_role(raw, where)
    # A developer message is stored and sent as system (the chat specification).
    message: dict[str, Any] = {"role": "system" if role == "developer" else role}
    calls = _message_tool_calls(raw, role, where)
    if calls:
        message["tool_calls"] = calls
    content, has_images = _message_content(raw, role, bool(calls), where)
    if content is not None:
        message["content"] = content
    if role == "tool":
        message["tool_call_id"] = _tool_call_id(raw, where)
    name = _message_name(raw, role, where)
    if name is not None:
        message["name"] = name
    return message, has_images


def _message_role(raw: Any, where: str) -> str:
    if not isinstance(raw, Mapping):
        raise invalid(
            where,
            f"Invalid type for '{where}': expected an object, but got {kind_name(raw)} instead.",
        )
    role = raw.get("role")
    if role not in _ROLES:
        raise invalid(
            f"{where}.role",
            f"Invalid value for '{where}.role': {role!r}; expected one of {', '.join(_ROLES)}.",
        )
    return str(role)


def _message_tool_calls(raw: Mapping[str, Any], role: str, where: str) -> list[dict[str, Any]]:
    """An assistant message's tool calls; any other role may not have them."""
    if role != "assistant":
        if raw.get("tool_calls") is not None:
            raise openai_refusal(
                f"{where}.tool_calls",
                f"Invalid parameter: only messages with role 'assistant' can have 'tool_calls'; '{where}' has role '{role}'.",
            )
        return []
    return _parse_tool_calls(raw.get("tool_calls"), f"{where}.tool_calls")


def _message_content(
    raw: Mapping[str, Any], role: str, has_calls: bool, where: str
) -> tuple[str | list[dict[str, Any]] | None, bool]:
    """(the content, whether it has images). Only an assistant message with
    tool calls may go without content (None); only a user's may hold images."""
    content = raw.get("content")
    if content is not None:
        return _parse_content(content, f"{where}.content", allow_images=role == "user")
    if role != "assistant":
        raise invalid(f"{where}.content", f"'{where}.content' is required.")
    if not has_calls:
        raise invalid(
            f"{where}.content", f"'{where}.content' is required unless 'tool_calls' is given."
        )
    return None, False


def _tool_call_id(raw: Mapping[str, Any], where: str) -> str:
    call_id = raw.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(
            f"{where}.tool_call_id", f"'{where}.tool_call_id' is required for a tool message."
        )
    return call_id


def _message_name(raw: Mapping[str, Any], role: str, where: str) -> str | None:
    """The participant's name; a tool message's is dropped, unread."""
    name = raw.get("name")
    if name is None or role == "tool":
        return None
    if not isinstance(name, str) or len(name) > MAX_CHAT_NAME_CHARS:
        raise invalid(
            f"{where}.name",
            f"'{where}.name' must be a string of at most {MAX_CHAT_NAME_CHARS} characters.",
        )
    return name


def _parse_content(
    value: Any, where: str, allow_images: bool
) -> tuple[str | list[dict[str, Any]], bool]:
    if isinstance(value, str):
        return value, False
    if not isinstance(value, list):
        raise invalid(where, f"Invalid type for '{where}': expected a string or an array of parts.")
    parts: list[dict[str, Any]] = []
    has_images = False
    for i, part in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(part, Mapping):
            raise invalid(at, f"Invalid type for '{at}': expected an object.")
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise invalid(f"{at}.text", f"'{at}.text' must be a string.")
            parts.append({"type": "text", "text": text})
        elif kind == "image_url" and allow_images:
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else None
            if not isinstance(url, str) or not url.startswith(IMAGE_URL_PREFIXES):
                raise invalid(
                    f"{at}.image_url.url",
                    f"'{at}.image_url.url' must be an http(s) or data:image/ URL.",
                )
            entry: dict[str, Any] = {"url": url}
            detail = image.get("detail")  # type: ignore[union-attr]
            if detail in IMAGE_DETAILS:
                entry["detail"] = detail
            parts.append({"type": "image_url", "image_url": entry})
            has_images = True
        else:
            raise unsupported(f"{at}.type", f"Unsupported content part type {kind!r} in '{at}'.")
    return parts, has_images


def _parse_tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(where, f"Invalid type for '{where}': expected an array.")
    calls = []
    for i, call in enumerate(value):
        at = f"{where}[{i}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(call, Mapping) or not isinstance(function, Mapping):
            raise invalid(at, f"'{at}' must be an object with a 'function'.")
        call_id, name, arguments = (
            call.get("id"),
            function.get("name"),
            function.get("arguments", ""),
        )
        if not isinstance(call_id, str) or not call_id:
            raise invalid(f"{at}.id", f"'{at}.id' is required.")
        if not isinstance(name, str) or not name:
            raise invalid(f"{at}.function.name", f"'{at}.function.name' is required.")
        if not isinstance(arguments, str):
            raise invalid(
                f"{at}.function.arguments", f"'{at}.function.arguments' must be a string."
            )
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return calls


def _check_tool_history(messages: list[dict[str, Any]]) -> None:
    """Every call must be answered by tool messages right after its assistant
    message, and every tool message must answer such a call (OpenAI's rule)."""
    pending: dict[str, int] = {}
    opener = -1
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            if message["tool_call_id"] not in pending:
                raise openai_refusal(
                    f"messages.[{i}].role",
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                )
            del pending[message["tool_call_id"]]
            continue
        if pending:
            raise openai_refusal(
                f"messages.[{opener}].role",
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(pending)}",
            )
        if role == "assistant" and message.get("tool_calls"):
            pending = {call["id"]: i for call in message["tool_calls"]}
            opener = i
    if pending:
        raise openai_refusal(
            f"messages.[{opener}].role",
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(pending)}",
        )


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return ""


# Tools and formats -------------------------------------------------------------


def _parse_tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise invalid("tools", "Invalid type for 'tools': expected an array.")
    if len(value) > MAX_CHAT_TOOLS:
        raise invalid("tools", f"Invalid 'tools': at most {MAX_CHAT_TOOLS} tools are allowed.")
    tools = []
    names: set[str] = set()
    for i, tool in enumerate(value):
        # Unknown keys inside a tool definition are dropped, as OpenAI does.
        tools.append({"type": "function", "function": _parse_tool(tool, f"tools[{i}]", names)})
    return tools or None


def _parse_tool(tool: Any, at: str, names: set[str]) -> dict[str, Any]:
    """The function of one tool definition. Its name may not be in names (the
    tools before it), and is added there."""
    if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
        raise unsupported(
            f"{at}.type",
            f"Unsupported tool type in '{at}': only 'function' tools are supported.",
        )
    function = tool.get("function")
    if not isinstance(function, Mapping):
        raise invalid(f"{at}.function", f"'{at}.function' is required.")
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise invalid(
            f"{at}.function.name",
            f"Invalid '{at}.function.name': must match ^[a-zA-Z0-9_-]{{1,64}}$.",
        )
    if name in names:
        raise openai_refusal(
            f"{at}.function.name", f"Invalid 'tools': duplicate function name {name!r}."
        )
    names.add(name)
    out: dict[str, Any] = {"name": name, **_function_description_and_parameters(function, at)}
    if _parse_strict(function, f"{at}.function.strict"):
        out["strict"] = True
        check_strict_schema(
            out.get("parameters", {}),
            f"{at}.function.parameters",
            f"Invalid schema for function '{name}'",
        )
    return out


def _function_description_and_parameters(function: Mapping[str, Any], at: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    description = function.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise invalid(
                f"{at}.function.description", f"'{at}.function.description' must be a string."
            )
        out["description"] = description
    parameters = function.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, Mapping):
            raise invalid(
                f"{at}.function.parameters",
                f"'{at}.function.parameters' must be a JSON Schema object.",
            )
        out["parameters"] = dict(parameters)
    return out


def _parse_strict(spec: Mapping[str, Any], field: str) -> bool:
    """The optional ``strict`` flag of a function or a json_schema format."""
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(field, f"'{field}' must be a boolean.")
    return bool(strict)


def _parse_tool_choice(
    value: Any, tools: list[dict[str, Any]] | None
) -> str | dict[str, Any] | None:
    if value is None:
        return None
    if not tools:
        raise openai_refusal(
            "tool_choice",
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
        )
    if value in ("none", "auto", "required"):
        return str(value)
    function = value.get("function") if isinstance(value, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if (
        not isinstance(value, Mapping)
        or value.get("type", "function") != "function"
        or not isinstance(name, str)
    ):
        raise invalid(
            "tool_choice",
            "Invalid 'tool_choice': expected 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}.",
        )
    if name not in {t["function"]["name"] for t in tools}:
        raise openai_refusal(
            "tool_choice",
            f"Invalid value for 'tool_choice': no function named {name!r} was specified in 'tools'.",
        )
    # Unknown keys of the tool_choice object are dropped.
    return {"type": "function", "function": {"name": name}}


# The keys each response_format type takes.
_RESPONSE_FORMAT_KEYS = {
    "text": {"type"},
    "json_object": {"type"},
    "json_schema": {"type", "json_schema"},
}


def _parse_response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise invalid("response_format", "Invalid type for 'response_format': expected an object.")
    kind = _response_format_type(value)
    if kind == "text":
        return None  # the default: counts as omitted
    if kind == "json_object":
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "json_schema": _parse_json_schema_format(value.get("json_schema")),
    }


def _response_format_type(value: Mapping[str, Any]) -> str:
    """The format's type, once every key beside it is one that type takes."""
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in _RESPONSE_FORMAT_KEYS:
        raise unsupported(
            "response_format.type", f"Invalid value for 'response_format.type': {kind!r}."
        )
    for key in value:
        if key not in _RESPONSE_FORMAT_KEYS[kind]:
            raise unsupported(
                f"response_format.{key}", f"Unrecognized argument 'response_format.{key}'."
            )
    return kind


def _parse_json_schema_format(spec: Any) -> dict[str, Any]:
    """``response_format.json_schema``: name, and optionally schema,
    description and strict (a strict schema must follow OpenAI's rules)."""
    if not isinstance(spec, Mapping):
        raise invalid(
            "response_format.json_schema",
            "'response_format.json_schema' is required for type json_schema.",
        )
    for key in spec:
        if key not in ("name", "schema", "strict", "description"):
            raise unsupported(
                f"response_format.json_schema.{key}",
                f"Unrecognized argument 'response_format.json_schema.{key}'.",
            )
    name = spec.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise invalid(
            "response_format.json_schema.name",
            "Invalid 'response_format.json_schema.name': must match ^[a-zA-Z0-9_-]{1,64}$.",
        )
    out: dict[str, Any] = {"name": name}
    schema = spec.get("schema")
    if schema is not None:
        if not isinstance(schema, Mapping):
            raise invalid(
                "response_format.json_schema.schema",
                "'response_format.json_schema.schema' must be an object.",
            )
        out["schema"] = dict(schema)
    description = spec.get("description")
    if isinstance(description, str):
        out["description"] = description
    if _parse_strict(spec, "response_format.json_schema.strict"):
        out["strict"] = True
        check_strict_schema(
            out.get("schema", {}), "response_format", f"Invalid schema for response_format '{name}'"
        )
    return out


def check_strict_schema(schema: Any, param: str, prefix: str, path: tuple[str, ...] = ()) -> None:
    """OpenAI's strict-mode rules: every object closed, every property required."""
    if isinstance(schema, list):
        for item in schema:
            check_strict_schema(item, param, prefix, path)
        return
    if not isinstance(schema, Mapping):
        return
    if _is_object_schema(schema):
        _check_closed_object(schema, param, prefix, path)
    for child, child_path in _subschemas(schema, path):
        check_strict_schema(child, param, prefix, child_path)


def _is_object_schema(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return (
        kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in schema
    )


def _check_closed_object(
    schema: Mapping[str, Any], param: str, prefix: str, path: tuple[str, ...]
) -> None:
    """An object schema must refuse other properties and require all of its own."""
    context = "(" + ", ".join(repr(p) for p in path) + (",)" if len(path) == 1 else ")")
    if schema.get("additionalProperties") is not False:
        raise openai_refusal(
            param,
            f"{prefix}: In context={context}, 'additionalProperties' is required to be supplied and to be false.",
        )
    properties = schema["properties"] if isinstance(schema.get("properties"), Mapping) else {}
    required = schema.get("required")
    missing = [key for key in properties if not isinstance(required, list) or key not in required]
    if missing:
        raise openai_refusal(
            param,
            f"{prefix}: In context={context}, 'required' is required to be supplied and to be an array "
            f"including every key in properties. Missing '{missing[0]}'.",
        )


def _subschemas(
    schema: Mapping[str, Any], path: tuple[str, ...]
) -> Iterator[tuple[Any, tuple[str, ...]]]:
    """Each schema nested in this one (a list stands for its items), with its path."""
    for key, sub in schema.items():
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(
            sub, Mapping
        ):
            for name, child in sub.items():
                yield child, (*path, key, name)
        elif key in ("items", "anyOf", "allOf", "oneOf", "prefixItems", "not"):
            yield sub, (*path, key)


def parse_stream_options(value: Any, stream: bool, option: str = "include_usage") -> bool:
    """``stream_options``: allowed only with ``stream``, an object whose one
    key is the boolean ``option`` (chat and legacy completions take
    ``include_usage``, the Responses API ``include_obfuscation``); returns
    it, False when absent."""
    if value is None:
        return False
    if not stream:
        raise openai_refusal(
            "stream_options",
            "Invalid value for 'stream_options': 'stream_options' is only allowed when 'stream' is true.",
        )
    if not isinstance(value, Mapping):
        raise invalid("stream_options", "Invalid type for 'stream_options': expected an object.")
    for key in value:
        if key != option:
            raise unsupported(
                f"stream_options.{key}", f"Unrecognized argument 'stream_options.{key}'."
            )
    chosen = value.get(option, False)
    if not isinstance(chosen, bool):
        raise invalid(f"stream_options.{option}", f"'stream_options.{option}' must be a boolean.")
    return chosen


# The horde object ---------------------------------------------------------------

_HORDE_KEYS = frozenset(
    {
        "conformance",
        "availability_mode",
        "include_reasoning",
        "max_kudos",
        "context_fit",
        "openai_guards",
        "workers",
        "worker_blacklist",
        "trusted_workers",
        "slow_workers",
    }
)


def parse_horde_workers(value: Any) -> tuple[str, ...]:
    """``horde.workers``: at most MAX_WORKER_IDS worker ids (UUIDs), in
    canonical form, each once; absent or null is none."""
    workers = value or []
    if not isinstance(workers, list) or len(workers) > MAX_WORKER_IDS:
        raise invalid(
            "horde.workers",
            f"'horde.workers' must be an array of at most {MAX_WORKER_IDS} worker ids.",
        )
    ids = []
    for i, w in enumerate(workers):
        wid = parse_uuid(w)
        if wid is None:
            raise invalid(
                f"horde.workers[{i}]", f"'horde.workers[{i}]' is not a worker id (a UUID)."
            )
        ids.append(wid)
    return tuple(dict.fromkeys(ids))


def horde_object(value: Any, known: Collection[str]) -> Mapping[str, Any]:
    """The ``horde`` object of a body, refused unless it is an object whose
    keys are all ``known``."""
    if not isinstance(value, Mapping):
        raise invalid("horde", "Invalid type for 'horde': expected an object.")
    for key in value:
        if key not in known:
            raise unsupported(
                f"horde.{key}", f"Unrecognized request argument supplied: horde.{key}"
            )
    return value


def horde_flag(horde: Mapping[str, Any], key: str, default: bool) -> bool:
    """The ``horde`` object's boolean ``key``, ``default`` when absent."""
    value = horde.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"horde.{key}", f"'horde.{key}' must be a boolean.")
    return value


def _parse_horde(raw: Any) -> HordeOptions:
    if raw is None:
        return HordeOptions()
    value = horde_object(raw, _HORDE_KEYS)

    def choice(key: str, values: Sequence[str]) -> str:
        v = value.get(key)
        if v is None:
            return values[0]
        if v not in values:
            raise unsupported(
                f"horde.{key}",
                f"Invalid value for 'horde.{key}': {v!r}; supported values are {', '.join(values)}.",
            )
        return str(v)

    max_kudos = openai_number(value, "max_kudos", 0, 1e12, "horde.max_kudos")
    return HordeOptions(
        conformance=choice("conformance", CONFORMANCE_MODES),
        availability_mode=choice("availability_mode", AVAILABILITY_MODES),
        include_reasoning=horde_flag(value, "include_reasoning", True),
        max_kudos=max_kudos,
        context_fit=choice("context_fit", CONTEXT_FITS),
        openai_guards=horde_flag(value, "openai_guards", False),
        workers=parse_horde_workers(value.get("workers")),
        worker_blacklist=horde_flag(value, "worker_blacklist", False),
        trusted_workers=horde_flag(value, "trusted_workers", False),
        slow_workers=horde_flag(value, "slow_workers", True),
    )


# Requirements ------------------------------------------------------------------


def required_chat_features(req: ChatRequest) -> list[str]:
    """The capabilities and guarantees a worker must declare (the conformance decision).

    A field at its default is absent. Guarantees are required only under
    strict; single_tool_call_enforced never is (the horde keeps the first
    call itself).
    """
    needed: list[ChatFeature | ChatGuarantee] = [
        *_sampling_features(req),
        *_tool_and_format_features(req),
        *_required_guarantees(req),
    ]
    return [f.name for f in needed]


def _sampling_features(req: ChatRequest) -> list[ChatFeature]:
    needed = []
    if req.seed is not None:
        needed.append(ChatFeature.seed)
    if req.sampling["presence_penalty"] != 0:
        needed.append(ChatFeature.presence_penalty)
    if req.sampling["frequency_penalty"] != 0:
        needed.append(ChatFeature.frequency_penalty)
    if req.reasoning_effort is not None:
        needed.append(ChatFeature.reasoning_effort)
    if req.has_images:
        needed.append(ChatFeature.vision)
    return needed


def _tool_and_format_features(req: ChatRequest) -> list[ChatFeature]:
    needed = []
    history_has_tools = any(m.get("tool_calls") or m["role"] == "tool" for m in req.messages)
    if req.forwards_tools or history_has_tools:
        needed.append(ChatFeature.tools)
    if req.response_type == "json_object":
        needed.append(ChatFeature.json_object)
    if req.response_type == "json_schema":
        needed.append(ChatFeature.json_schema)
    if req.forwards_tools and req.response_format is not None:
        needed.append(ChatFeature.tools_with_response_format)
    return needed


def _required_guarantees(req: ChatRequest) -> list[ChatGuarantee]:
    if not req.horde.strict:
        return []
    needed = [ChatGuarantee.prompt_overflow_refused]
    if req.forwards_tools and (req.tool_choice == "required" or req.named_function):
        needed.append(ChatGuarantee.tool_choice_enforced)
    if req.response_type == "json_schema" and req.response_format["json_schema"].get("strict"):  # type: ignore[index]
        needed.append(ChatGuarantee.structured_output_enforced)
    return needed


def image_count(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """How many image parts the messages have, and the bytes of those
    already stored (``BLOB_REFERENCE<key>/<jpeg bytes>``): what a request's
    images count against its user's budgets."""
    count = stored = 0
    for message in messages:
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            if part.get("type") != "image_url":
                continue
            count += 1
            url = part["image_url"]["url"]
            if url.startswith(BLOB_REFERENCE):
                stored += int(url.rpartition("/")[2])
    return count, stored


def image_transports_needed(req: ChatRequest) -> set[str]:
    """How the request's images must reach a worker. A stored image
    (``BLOB_REFERENCE``) goes by whichever transport the worker declared, so
    it needs none beyond vision (which a declaration only has with a
    transport); an image still as the client sent it (a request not yet
    taken in) needs "base64" for a data: URL, "url" for an http(s) URL."""
    needed = set()
    for message in req.messages:
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            if part["type"] == "image_url":
                url = part["image_url"]["url"]
                if not url.startswith(BLOB_REFERENCE):
                    needed.add("base64" if url.startswith("data:") else "url")
    return needed


def required_mask(req: ChatRequest) -> int:
    """The stored eligibility mask: required features, guarantees and image transports."""
    return to_mask(required_chat_features(req)) | transport_mask(image_transports_needed(req))


def tools_temperature(req: ChatRequest) -> float | None:
    """The temperature a worker's tools_max_temperature is compared with:
    the request's, when tools reach the worker; None otherwise."""
    return req.sampling["temperature"] if req.forwards_tools else None


# Flattened prompt and context fit ---------------------------------------------------


def flatten_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> str:
    """The conversation as one string: what the horde's estimates read.

    Never sent to a worker. Tool definitions count, as templates render them.
    """
    lines = [_message_line(message) for message in messages]
    if tools:
        lines.append(_tools_line(tools))
    return "\n".join(lines)


def _message_line(message: Mapping[str, Any]) -> str:
    text = _message_text(message)
    for call in message.get("tool_calls") or ():
        text += f"\n{call['function']['name']}({call['function']['arguments']})"
    return f"{message['role']}: {text}"


def conversation_chars(messages: Sequence[Mapping[str, Any]]) -> int:
    """The characters of the messages' text (a cheap measure of their size)."""
    return sum(len(_message_text(message)) for message in messages)


def _tools_line(tools: Sequence[Mapping[str, Any]]) -> str:
    return "tools: " + json.dumps(tools, separators=(",", ":"))


def estimate_tokens(text: str) -> int:
    """The horde's context estimate: 3 characters per token (no tokenizer)."""
    return _tokens_of(len(text))


def _tokens_of(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN_ESTIMATE)


def truncate_oldest(
    messages: list[dict[str, Any]],
    budget_tokens: int,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]] | None:
    """Drop the oldest whole turns until the conversation fits ``budget_tokens``.

    Keeps every system message and the latest user turn; a turn is a user
    message with the assistant and tool messages after it, so a tool call is
    never separated from its answers. Returns the kept messages, or None when
    even the minimum does not fit.

    Linear in the conversation: each message's flattened line is measured
    once, and the length of what is kept is updated as turns are dropped
    (flatten_messages joins lines with one newline), so no candidate is
    flattened again. The result is what flattening each candidate would give.
    """
    turns: list[list[int]] = []
    for i, message in enumerate(messages):
        if message["role"] == "system":
            continue
        if message["role"] == "user" or not turns:
            turns.append([i])
        else:
            turns[-1].append(i)
    lengths = [len(_message_line(m)) for m in messages]
    chars, lines = sum(lengths), len(lengths)
    if tools:
        chars, lines = chars + len(_tools_line(tools)), lines + 1

    def fits() -> bool:
        return _tokens_of(chars + max(lines - 1, 0)) <= budget_tokens

    dropped = 0  # the oldest turns dropped so far
    while dropped < len(turns) - 1 and not fits():
        chars -= sum(lengths[i] for i in turns[dropped])
        lines -= len(turns[dropped])
        dropped += 1
    if not fits():
        return None
    gone = {i for turn in turns[:dropped] for i in turn}
    return [m for i, m in enumerate(messages) if i not in gone]
