"""Small readers for JSON bodies: each names the field it refuses.

Every reader raises ``bad_request(field, why)``, a 400 whose message and
``errors`` map name the dotted field path.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from hordelite.contract.limits import MAX_ID_CHARS
from hordelite.errors import bad_request

_MISSING: Any = object()


def expect_object(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise bad_request(field, f"expected a JSON object, got {kind_name(value)}")
    return value


def kind_name(value: Any) -> str:
    """How an error message names the JSON type of ``value``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _given(body: Mapping[str, Any], key: str, field: str, default: Any) -> Any:
    """``body[key]``, or _MISSING where the caller answers ``default``: the
    field is absent, or null and a default is given. A field absent with no
    default is refused as required."""
    value = body.get(key, _MISSING)
    if value is _MISSING or (value is None and default is not _MISSING):
        if default is _MISSING:
            raise bad_request(field, "is required")
        return _MISSING
    return value


def get_int(
    body: Mapping[str, Any], key: str, field: str, lo: int, hi: int, default: Any = _MISSING
) -> Any:
    return _ranged(body, key, field, lo, hi, default, _integer)


def get_number(
    body: Mapping[str, Any], key: str, field: str, lo: float, hi: float, default: Any = _MISSING
) -> Any:
    return _ranged(body, key, field, lo, hi, default, _number)


def _ranged(
    body: Mapping[str, Any],
    key: str,
    field: str,
    lo: float,
    hi: float,
    default: Any,
    kind: Callable[[Any, str], Any],
) -> Any:
    """``body[key]`` as ``kind`` reads it, within ``lo`` to ``hi``; or ``default``."""
    value = _given(body, key, field, default)
    if value is _MISSING:
        return default
    value = kind(value, field)
    if not lo <= value <= hi:
        raise bad_request(field, f"{value} is outside {lo} to {hi}")
    return value


def _integer(value: Any, field: str) -> int:
    # JSON has one number type: 80.0 is accepted as 80, 80.5 is not.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(field, f"expected an integer, got {kind_name(value)}")
    return value


def _number(value: Any, field: str) -> Any:
    if not is_number(value):
        raise bad_request(field, f"expected a number, got {kind_name(value)}")
    return value


def is_number(value: Any) -> bool:
    """Whether ``value`` is a JSON number: not a boolean (which Python counts
    as an int), and finite (Python's JSON reads NaN and Infinity)."""
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and not (isinstance(value, float) and not math.isfinite(value))
    )


def get_bool(body: Mapping[str, Any], key: str, field: str, default: bool) -> bool:
    value = body.get(key, _MISSING)
    if value is _MISSING or value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(field, f"expected true or false, got {kind_name(value)}")
    return value


def get_str(
    body: Mapping[str, Any], key: str, field: str, max_len: int, default: Any = _MISSING
) -> Any:
    value = _given(body, key, field, default)
    if value is _MISSING:
        return default
    if not isinstance(value, str):
        raise bad_request(field, f"expected a string, got {kind_name(value)}")
    if len(value) > max_len:
        raise bad_request(field, f"is longer than {max_len} characters")
    return value


def get_str_list(
    body: Mapping[str, Any], key: str, field: str, max_items: int, max_len: int
) -> list[str]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request(field, f"expected an array of strings, got {kind_name(value)}")
    if len(value) > max_items:
        raise bad_request(field, f"has more than {max_items} entries")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise bad_request(f"{field}.{i}", f"expected a string, got {kind_name(item)}")
        if len(item) > max_len:
            raise bad_request(f"{field}.{i}", f"is longer than {max_len} characters")
    return list(value)


def parse_uuid(value: Any) -> str | None:
    """The canonical form of a UUID string, or None when it is not one."""
    if not isinstance(value, str) or len(value) > MAX_ID_CHARS:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None
