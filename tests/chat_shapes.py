"""The shapes of chat bodies the chat tests build again and again: a tool
a request offers, a strict response format, and an assistant message
calling tools."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def string_object(strings: Sequence[str], *, closed: bool = False) -> dict[str, Any]:
    """The JSON schema of an object of the required string fields
    ``strings`` (``closed``: and no others)."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {field: {"type": "string"} for field in strings},
        "required": list(strings),
    }
    if closed:
        schema["additionalProperties"] = False
    return schema


def json_schema_format(name: str, strings: Sequence[str]) -> dict[str, Any]:
    """A strict ``response_format`` asking for an object of the string fields ``strings``."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": name,
            "strict": True,
            "schema": string_object(strings, closed=True),
        },
    }


def function_tool(
    name: str, description: str | None = None, *, strings: Sequence[str], closed: bool = False
) -> dict[str, Any]:
    """A function tool whose arguments are the required string fields
    ``strings`` (``closed``: and no others)."""
    parameters = string_object(strings, closed=closed)
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def tool_call(call_id: str, name: str, arguments: str = "{}") -> dict[str, Any]:
    """One call of a tool, its arguments as the JSON text a model writes."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def calling(*calls: dict[str, Any]) -> dict[str, Any]:
    """The assistant message that makes ``calls`` and says nothing."""
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}
