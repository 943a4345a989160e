"""The request headers every route reads the same way (hordelite/http/request.py
reads them for every route): the API key, the idempotency key, the client's
agent."""

from __future__ import annotations

from hordelite.contract.limits import MAX_API_KEY_CHARS, MAX_IDEMPOTENCY_KEY_CHARS
from hordelite.errors import RC, HordeError, bad_request


def checked_api_key(key: str | None) -> str:
    """The apikey header's value, refused when missing or longer than any key."""
    if key is None or key == "":
        raise HordeError(
            RC.InvalidAPIKey,
            "The apikey header is missing: send your API key, or 0000000000 for anonymous use.",
        )
    if len(key) > MAX_API_KEY_CHARS:
        raise HordeError(RC.InvalidAPIKey, "The apikey header is longer than any key.")
    return key


def checked_operation_key(key: str | None) -> str | None:
    """An Idempotency-Key header's value, refused outside 1 to
    MAX_IDEMPOTENCY_KEY_CHARS characters, or holding a control character
    (HTTP/1.1 headers cannot carry one; the keys a shared key's requests
    are stored under start with one, contract.shared_keys)."""
    if key is not None and not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_CHARS:
        raise bad_request("Idempotency-Key", f"must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters")
    if key is not None and any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        raise bad_request("Idempotency-Key", "must not hold control characters")
    return key


def client_agent_of(dashed: str | None, underscored: str | None) -> str:
    """The client's agent: koboldcpp and most tools send Client-Agent,
    horde_sdk sends client_agent."""
    return dashed or underscored or "unknown:0:unknown"
