"""The OpenAI error envelope and the front's status for every return code.

``{"error": {"message", "type", "param", "code", "metadata"}}``, ``code`` the
horde return code. Statuses follow OpenAI where it has one and OpenRouter's
vocabulary where it does not: 402 for kudos, 502 for a worker's failure, 503
for capacity and availability (docs/reference/openai_front.md).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from quart import Response
from werkzeug.datastructures import Headers

from hordelite._request import horde
from hordelite.errors import RC, HordeError

if TYPE_CHECKING:
    from hordelite.front.openai import Answer
    from hordelite.horde.service import Horde

# rc -> (status on the front, OpenAI error type)
_FRONT: dict[RC, tuple[int, str]] = {
    RC.InvalidAPIKey: (401, "authentication_error"),
    RC.AnonymousDisabled: (401, "authentication_error"),
    RC.KudosUpfront: (402, "insufficient_kudos"),
    RC.MaxKudosExceeded: (402, "insufficient_kudos"),
    RC.WrongCredentials: (403, "permission_error"),
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


def front_status(rc: RC) -> tuple[int, str]:
    """The front's HTTP status and error type for a return code."""
    if rc in _FRONT:
        return _FRONT[rc]
    if rc.status < 500:
        return rc.status, "invalid_request_error"
    return rc.status, "server_error"


def envelope(exc: HordeError, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    _, kind = front_status(exc.rc)
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


def _named_field(exc: HordeError) -> str | None:
    """The field a validation failure names (bad_request's ``errors`` map)."""
    errors = exc.extra.get("errors")
    if isinstance(errors, dict) and len(errors) == 1:
        return str(next(iter(errors)))
    return None


def error_response(
    exc: HordeError, *, held: bool = False, metadata: dict[str, Any] | None = None
) -> Response:
    """The error as Quart's answer (see ``error_answer``)."""
    answer = error_answer(horde(), exc, held=held, metadata=metadata)
    return Response(answer.body, status=answer.status, headers=Headers(answer.headers))


def error_answer(
    horde: Horde, exc: HordeError, *, held: bool = False, metadata: dict[str, Any] | None = None
) -> Answer:
    """The error as an HTTP answer, counted among the refusals. ``held``: the
    horde may hold the request, so the SDK must not retry on its own (a
    retry is a second charged request)."""
    from hordelite.front.openai import Answer

    status, _ = front_status(exc.rc)
    horde.metrics.refusals.labels(exc.rc.name).inc()
    headers = [("content-type", "application/json")]
    if held:
        headers.append(("x-should-retry", "false"))
    retry_after = exc.extra.get("retry_after")
    if retry_after is not None:
        headers.append(("Retry-After", str(retry_after)))
    return Answer(status, headers, json.dumps(envelope(exc, metadata)).encode())
