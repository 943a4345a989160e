"""The Anthropic Messages API request contract (pure, no I/O).

``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` are served as
the chat request ``/v1/chat/completions`` already runs (decision 0079):

- ``parse_messages_request(body)`` validates a Messages body and translates
  it into an OpenAI chat-completions body (``MessagesCall.chat``), which
  ``chat_request.parse_chat_request`` then takes; every refusal is a
  HordeError naming the Messages field (``param``: ``messages[2].content[0].type``,
  ``tools[1].type``, ``thinking.type``);
- ``parse_count_tokens_request(body)`` does the same for a count_tokens body
  (no ``max_tokens``, nothing that only shapes a reply);
- ``check_beta_flags(header)`` refuses by name an ``anthropic-beta`` flag
  whose feature is neither honoured nor a documented no-op;
- ``parse_models_query(pairs)`` reads the paging of ``GET /v1/models`` in
  Anthropic's shape.

Every field is honoured, a documented no-op, or refused by name
(docs/reference/messages_api.md has the table). The translation produces only
what the chat contract accepts, so that a refusal always names a field the
client sent; the tests check that ``parse_chat_request`` takes every body
produced.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hordelite.contract._fields import kind_name
from hordelite.contract.audit_query import parse_count
from hordelite.contract.chat_request import (
    FUNCTION_NAME,
    check_strict_schema,
    invalid,
    openai_number,
    parse_models,
    parse_stop,
    unsupported,
)
from hordelite.contract.limits import (
    MAX_CHAT_MESSAGES,
    MAX_CHAT_TOOLS,
    MAX_MAX_LENGTH,
    MAX_MODELS_LIST_LIMIT,
    MIN_THINKING_BUDGET_TOKENS,
    MODELS_LIST_LIMIT,
)
from hordelite.errors import RC, HordeError

# Top-level keys, by how they are served. The no-ops never change a reply:
# they are checked for their JSON type and dropped.
_NO_OPS = frozenset({"cache_control", "context_management", "service_tier", "speed"})
_COUNT_KEYS = frozenset(
    {"model", "models", "messages", "system", "tools", "tool_choice", "thinking", "output_config"}
)
_MESSAGES_KEYS = _COUNT_KEYS | {
    "max_tokens",
    "stop_sequences",
    "temperature",
    "top_p",
    "stream",
    "metadata",
    "horde",
}
# Keys Anthropic serves that a horde cannot, each with the reason it gives.
_REFUSED: dict[str, str] = {
    "top_k": "the chat request a horde runs has no top_k sampler",
    "mcp_servers": "MCP servers are called by Anthropic's servers; a horde's workers call no server",
    "container": "containers run Anthropic's code execution tool, which a horde's workers do not have",
    "inference_geo": "a horde's workers run wherever their volunteers are",
}

_ROLES = ("user", "assistant", "system")
_IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_THINKING_DISPLAYS = ("summarized", "omitted")
# output_config.effort values with a chat reasoning_effort of the same name.
_EFFORTS = ("low", "medium", "high", "xhigh")
# thinking.budget_tokens as a reasoning_effort, when output_config.effort
# names none: below 4096 tokens low, below 16384 medium, else high.
_BUDGET_EFFORTS = ((4096, "low"), (16384, "medium"))
_LARGEST_BUDGET_EFFORT = "high"
# The keys each block type takes, beside "type"; "cache_control" (a no-op)
# is taken on every block. A key sent as null counts as absent.
_BLOCK_KEYS: dict[str, frozenset[str]] = {
    "text": frozenset({"text", "citations"}),
    "image": frozenset({"source"}),
    "tool_use": frozenset({"id", "name", "input", "caller"}),
    "tool_result": frozenset({"tool_use_id", "content", "is_error"}),
    "thinking": frozenset({"thinking", "signature"}),
    "redacted_thinking": frozenset({"data"}),
    "tool_reference": frozenset({"tool_name"}),  # in a tool result's content only
}
# The block types each role's messages may hold.
_ROLE_BLOCKS = {
    "user": ("text", "image", "tool_result"),
    "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
    "system": ("text",),
}
# A tool result marked is_error reaches the worker with this text part
# first: a chat tool message has no error flag of its own.
TOOL_ERROR_MARK = "(the tool reported an error)"
# The json_schema name a response format from output_config.format takes.
OUTPUT_FORMAT_NAME = "output_format"
# Where a max_tokens over the horde's bound is lowered to, and why (an
# entry of context_adjustments, decision 0016).
_MAX_TOKENS_REASON = "the largest max_tokens a horde request may ask for"
_EFFORT_REASON = "conformance best_effort: an effort is a hint, not sent to the worker"


@dataclasses.dataclass(frozen=True)
class MessagesCall:
    """A validated Messages body.

    ``chat`` is the OpenAI chat-completions body that
    ``parse_chat_request`` validates and the horde queues; the rest is what
    the answer needs and the chat request does not hold."""

    chat: dict[str, Any]
    model: str  # as the body names it (the first of ``models``)
    stream: bool
    # Thinking blocks in the answer: None for none (thinking disabled or
    # not asked for), else their display, "summarized" or "omitted".
    thinking: str | None
    # What was changed for the horde to take it, as context_adjustments
    # entries: a max_tokens over MAX_MAX_LENGTH, lowered to it.
    adjustments: tuple[dict[str, Any], ...] = ()


def parse_messages_request(body: Any, *, conformance: str | None = None) -> MessagesCall:
    """A ``/v1/messages`` body as a MessagesCall; raises HordeError naming
    the field refused. ``conformance`` is the call's when the body's
    ``horde`` object names none (the X-Horde-Options header's, or the key's
    default): under best_effort an effort is a hint no worker must declare."""
    return _parse(body, _MESSAGES_KEYS, count=False, conformance=conformance)


def parse_count_tokens_request(body: Any) -> MessagesCall:
    """A ``/v1/messages/count_tokens`` body as a MessagesCall (its chat body
    has no max_tokens and does not stream)."""
    return _parse(body, _COUNT_KEYS, count=True, conformance=None)


def _parse(
    body: Any, known: frozenset[str], *, count: bool, conformance: str | None
) -> MessagesCall:
    _check_top_level(body, known)
    models = parse_models(body)
    max_tokens, adjustments = _parse_max_tokens(body.get("max_tokens"), required=not count)
    thinking, budget_effort = _parse_thinking(body.get("thinking"), body.get("max_tokens"))
    effort, response_format = _parse_output_config(body.get("output_config"), "output_config")
    tools = _parse_tools(body.get("tools"))
    messages, turn_effort = _parse_messages(body.get("messages"), tools)
    chat: dict[str, Any] = {
        **({"model": body["model"]} if body.get("models") is None else {"models": body["models"]}),
        "messages": [*_system_messages(body.get("system")), *messages],
        **_parse_sampling(body),
        **_parse_tool_choice(body.get("tool_choice"), tools),
    }
    if tools:
        chat["tools"] = tools
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    if response_format is not None:
        chat["response_format"] = response_format
    horde = body.get("horde")
    if horde is not None:
        chat["horde"] = horde
        conformance = horde.get("conformance", conformance) if isinstance(horde, Mapping) else None
    requested = turn_effort or effort or budget_effort
    if requested is not None:
        reasoning, dropped = _reasoning_effort(requested, conformance)
        chat.update(reasoning)
        adjustments += dropped
    stream = _parse_bool(body, "stream")
    chat["stream"] = stream
    _check_metadata(body.get("metadata"))
    return MessagesCall(chat, models[0], stream, thinking, adjustments)


def _reasoning_effort(
    effort: str, conformance: str | None
) -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
    """The effort asked for as the chat body's reasoning_effort, which only a
    worker declaring reasoning_effort may serve; under best_effort it is a
    hint, not sent, and the answer's context_adjustments say so (Claude Code
    sends an effort on every call, decision 0079)."""
    if conformance != "best_effort":
        return {"reasoning_effort": effort}, ()
    dropped = {"field": "effort", "requested": effort, "applied": None, "reason": _EFFORT_REASON}
    return {}, (dropped,)


# Top level ---------------------------------------------------------------------


def _check_top_level(body: Any, known: frozenset[str]) -> None:
    """An object whose keys are all known or no-ops; a key Anthropic serves
    and a horde cannot is refused with its reason, any other key as unknown."""
    if not isinstance(body, Mapping):
        raise invalid("body", f"Expected a JSON object as the body, got {kind_name(body)}.")
    for key, value in body.items():
        if key in known:
            continue
        if key in _NO_OPS:
            if value is not None and not isinstance(value, Mapping | str):
                raise invalid(key, f"Invalid type for '{key}': got {kind_name(value)}.")
            continue
        if value is None:
            continue  # null counts as absent
        if key in _REFUSED:
            raise unsupported(key, f"'{key}' is not supported: {_REFUSED[key]}.")
        raise unsupported(key, f"{key}: Extra inputs are not permitted (unknown to this horde).")


def _parse_bool(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise invalid(key, f"Invalid type for '{key}': expected a boolean.")
    return bool(value)


def _parse_max_tokens(
    value: Any, *, required: bool
) -> tuple[int | None, tuple[dict[str, Any], ...]]:
    """The chat max_tokens and the adjustment when it was lowered. A
    Messages max_tokens is a ceiling ("the model may stop before"): one over
    the horde's bound is lowered to it and reported, never refused."""
    if value is None:
        if required:
            raise invalid("max_tokens", "'max_tokens' is required: the most tokens to generate.")
        return None, ()
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid("max_tokens", f"Invalid type for 'max_tokens': got {kind_name(value)}.")
    if value < 1:
        # Anthropic takes 0 to fill its prompt cache; a horde has none.
        raise invalid("max_tokens", "'max_tokens' must be at least 1 (this horde keeps no cache).")
    if value <= MAX_MAX_LENGTH:
        return value, ()
    lowered = {
        "field": "max_tokens",
        "requested": value,
        "applied": MAX_MAX_LENGTH,
        "reason": _MAX_TOKENS_REASON,
    }
    return MAX_MAX_LENGTH, (lowered,)


def _parse_sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """temperature and top_p (Anthropic's ranges, 0 to 1) and stop_sequences."""
    out: dict[str, Any] = {}
    for key in ("temperature", "top_p"):
        value = openai_number(body, key, 0.0, 1.0)
        if value is not None:
            out[key] = value
    value = body.get("stop_sequences")
    if value is not None and not isinstance(value, list):
        raise invalid("stop_sequences", "Invalid type for 'stop_sequences': expected an array.")
    stops = parse_stop(value, "stop_sequences")
    if stops:
        out["stop"] = stops
    return out


def _check_metadata(value: Any) -> None:
    """``metadata``: only ``user_id``, a string, accepted and not used."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise invalid("metadata", "Invalid type for 'metadata': expected an object.")
    for key, item in value.items():
        if key != "user_id":
            raise unsupported(f"metadata.{key}", f"metadata.{key}: Extra inputs are not permitted.")
        if item is not None and not isinstance(item, str):
            raise invalid("metadata.user_id", "'metadata.user_id' must be a string.")


# Thinking and effort -------------------------------------------------------------


def _parse_thinking(value: Any, max_tokens: Any) -> tuple[str | None, str | None]:
    """``thinking``: (the display of thinking blocks or None, the
    reasoning_effort its budget gives or None)."""
    if value is None:
        return None, None
    if not isinstance(value, Mapping):
        raise invalid("thinking", "Invalid type for 'thinking': expected an object.")
    kind = value.get("type")
    keys = {"enabled": {"budget_tokens", "display"}, "adaptive": {"display"}, "disabled": set()}
    if kind not in keys:
        raise unsupported(
            "thinking.type",
            f"Unsupported thinking.type {kind!r}: this horde takes enabled, adaptive and disabled "
            "(it cannot choose when its workers' models think).",
        )
    _check_keys(value, {"type", *keys[kind]}, "thinking")
    if kind == "disabled":
        return None, None
    display = value.get("display") or "summarized"
    if display not in _THINKING_DISPLAYS:
        raise invalid("thinking.display", "'thinking.display' must be 'summarized' or 'omitted'.")
    if kind == "adaptive":
        return display, None  # the model decides how much to think
    return display, _budget_effort(value.get("budget_tokens"), max_tokens)


def _budget_effort(budget: Any, max_tokens: Any) -> str:
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise invalid("thinking.budget_tokens", "'thinking.budget_tokens' is required: an integer.")
    if budget < MIN_THINKING_BUDGET_TOKENS:
        raise invalid(
            "thinking.budget_tokens",
            f"'thinking.budget_tokens' must be at least {MIN_THINKING_BUDGET_TOKENS}.",
        )
    if isinstance(max_tokens, int) and budget >= max_tokens:
        raise invalid(
            "thinking.budget_tokens", "'thinking.budget_tokens' must be less than 'max_tokens'."
        )
    for below, effort in _BUDGET_EFFORTS:
        if budget < below:
            return effort
    return _LARGEST_BUDGET_EFFORT


def _parse_output_config(value: Any, where: str) -> tuple[str | None, dict[str, Any] | None]:
    """An ``output_config`` (the body's, or a message's: ``where``): (the
    reasoning_effort its effort names, the response_format its format gives)."""
    if value is None:
        return None, None
    if not isinstance(value, Mapping):
        raise invalid(where, f"Invalid type for '{where}': expected an object.")
    _check_keys(value, {"effort", "format"}, where)
    effort = value.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise unsupported(
            f"{where}.effort",
            f"Unsupported {where}.effort {effort!r}: this horde takes "
            f"{', '.join(_EFFORTS)} (a chat request's reasoning_effort has no 'max').",
        )
    return effort, _output_format(value.get("format"), f"{where}.format")


def _output_format(value: Any, where: str) -> dict[str, Any] | None:
    """``output_config.format`` as a strict json_schema response format."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("type") != "json_schema":
        raise unsupported(f"{where}.type", f"'{where}.type' must be 'json_schema'.")
    _check_keys(value, {"type", "schema"}, where)
    schema = value.get("schema")
    if not isinstance(schema, Mapping):
        raise invalid(f"{where}.schema", f"'{where}.schema' is required: a JSON Schema object.")
    check_strict_schema(schema, f"{where}.schema", f"Invalid schema for '{where}'")
    spec = {"name": OUTPUT_FORMAT_NAME, "schema": dict(schema), "strict": True}
    return {"type": "json_schema", "json_schema": spec}


# Tools -----------------------------------------------------------------------------

# The keys a custom tool takes beside name, description and input_schema:
# strict (honoured), no-ops, and keys taken only at their default. The
# no-ops: eager_input_streaming (a tool's input is streamed whole either
# way) and defer_loading (a horde has no tool search: a deferred tool is
# offered to the worker from the start, so that it can be called once the
# client's own tool search has shown it, as Claude Code's does).
_TOOL_KEYS = frozenset(
    {
        "type",
        "name",
        "description",
        "input_schema",
        "strict",
        "eager_input_streaming",
        "defer_loading",
        "cache_control",
    }
)
_TOOL_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "allowed_callers": (["direct"],),
    "input_examples": ([],),
}


def _parse_tools(value: Any) -> list[dict[str, Any]]:
    """Custom tools as chat function tools; a server tool is refused by its type."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("tools", "Invalid type for 'tools': expected an array.")
    if len(value) > MAX_CHAT_TOOLS:
        raise invalid("tools", f"Invalid 'tools': at most {MAX_CHAT_TOOLS} tools are allowed.")
    names: set[str] = set()
    return [_parse_tool(tool, f"tools[{i}]", names) for i, tool in enumerate(value)]


def _parse_tool(tool: Any, at: str, names: set[str]) -> dict[str, Any]:
    if not isinstance(tool, Mapping):
        raise invalid(at, f"Invalid type for '{at}': expected an object.")
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise unsupported(
            f"{at}.type",
            f"The server tool {kind!r} runs on Anthropic's servers, and a horde's workers "
            "cannot run it: only custom tools (name, description, input_schema) are supported.",
        )
    _check_keys(tool, _TOOL_KEYS, at, _TOOL_DEFAULT_ONLY)
    name = tool.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise invalid(f"{at}.name", f"Invalid '{at}.name': must match ^[a-zA-Z0-9_-]{{1,64}}$.")
    if name in names:
        raise _shape_refusal(f"{at}.name", f"Tool names must be unique: {name!r} is repeated.")
    names.add(name)
    function: dict[str, Any] = {"name": name}
    description = tool.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise invalid(f"{at}.description", f"'{at}.description' must be a string.")
        function["description"] = description
    schema = tool.get("input_schema")
    if not isinstance(schema, Mapping):
        raise invalid(f"{at}.input_schema", f"'{at}.input_schema' is required: a JSON Schema.")
    function["parameters"] = dict(schema)
    strict = tool.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(f"{at}.strict", f"'{at}.strict' must be a boolean.")
    if strict:
        check_strict_schema(schema, f"{at}.input_schema", f"Invalid schema for tool '{name}'")
        function["strict"] = True
    return {"type": "function", "function": function}


# tool_choice types as the chat tool_choice (type "tool" names a function).
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _parse_tool_choice(value: Any, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """``tool_choice`` as the chat body's tool_choice and parallel_tool_calls.
    Without tools, auto and none change nothing and are dropped."""
    if value is None:
        return {}
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise invalid("tool_choice.type", "'tool_choice.type' must be auto, any, tool or none.")
    _check_keys(value, {"type", "name", "disable_parallel_tool_use"}, "tool_choice")
    disable = value.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise invalid(
            "tool_choice.disable_parallel_tool_use",
            "'tool_choice.disable_parallel_tool_use' must be a boolean.",
        )
    if not tools:
        if kind in ("auto", "none"):
            return {}
        raise _shape_refusal("tool_choice", f"tool_choice {kind!r} needs 'tools'.")
    out: dict[str, Any] = {"tool_choice": _TOOL_CHOICES.get(kind)}
    if kind == "tool":
        name = value.get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise _shape_refusal("tool_choice.name", f"No tool named {name!r} is in 'tools'.")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    if disable:
        out["parallel_tool_calls"] = False
    return out


# Messages ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Turn:
    """Consecutive messages of one role (Anthropic combines consecutive user
    or assistant messages into one turn; system messages stay apart)."""

    role: str
    where: str  # the first message's path
    blocks: list[tuple[str, Mapping[str, Any]]]  # each block with its path


def _system_messages(value: Any) -> list[dict[str, Any]]:
    """The top-level ``system``, a string or text blocks, as the first chat
    message; an empty one is none."""
    if value is None or value == "" or value == []:
        return []
    if not isinstance(value, str | list):
        raise invalid("system", "Invalid type for 'system': expected a string or text blocks.")
    blocks = list(_blocks(value, "system"))
    return [{"role": "system", "content": _content([_text(b, w, "system") for w, b in blocks])}]


def _parse_messages(
    value: Any, tools: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], str | None]:
    """The messages as chat messages, and the effort a message's own
    output_config asks of this reply (per-turn control), if any."""
    if not isinstance(value, list) or not value:
        raise invalid("messages", "'messages' is required: a non-empty array of messages.")
    if len(value) > MAX_CHAT_MESSAGES:
        raise invalid("messages", f"'messages' has more than {MAX_CHAT_MESSAGES} entries.")
    turns, effort = _turns(value)
    _check_tool_pairs(turns)
    last = next((t for t in reversed(turns) if t.role != "system"), None)
    if last is None or last.role != "user":
        where = last.where if last is not None else "messages"
        raise _shape_refusal(
            where,
            "The last message that is not a system message must be a user message: "
            "this horde does not continue a final assistant message (prefill).",
        )
    definitions = {tool["function"]["name"]: tool["function"] for tool in tools}
    return [m for turn in turns for m in _turn_messages(turn, definitions)], effort


def _turns(messages: list[Any]) -> tuple[list[_Turn], str | None]:
    """The messages as turns, and the effort of the latest message after
    the last assistant message whose output_config names one: what the
    client asks of this reply (an earlier one asked it of a reply given)."""
    turns: list[_Turn] = []
    effort: str | None = None
    for i, raw in enumerate(messages):
        where = f"messages[{i}]"
        role, blocks, asked = _message(raw, where)
        effort = None if role == "assistant" else asked or effort
        if turns and role != "system" and turns[-1].role == role:
            turns[-1].blocks.extend(blocks)
        else:
            turns.append(_Turn(role, where, blocks))
    return turns, effort


def _message(raw: Any, where: str) -> tuple[str, list[tuple[str, Mapping[str, Any]]], str | None]:
    """One message: its role, its blocks, and the effort its output_config names."""
    if not isinstance(raw, Mapping):
        raise invalid(where, f"Invalid type for '{where}': expected an object.")
    _check_keys(raw, {"role", "content", "output_config"}, where)
    role = raw.get("role")
    if role not in _ROLES:
        raise invalid(f"{where}.role", f"'{where}.role' must be one of {', '.join(_ROLES)}.")
    effort, response_format = _parse_output_config(
        raw.get("output_config"), f"{where}.output_config"
    )
    if response_format is not None:
        raise unsupported(
            f"{where}.output_config.format", "A message's output_config takes an effort only."
        )
    return str(role), list(_blocks(raw.get("content"), f"{where}.content")), effort


def _blocks(content: Any, where: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The blocks of a content (a string is one text block), each with its
    path, each an object of a known type with only the keys that type takes."""
    if isinstance(content, str):
        yield where, {"type": "text", "text": content}
        return
    if not isinstance(content, list) or not content:
        raise invalid(where, f"'{where}' must be a string or a non-empty array of blocks.")
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind not in _BLOCK_KEYS:
            raise unsupported(
                f"{at}.type", f"Unsupported block type {kind!r} in '{at}': {_unsupported_why(kind)}"
            )
        _check_keys(block, {"type", "cache_control", *_BLOCK_KEYS[str(kind)]}, at)
        yield at, block


def _unsupported_why(kind: Any) -> str:
    if kind in ("document", "search_result", "container_upload"):
        return "a horde's chat request holds text, images and tool calls only."
    if isinstance(kind, str) and (kind.startswith("server_tool") or kind.endswith("_tool_result")):
        return "server tools run on Anthropic's servers, not on a horde's workers."
    return "not a block type this horde takes."


def _turn_messages(turn: _Turn, tools: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    for where, block in turn.blocks:
        if block["type"] not in _ROLE_BLOCKS[turn.role]:
            raise unsupported(
                f"{where}.type", f"A {turn.role} message cannot hold a {block['type']!r} block."
            )
    if turn.role == "user":
        return _user_messages(turn, tools)
    if turn.role == "assistant":
        return [_assistant_message(turn)]
    return [
        {"role": "system", "content": _content([_text(b, w, "system") for w, b in turn.blocks])}
    ]


def _user_messages(turn: _Turn, tools: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A user turn: a tool message per tool_result (they come first, as
    Anthropic requires), then a user message with the rest."""
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for where, block in turn.blocks:
        if block["type"] == "tool_result":
            if parts:
                raise _shape_refusal(
                    where, "tool_result blocks must come first in a user message, before any other."
                )
            results.append(_tool_message(block, where, tools))
        elif block["type"] == "image":
            parts.append(_image(block, where))
        else:
            parts.append(_text(block, where, "user"))
    return results + ([{"role": "user", "content": _content(parts)}] if parts else [])


def _assistant_message(turn: _Turn) -> dict[str, Any]:
    """An assistant turn: its text and its tool calls. Thinking carried back
    is not sent on: the chat request has no field for an earlier turn's
    reasoning (decision 0079)."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for where, block in turn.blocks:
        if block["type"] == "text":
            parts.append(_text(block, where, "assistant"))
        elif block["type"] == "tool_use":
            calls.append(_tool_call(block, where))
        else:
            _check_thinking(block, where)
    message: dict[str, Any] = {"role": "assistant"}
    if calls:
        message["tool_calls"] = calls
    if parts or not calls:
        message["content"] = _content(parts)
    return message


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A chat content: one text part as its string, else the parts."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts if parts else ""


def _text(block: Mapping[str, Any], where: str, role: str) -> dict[str, Any]:
    if block["type"] != "text":
        raise unsupported(f"{where}.type", f"A {role} message holds text blocks only.")
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid(f"{where}.text", f"'{where}.text' must be a string.")
    if block.get("citations"):
        raise unsupported(
            f"{where}.citations", "Citations are not supported: a horde's workers cite nothing."
        )
    return {"type": "text", "text": text}


def _image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An image block as an image_url part: a base64 source as a data: URL,
    a url source as its http(s) URL."""
    at = f"{where}.source"
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise invalid(at, f"'{at}' is required: an object.")
    kind = source.get("type")
    if kind == "base64":
        _check_keys(source, {"type", "media_type", "data"}, at)
        media_type, data = source.get("media_type"), source.get("data")
        if media_type not in _IMAGE_MEDIA_TYPES:
            raise invalid(
                f"{at}.media_type",
                f"'{at}.media_type' must be one of {', '.join(_IMAGE_MEDIA_TYPES)}.",
            )
        if not isinstance(data, str) or not data:
            raise invalid(f"{at}.data", f"'{at}.data' must be the image's base64.")
        return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}
    if kind == "url":
        _check_keys(source, {"type", "url"}, at)
        url = source.get("url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise invalid(f"{at}.url", f"'{at}.url' must be an http(s) URL.")
        return {"type": "image_url", "image_url": {"url": url}}
    raise unsupported(
        f"{at}.type",
        f"Unsupported image source {kind!r}: this horde takes base64 and url sources "
        "(a file source needs Anthropic's Files API).",
    )


def _tool_call(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A tool_use block as a chat tool call (its input as JSON arguments)."""
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{where}.id", f"'{where}.id' is required: the tool use's id.")
    if not isinstance(name, str) or not name:
        raise invalid(f"{where}.name", f"'{where}.name' is required: the tool's name.")
    if not isinstance(arguments, Mapping):
        raise invalid(f"{where}.input", f"'{where}.input' must be an object.")
    caller = block.get("caller")
    if caller is not None and caller != {"type": "direct"}:
        raise unsupported(f"{where}.caller", "Only direct tool calls are supported.")
    text = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _tool_message(
    block: Mapping[str, Any], where: str, tools: Mapping[str, dict[str, Any]]
) -> dict[str, Any]:
    """A tool_result block as a chat tool message. Its content is text: a
    string, text blocks, and tool_reference blocks, each as the definition
    of the tool it names (what Anthropic expands it to). is_error puts
    TOOL_ERROR_MARK first."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{where}.tool_use_id", f"'{where}.tool_use_id' is required.")
    content = block.get("content")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        parts.append({"type": "text", "text": content})
    elif content is not None and content != []:
        parts.extend(
            _result_part(inner, at, tools) for at, inner in _blocks(content, f"{where}.content")
        )
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise invalid(f"{where}.is_error", f"'{where}.is_error' must be a boolean.")
    if is_error:
        parts.insert(0, {"type": "text", "text": TOOL_ERROR_MARK})
    return {"role": "tool", "tool_call_id": call_id, "content": _content(parts)}


def _result_part(
    block: Mapping[str, Any], where: str, tools: Mapping[str, dict[str, Any]]
) -> dict[str, Any]:
    """A block of a tool result's content as a text part."""
    if block["type"] == "tool_reference":
        name = block.get("tool_name")
        if not isinstance(name, str) or name not in tools:
            raise _shape_refusal(
                f"{where}.tool_name", f"The tool_reference names {name!r}, which is not in 'tools'."
            )
        # Every tool is offered to the worker already (defer_loading is a no-op).
        return {"type": "text", "text": json.dumps(tools[name], ensure_ascii=False)}
    if block["type"] != "text":
        raise unsupported(
            f"{where}.type",
            "A tool result holds text and tool references only here: a chat request takes "
            "images only in user messages.",
        )
    return _text(block, where, "tool")


def _check_thinking(block: Mapping[str, Any], where: str) -> None:
    """A thinking or redacted_thinking block carried back: checked, not sent on."""
    fields = ("thinking", "signature") if block["type"] == "thinking" else ("data",)
    for field in fields:
        if not isinstance(block.get(field), str):
            raise invalid(f"{where}.{field}", f"'{where}.{field}' must be a string.")


def _check_tool_pairs(turns: Sequence[_Turn]) -> None:
    """Anthropic's rule, which the chat request's matches: every tool_use is
    answered by a tool_result in the next message, and every tool_result
    answers a tool_use of the message before it."""
    pending: dict[str, str] = {}  # call id -> the tool_use's path
    opener = ""
    for turn in turns:
        if turn.role == "user":
            for where, block in turn.blocks:
                if block["type"] == "tool_result":
                    if pending.pop(str(block.get("tool_use_id")), None) is None:
                        raise _shape_refusal(
                            f"{where}.tool_use_id",
                            f"Unexpected tool_use_id {block.get('tool_use_id')!r} in a tool_result: "
                            "each tool_result must answer a tool_use of the message before it.",
                        )
        if pending:
            raise _unanswered(opener, pending)
        if turn.role == "assistant":
            pending = _tool_use_ids(turn)
            opener = turn.where
    if pending:
        raise _unanswered(opener, pending)


def _tool_use_ids(turn: _Turn) -> dict[str, str]:
    ids: dict[str, str] = {}
    for where, block in turn.blocks:
        if block["type"] == "tool_use":
            call_id = str(block.get("id"))
            if call_id in ids:
                raise _shape_refusal(f"{where}.id", f"tool_use ids must be unique: {call_id!r}.")
            ids[call_id] = where
    return ids


def _unanswered(where: str, pending: Mapping[str, str]) -> HordeError:
    return _shape_refusal(
        where,
        f"tool_use ids were found without tool_result blocks immediately after: "
        f"{', '.join(pending)}. Each tool_use must be answered by a tool_result in the next message.",
    )


# Shared --------------------------------------------------------------------------------


def _check_keys(
    value: Mapping[str, Any],
    known: set[str] | frozenset[str],
    where: str,
    default_only: Mapping[str, tuple[Any, ...]] | None = None,
) -> None:
    """Refuse a key of ``value`` that is not ``known`` naming it; a key sent
    as null counts as absent, and a key of ``default_only`` passes at one of
    its defaults. ``cache_control`` and the like are in ``known``: no-ops."""
    for key, item in value.items():
        if key in known or item is None:
            continue
        if default_only and key in default_only and item in default_only[key]:
            continue
        raise unsupported(f"{where}.{key}", f"{where}.{key}: not supported by this horde.")


def _shape_refusal(param: str, message: str) -> HordeError:
    """A shape the Messages API refuses, refused the same way here."""
    return HordeError(RC.ChatRequestInvalid, message, param=param)


# Beta flags ------------------------------------------------------------------------------

# anthropic-beta flags by family (the flag less its date), each with why it
# may be sent: what it enables is honoured, or a documented no-op here.
ACCEPTED_BETAS: dict[str, str] = {
    "claude-code": "names Claude Code; it enables nothing",
    "oauth": "says the key is an OAuth token; a horde key is taken as x-api-key or Bearer",
    "interleaved-thinking": "thinking between tool calls: a reply's reasoning is a thinking block",
    "context-management": "context_management is a no-op",
    "prompt-caching": "cache_control is a no-op",
    "prompt-caching-scope": "cache_control is a no-op",
    "extended-cache-ttl": "cache_control is a no-op",
    "fine-grained-tool-streaming": "a tool's input is streamed whole, which this flag allows",
    "mid-conversation-system": "system messages in messages are honoured",
    "effort": "output_config.effort is honoured",
    "token-efficient-tools": "how Anthropic's models see tools; nothing here",
    "output-128k": "a max_tokens over the horde's bound is lowered and reported",
    "context-1m": "the context is the workers' own",
    "structured-outputs": "output_config.format is honoured",
    "mid-conversation-tool-changes": "tools may change between calls; nothing checks them",
    "thinking-token-count": "usage gives output_tokens_details.thinking_tokens",
    "advanced-tool-use": "defer_loading is a no-op and tool_reference blocks are expanded; "
    "input_examples and other callers are refused by field",
    "per-turn-control": "a message's output_config.effort is honoured",
}
_FLAG_DATE = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")


def check_beta_flags(header: str | None) -> tuple[str, ...]:
    """The flags of an ``anthropic-beta`` header (comma-separated), each of
    a family in ACCEPTED_BETAS; any other flag is refused by name, since
    what it turns on is neither honoured nor a no-op here."""
    flags = tuple(f.strip() for f in (header or "").split(",") if f.strip())
    for flag in flags:
        if _FLAG_DATE.sub("", flag) not in ACCEPTED_BETAS:
            raise unsupported(
                "anthropic-beta",
                f"The beta flag {flag!r} turns on a feature this horde does not offer.",
            )
    return flags


# The models list -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelsQuery:
    """The paging of ``GET /v1/models`` asked in Anthropic's shape."""

    limit: int = MODELS_LIST_LIMIT
    after_id: str | None = None
    before_id: str | None = None


def parse_models_query(pairs: Sequence[tuple[str, str]]) -> ModelsQuery:
    """``limit`` (1 to MAX_MODELS_LIST_LIMIT), ``after_id`` and
    ``before_id`` from a query (the first of each; any other parameter, such
    as ``beta=true``, changes nothing); 400 naming ``limit`` when it is not
    a whole number in range."""
    first: dict[str, str] = {}
    for key, value in pairs:
        first.setdefault(key, value)
    limit = first.get("limit")
    return ModelsQuery(
        MODELS_LIST_LIMIT if limit is None else parse_count(limit, "limit", MAX_MODELS_LIST_LIMIT),
        first.get("after_id"),
        first.get("before_id"),
    )
