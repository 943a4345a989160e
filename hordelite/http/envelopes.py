"""The one place where a refusal becomes an HTTP answer, in the envelope of
the route family that refuses it.

- The native envelope (the AI Horde's): ``{"message", "rc", ...}`` with the
  return code's HTTP status, ``errors`` naming the field of a validation
  failure, ``Retry-After`` on a budget's 429.
- OpenAI's: ``{"error": {"message", "type", "param", "code", "metadata"}}``,
  ``code`` the horde return code. Statuses follow OpenAI where it has one and
  OpenRouter's vocabulary where it does not: 402 for kudos, 502 for a
  worker's failure, 503 for capacity and availability
  (docs/reference/openai_front.md).
- Anthropic's, for the Messages API: ``{"type": "error", "error": {"type",
  "message", ...}}``, the OpenAI front's statuses with Anthropic's error
  types, 529 ``overloaded_error`` in place of 503
  (docs/reference/messages_api.md).

Any exception a route raises is first made a refusal (``as_refusal``): a
``HordeError`` is one already; storage that does not answer is 503
``StorageUnavailable``; anything else is logged with its traceback and
answered 500 ``InternalServerError``, never with its text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from hordelite.errors import RC, HordeError, StorageUnavailable
from hordelite.http.answer import Answer, json_answer

log = logging.getLogger("hordelite.api")

# A route family's envelope: a refusal as its answer.
Envelope = Callable[[HordeError], Answer]

# Where the OpenAI family's routes live: a refusal of any path under it
# (an unknown one too) is in OpenAI's envelope, except under the Messages
# API's path, whose refusals are Anthropic's (an SDK reads no other).
OPENAI_PREFIX = "/v1"
ANTHROPIC_PATH = "/v1/messages"


def as_refusal(exc: Exception, where: str) -> HordeError:
    """``exc`` as the refusal it answers (see the module); ``where`` names
    the request in the log."""
    if isinstance(exc, HordeError):
        return exc
    if isinstance(exc, StorageUnavailable):
        log.error("storage unavailable on %s: %s", where, exc)
        return HordeError(RC.StorageUnavailable)
    log.error("unexpected error on %s", where, exc_info=exc)
    return HordeError(RC.InternalServerError)


def native(exc: HordeError) -> Answer:
    """The AI Horde's envelope."""
    extra = exc.extra
    headers = []
    if "retry_after" in extra:  # a budget's 429: when trying again can pass
        headers.append(("Retry-After", str(extra["retry_after"])))
    body = {"message": exc.message or exc.rc.default_message, "rc": exc.rc.name, **extra}
    return json_answer(body, exc.rc.status, headers)


# rc -> (status on the OpenAI front, OpenAI error type)
_OPENAI: dict[RC, tuple[int, str]] = {
    RC.InvalidAPIKey: (401, "authentication_error"),
    RC.AnonymousDisabled: (401, "authentication_error"),
    RC.KudosUpfront: (402, "insufficient_kudos"),
    RC.MaxKudosExceeded: (402, "insufficient_kudos"),
    RC.WrongCredentials: (403, "permission_error"),
    RC.TimeoutIP: (403, "permission_error"),
    RC.model_not_found: (404, "invalid_request_error"),
    RC.no_worker_supports_features: (404, "invalid_request_error"),
    RC.RequestNotFound: (404, "not_found_error"),
    RC.NotFound: (404, "not_found_error"),
    RC.MethodNotAllowed: (405, "invalid_request_error"),
    RC.RequestTimeout: (408, "timeout"),
    RC.OperationKeyReused: (409, "invalid_request_error"),
    RC.PayloadTooLarge: (413, "invalid_request_error"),
    RC.TooManyPrompts: (429, "rate_limit_error"),
    RC.RequestRateExceeded: (429, "rate_limit_error"),
    RC.StoredBytesExceeded: (429, "rate_limit_error"),
    RC.InternalServerError: (500, "server_error"),
    RC.ChatRequestFaulted: (502, "upstream_error"),
    RC.ChatWorkerFault: (502, "upstream_error"),
    RC.ChatStreamDiverged: (502, "upstream_error"),
    RC.FrontAtCapacity: (503, "service_unavailable"),
    RC.no_eligible_worker: (503, "service_unavailable"),
    RC.queue_unavailable: (503, "service_unavailable"),
    RC.StorageUnavailable: (503, "service_unavailable"),
    RC.ShuttingDown: (503, "service_unavailable"),
}


def openai_status(rc: RC) -> tuple[int, str]:
    """The OpenAI front's HTTP status and error type for a return code."""
    if rc in _OPENAI:
        return _OPENAI[rc]
    if rc.status < 500:
        return rc.status, "invalid_request_error"
    return rc.status, "server_error"


def openai_error(exc: HordeError, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """OpenAI's error document (also a stream's last event)."""
    _, kind = openai_status(exc.rc)
    return {
        "error": {
            "message": exc.message,
            "type": kind,
            "param": _param(exc),
            "code": exc.rc.name,
            "metadata": _metadata(exc, metadata) or None,
        }
    }


def _param(exc: HordeError) -> str | None:
    """The field a refusal names, if any."""
    return exc.extra.get("param") or _named_field(exc)


def _metadata(exc: HordeError, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The refusal's extra fields (less the field it names) and ``metadata``."""
    meta = {k: v for k, v in exc.extra.items() if k not in ("param", "errors")}
    meta.update(metadata or {})
    return meta


def _refusal_headers(exc: HordeError, held: bool) -> list[tuple[str, str]]:
    """``held``: the horde may hold the request, so the SDK must not retry
    on its own (a retry is a second charged request); Retry-After when the
    refusal says when trying again can pass."""
    headers = []
    if held:
        headers.append(("x-should-retry", "false"))
    retry_after = exc.extra.get("retry_after")
    if retry_after is not None:
        headers.append(("Retry-After", str(retry_after)))
    return headers


def openai(
    exc: HordeError, *, held: bool = False, metadata: dict[str, Any] | None = None
) -> Answer:
    """OpenAI's envelope (``held``: see _refusal_headers)."""
    status, _ = openai_status(exc.rc)
    return json_answer(openai_error(exc, metadata), status, _refusal_headers(exc, held))


# Anthropic's error type for each status the front answers with; the OpenAI
# front's statuses are kept, but its 503 is Anthropic's 529 overloaded_error
# (capacity, availability, a stopping horde: try again later).
_ANTHROPIC_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
ANTHROPIC_OVERLOADED = 529


def anthropic_status(rc: RC) -> tuple[int, str]:
    """The Messages API's HTTP status and error type for a return code."""
    status, _ = openai_status(rc)
    if status == 503:
        status = ANTHROPIC_OVERLOADED
    if status in _ANTHROPIC_TYPES:
        return status, _ANTHROPIC_TYPES[status]
    return status, ("api_error" if status >= 500 else "invalid_request_error")


def anthropic_error(exc: HordeError, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Anthropic's error document (also a stream's ``error`` event):
    ``{"type": "error", "error": {"type", "message"}}``, with the horde's
    ``code`` and the field refused (``param``) beside them, the request's
    id as ``request_id`` once it is queued, and any other detail
    (``worker_rc``, ``retry_after``) as ``error.metadata``."""
    _, kind = anthropic_status(exc.rc)
    meta = _metadata(exc, metadata)
    request_id = meta.pop("request_id", None)
    error: dict[str, Any] = {
        "type": kind,
        "message": exc.message,
        "code": exc.rc.name,
        "param": _param(exc),
    }
    if meta:
        error["metadata"] = meta
    document: dict[str, Any] = {"type": "error", "error": error}
    if request_id is not None:
        document["request_id"] = request_id
    return document


def anthropic(
    exc: HordeError, *, held: bool = False, metadata: dict[str, Any] | None = None
) -> Answer:
    """Anthropic's envelope (``held``: see _refusal_headers; the anthropic
    SDK reads x-should-retry as the openai one does)."""
    status, _ = anthropic_status(exc.rc)
    return json_answer(anthropic_error(exc, metadata), status, _refusal_headers(exc, held))


def _named_field(exc: HordeError) -> str | None:
    """The field a validation failure names (bad_request's ``errors`` map)."""
    errors = exc.extra.get("errors")
    if isinstance(errors, dict) and len(errors) == 1:
        return str(next(iter(errors)))
    return None


def for_path(path: str) -> Envelope:
    """The envelope of the route family ``path`` belongs to (a path no
    route serves included): Anthropic's at /v1/messages and under it,
    OpenAI's elsewhere under /v1, the native one elsewhere."""
    if path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/"):
        return anthropic
    if path.startswith(OPENAI_PREFIX):
        return openai
    return native
