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
# (an unknown one too) is in OpenAI's envelope.
OPENAI_PREFIX = "/v1"


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
    meta = {k: v for k, v in exc.extra.items() if k not in ("param", "errors")}
    meta.update(metadata or {})
    return {
        "error": {
            "message": exc.message,
            "type": kind,
            "param": exc.extra.get("param") or _named_field(exc),
            "code": exc.rc.name,
            "metadata": meta or None,
        }
    }


def openai(
    exc: HordeError, *, held: bool = False, metadata: dict[str, Any] | None = None
) -> Answer:
    """OpenAI's envelope. ``held``: the horde may hold the request, so the
    SDK must not retry on its own (a retry is a second charged request)."""
    status, _ = openai_status(exc.rc)
    headers = []
    if held:
        headers.append(("x-should-retry", "false"))
    retry_after = exc.extra.get("retry_after")
    if retry_after is not None:
        headers.append(("Retry-After", str(retry_after)))
    return json_answer(openai_error(exc, metadata), status, headers)


def _named_field(exc: HordeError) -> str | None:
    """The field a validation failure names (bad_request's ``errors`` map)."""
    errors = exc.extra.get("errors")
    if isinstance(errors, dict) and len(errors) == 1:
        return str(next(iter(errors)))
    return None


def for_path(path: str) -> Envelope:
    """The envelope of the route family ``path`` belongs to (a path no
    route serves included): OpenAI's under /v1, the native one elsewhere."""
    if path.startswith(OPENAI_PREFIX):
        return openai
    return native
