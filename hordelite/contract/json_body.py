"""The one gate every JSON body passes: bytes in, checked values out.

Every string a client or worker sends is checked here, once, before any rule
or store sees it, so that nothing downstream has to ask whether a string can
be encoded, stored or handed to a worker:

- the bytes are strict UTF-8 (raw surrogate bytes such as ``ED A0 80`` are
  refused: Python's ``json.loads(bytes)`` would let them through);
- no string, key or value, holds an unpaired surrogate (``"\\ud800"``
  decodes to one) or NUL (PostgreSQL cannot store it, C backends cut at it);
- every number is finite (``Infinity``, ``NaN`` and ``1e400`` are refused);
- nesting is at most ``MAX_JSON_DEPTH`` levels.

A refusal is ``bad_request(field, why)`` naming the dotted path of the value
(``messages.0.content``), or ``body`` for the document as a whole.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from hordelite.contract.limits import MAX_JSON_DEPTH
from hordelite.errors import HordeError, bad_request

# An escape that can decode to a surrogate half or to NUL. Raw surrogates
# cannot survive strict UTF-8 decoding and raw control characters are not
# JSON, so without one of these escapes the strings need no second look.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


def decode_json_body(raw: bytes) -> Any:
    """The decoded document; raises ``HordeError`` (400 BadRequest) naming the field.

    Pure and synchronous: the caller decides whether a large body is decoded
    off the event loop.
    """
    if not raw:
        raise bad_request("body", "a JSON body is required")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request("body", f"is not valid UTF-8 (byte {exc.start})") from None
    try:
        # The C scanner guards its recursion with Python's recursion limit,
        # so a body nested thousands deep raises here instead of overflowing
        # the stack; anything that deep is past MAX_JSON_DEPTH anyway.
        document = json.loads(text)
    except RecursionError:
        raise _too_deep("body") from None
    except ValueError as exc:
        raise bad_request("body", f"is not valid JSON ({_position(exc)})") from None
    check_json_value(document, check_strings=bool(_SUSPECT_ESCAPE.search(text)))
    return document


def check_json_value(document: Any, *, check_strings: bool = True, root: str = "") -> None:
    """Refuse a non-finite number, a string with a surrogate half or NUL, or
    nesting past ``MAX_JSON_DEPTH``, naming the first such value's path.

    Walks with an explicit stack: the document may be as deep as the parser
    allowed, and this must not recurse over it.
    """
    stack: list[tuple[str, Any, int]] = [(root, document, 0)]
    while stack:
        path, value, depth = stack.pop()
        if isinstance(value, str):
            if check_strings:
                _check_string(path, value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise bad_request(path or "body", "expected a finite number")
        elif isinstance(value, dict | list):
            stack.extend(_children(path, value, depth, check_strings))


def _children(
    path: str, value: dict[Any, Any] | list[Any], depth: int, check_strings: bool
) -> list[tuple[str, Any, int]]:
    """The members of an object or array one level down, each with its path;
    refuses the container past MAX_JSON_DEPTH, or a key that breaks the
    string rule."""
    if depth >= MAX_JSON_DEPTH:
        raise _too_deep(path or "body")
    items = value.items() if isinstance(value, dict) else enumerate(value)
    children = []
    for key, item in items:
        child = f"{path}.{key}" if path else str(key)
        if check_strings and isinstance(key, str) and _BAD_CHAR.search(key):
            raise bad_request(path or "body", _string_why(key, "a key"))
        children.append((child, item, depth + 1))
    return children


def check_text(field: str, value: str) -> None:
    """The string rule for text outside a body (a path segment, a query
    value): no NUL, no surrogate half; 400 naming ``field`` otherwise."""
    _check_string(field, value)


def _check_string(path: str, value: str) -> None:
    if _BAD_CHAR.search(value):
        raise bad_request(path or "body", _string_why(value, "the string"))


def _string_why(value: str, what: str) -> str:
    if "\x00" in value:
        return f"{what} contains NUL (\\u0000), which is not accepted"
    return f"{what} contains an unpaired surrogate (\\ud800-\\udfff), which is not valid Unicode"


def _too_deep(field: str) -> HordeError:
    return bad_request(field, f"is nested deeper than {MAX_JSON_DEPTH} levels")


def _position(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    # int() past sys.get_int_max_str_digits raises a plain ValueError.
    return str(exc)
