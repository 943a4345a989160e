"""Build the Quart app for a Horde: QuartTrio on trio, Quart on asyncio.

The blueprints are the same on both; only the app class differs. The app is
assembled here, above the native routes (``hordelite.api``) and the OpenAI
front (``hordelite.front``), so that neither of the two imports the other.
"""

from __future__ import annotations

import logging
from typing import Any

from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException

from hordelite._request import count_refusal
from hordelite.api.blobs import blobs
from hordelite.api.dashboard import dashboard
from hordelite.api.health import health
from hordelite.api.metrics import count_request, metrics
from hordelite.api.native import http_error_response, json_response, native
from hordelite.api.native_about import about
from hordelite.api.native_keys import sharedkeys
from hordelite.blobs import DirectoryStore
from hordelite.contract.json_body import check_text
from hordelite.errors import RC, HordeError, StorageUnavailable
from hordelite.front._errors import error_response
from hordelite.front.openai import Admission, front
from hordelite.horde.service import Horde
from hordelite.http.server import quart_app

log = logging.getLogger("hordelite.api")

_HTTP_CODES = {
    404: RC.NotFound,
    405: RC.MethodNotAllowed,
    408: RC.RequestTimeout,
    413: RC.PayloadTooLarge,
}


def _error(rc: RC, message: str | None = None, **extra: Any) -> Response:
    """A refusal in the envelope of the route family: OpenAI's under /v1."""
    if request.path.startswith("/v1"):
        return error_response(HordeError(rc, message, **extra))
    count_refusal(rc)  # error_response counts those of the front
    response = json_response(
        {"message": message or rc.default_message, "rc": rc.name, **extra}, rc.status
    )
    if "retry_after" in extra:  # a budget's 429: when trying again can pass
        response.headers["Retry-After"] = str(extra["retry_after"])
    return response


def create_app(
    horde: Horde, backend: str = "trio", blob_store: DirectoryStore | None = None
) -> Quart:
    """The app serving ``horde``; with a ``blob_store``, also its blobs'
    signed URLs (``GET /blobs/<key>``)."""
    app = quart_app("hordelite", backend)
    app.config["HORDE"] = horde
    app.config["MAX_CONTENT_LENGTH"] = horde.config.server.max_body_bytes
    # Quart answers 408 itself when a body does not arrive in time.
    app.config["BODY_TIMEOUT"] = horde.config.server.body_timeout
    # Werkzeug answers a path with '//' by an HTML redirect to the merged
    # path; every answer here is JSON, so such a path is simply not found.
    app.url_map.merge_slashes = False
    app.register_blueprint(native)
    app.register_blueprint(about)
    app.register_blueprint(sharedkeys)
    app.register_blueprint(health)
    app.register_blueprint(front)
    if horde.config.dashboard.enabled:
        app.register_blueprint(dashboard)
    if horde.config.metrics.enabled:
        if not horde.config.metrics.port:
            app.register_blueprint(metrics)
        # With metrics off nothing reads the count: no request pays for it.
        app.after_request(count_request)
    if blob_store is not None:
        app.config["BLOBS"] = blob_store
        app.register_blueprint(blobs)
    app.config["FRONT_ADMISSION"] = Admission(horde.config.front)

    @app.before_request
    async def _check_url() -> None:
        # Path segments and query values are text like a body's strings:
        # a NUL or a surrogate half is refused here, before any route.
        for name, value in (request.view_args or {}).items():
            if isinstance(value, str):
                check_text(name, value)
        for name, value in request.args.items(multi=True):
            check_text(name, value)

    @app.errorhandler(HordeError)
    async def _horde_error(exc: HordeError) -> Response:
        return _error(exc.rc, exc.message, **exc.extra)

    @app.errorhandler(StorageUnavailable)
    async def _storage_error(exc: StorageUnavailable) -> Response:
        log.error("storage unavailable: %s", exc)
        return _error(RC.StorageUnavailable)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        rc = _HTTP_CODES.get(exc.code or 500)
        return http_error_response(exc) if rc is None else _error(rc)

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return _error(RC.InternalServerError)

    allowed = horde.config.server.allowed_origins

    @app.after_request
    async def _cors(response: Response) -> Response:
        if allowed is None:
            response.headers["Access-Control-Allow-Origin"] = "*"
        else:
            # The answer depends on the Origin now: a cache must not hand one
            # origin's answer to another.
            response.vary.add("Origin")
            origin = request.headers.get("Origin", "")
            if origin.lower() not in allowed:
                return response  # no header: the browser keeps the answer from the page
            response.headers["Access-Control-Allow-Origin"] = origin
        if request.method == "OPTIONS":
            response.headers["Access-Control-Allow-Headers"] = "*"
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, PUT, DELETE, OPTIONS"
        return response

    return app
