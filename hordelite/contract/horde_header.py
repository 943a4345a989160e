"""The ``horde`` options of a client that cannot add a body field.

Coding agents (Codex CLI, Claude Code, the Agents SDK) build their own
bodies: none can add hordelite's ``horde`` object. Each /v1 route takes the
same options from the ``X-Horde-Options`` header, a JSON object with the
``horde`` object's keys (docs/reference/openai_front.md). The header fills
the keys the body's own ``horde`` object leaves out; a key the body sets
wins. The chat request's own check (``chat_request``) then validates the
merged object, naming an unknown or bad key ``horde.<key>``.
"""

from __future__ import annotations

import json
from typing import Any

from hordelite.contract.limits import MAX_HORDE_OPTIONS_HEADER_CHARS
from hordelite.errors import bad_request

HORDE_OPTIONS_HEADER = "x-horde-options"
# How a refusal names the header (its field).
HEADER_FIELD = "X-Horde-Options"


def header_options(header: str | None) -> dict[str, Any]:
    """The options the header carries ({} without one); 400 naming the
    header when it is too long or not a JSON object."""
    if header is None:
        return {}
    if len(header) > MAX_HORDE_OPTIONS_HEADER_CHARS:
        raise bad_request(
            HEADER_FIELD, f"must be at most {MAX_HORDE_OPTIONS_HEADER_CHARS} characters"
        )
    try:
        options = json.loads(header)
    except ValueError:
        options = None
    if not isinstance(options, dict):
        raise bad_request(
            HEADER_FIELD, 'must be a JSON object, e.g. {"conformance": "best_effort"}'
        )
    return options


def with_options(body: Any, options: dict[str, Any]) -> Any:
    """``body`` (a chat request's) with the header's ``options`` under its
    ``horde`` object, the body's own keys winning. A body or ``horde``
    value of the wrong type is returned as it is, for its own check to
    refuse."""
    if not options or not isinstance(body, dict):
        return body
    own = body.get("horde")
    if own is None:
        return {**body, "horde": options}
    if not isinstance(own, dict):
        return body
    return {**body, "horde": {**options, **own}}
