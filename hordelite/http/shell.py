"""The shell: Quart (QuartTrio on trio) serving the routes that are pages
rather than API answers, the dashboard's HTML from its template and its
static files (decision 0076).

Quart earns its place here: Jinja templates with autoescaping and
``url_for``, static files with their types, ETags, conditional and range
requests. The dispatcher (hordelite/http/dispatch.py) hands it only the
table's shell routes, each registered here from the table and nowhere else;
it adds their CORS headers and counts them as it does every route's.
"""

from __future__ import annotations

from collections.abc import Iterable

from quart import Blueprint, Quart, Response
from werkzeug.exceptions import HTTPException

from hordelite.errors import RC, HordeError
from hordelite.http.answer import Answer
from hordelite.http.dispatch import CountRefusal, Route
from hordelite.http.envelopes import as_refusal, native
from hordelite.http.loop import quart_app

# The HTTP errors Werkzeug raises in the shell, as return codes.
_HTTP_CODES = {
    404: RC.NotFound,
    405: RC.MethodNotAllowed,
    408: RC.RequestTimeout,
    413: RC.PayloadTooLarge,
}


def shell_app(
    backend: str,
    routes: Iterable[Route],
    files: Blueprint,
    headers: Iterable[tuple[str, str]],
    count_refusal: CountRefusal,
) -> Quart:
    """The Quart app for ``backend`` serving the shell routes of ``routes``:
    each with a view is registered here; ``files`` holds the templates and
    the static files; ``headers`` go on every answer."""
    app = quart_app("hordelite", backend)
    # Werkzeug answers a path with '//' by an HTML redirect to the merged
    # path; every answer here is the horde's, so such a path is not found.
    app.url_map.merge_slashes = False
    app.register_blueprint(files)
    for route in routes:
        if route.handler is None and route.view is not None:
            app.add_url_rule(route.template, route.template, route.view, methods=[route.method])
    fixed = list(headers)

    @app.after_request
    async def _headers(response: Response) -> Response:
        for name, value in fixed:
            response.headers[name] = value
        return response

    def refused(exc: Exception) -> Response:
        refusal = as_refusal(exc, "a shell page")
        count_refusal(refusal.rc)
        return _response(native(refusal))

    @app.errorhandler(Exception)
    async def _error(exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            rc = _HTTP_CODES.get(exc.code or 500, RC.InternalServerError)
            return refused(HordeError(rc))
        return refused(exc)

    return app


def _response(answer: Answer) -> Response:
    return Response(answer.body, status=answer.status, headers=dict(answer.headers))
