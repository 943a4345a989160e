"""The one dispatcher: every route of the table (hordelite/http/routes.py)
answered from a framework-free ``Request`` to an ``Answer``.

For each HTTP exchange it:

- finds the route by method and path (``Table``): a path no route has is 404
  and a method the path does not take is 405, each in the envelope of the
  path's family; ``HEAD`` is answered as ``GET`` without the body (unless
  a route takes ``HEAD`` itself), and ``OPTIONS`` (a CORS preflight) by the
  methods the path takes;
- refuses a path parameter or query value holding a NUL or a surrogate half,
  before the route runs (contract.json_body.check_text);
- runs the route's handler, and makes any exception it raises a refusal in
  the route's envelope (hordelite/http/envelopes.py), counted by its rc;
- sends the answer with its length, the CORS headers, and counts it by the
  route's template, method and status; a stream is sent piece by piece until
  it ends or its client leaves, and its ``finish`` runs on every path.

A route without a handler is the shell's (hordelite/http/shell.py): the
exchange goes to the Quart app, with the same CORS headers and count.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import anyio

from hordelite.contract.json_body import check_text
from hordelite.errors import RC, HordeError
from hordelite.http.answer import Answer
from hordelite.http.envelopes import Envelope, as_refusal, for_path
from hordelite.http.guard import ASGIApp, Message, Receive, Send
from hordelite.http.request import Gone, Request, Settings, header

Scope = MutableMapping[str, Any]
Handler = Callable[[Request], Awaitable[Answer]]

# The methods counted by name; any other (a client may send any token) is
# counted as "other", so that it cannot grow the label set.
COUNTED_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# What a preflight is told a page's script may send.
_PREFLIGHT_METHODS = b"GET, POST, PUT, DELETE, OPTIONS"
# A template's parameter: <name> (one segment) or <path:name> (the rest).
_PARAMETER = re.compile(r"<(?:(path):)?([A-Za-z_][A-Za-z0-9_]*)>")


@dataclasses.dataclass(frozen=True)
class Route:
    """One route: its method, its path template (``<name>`` matches one
    segment, ``<path:name>`` the rest of the path), its handler and the
    envelope its refusals are written in.

    A route without a handler is the shell's: served by its ``view`` (a
    Quart view, for a page from a template), or, without one, by the
    shell's static files."""

    method: str
    template: str
    handler: Handler | None
    envelope: Envelope
    view: Callable[[], Awaitable[Any]] | None = None


# Counts one answer: (route template, or None when no route matched; method; status).
CountAnswer = Callable[[str | None, str, int], None]
# Counts one refusal by its return code.
CountRefusal = Callable[[RC], None]


class Table:
    """The routes, found by method and path as Werkzeug's map finds them: a
    path without parameters before any with them, one-segment parameters
    before ``<path:…>`` ones, longer static text first; a route that takes
    the path but not the method gives way to one that takes both."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self.routes = list(routes)
        self._exact: dict[str, list[Route]] = {}
        patterns: dict[str, list[Route]] = {}
        for route in self.routes:
            if "<" in route.template:
                patterns.setdefault(route.template, []).append(route)
            else:
                self._exact.setdefault(route.template, []).append(route)
        # (the static text before the first parameter, the pattern, its routes):
        # the prefix, a cheap test, rules most patterns out before the regex.
        self._patterns = [
            (template.partition("<")[0], _compile(template), found)
            for template, found in sorted(patterns.items(), key=lambda item: _order(item[0]))
        ]

    def match(self, method: str, path: str) -> tuple[Route | None, dict[str, str], list[str]]:
        """The route for ``method`` on ``path`` and its parameters, or None
        with the methods the path takes (none: no route has the path).
        ``HEAD`` is the GET route's, unless a route of its own takes it."""
        if method == "HEAD":
            route, params, allowed = self._match("HEAD", path)
            if route is not None:
                return route, params, allowed
            method = "GET"
        return self._match(method, path)

    def _match(self, wanted: str, path: str) -> tuple[Route | None, dict[str, str], list[str]]:
        allowed: list[str] = []
        for route in self._exact.get(path, ()):
            if route.method == wanted:
                return route, {}, allowed
            allowed.append(route.method)
        for prefix, pattern, routes in self._patterns:
            if not path.startswith(prefix):
                continue
            found = pattern.fullmatch(path)
            if found is None:
                continue
            for route in routes:
                if route.method == wanted:
                    return route, found.groupdict(), allowed
                allowed.append(route.method)
        return None, {}, allowed


def _compile(template: str) -> re.Pattern[str]:
    parts, last = [], 0
    for found in _PARAMETER.finditer(template):
        parts.append(re.escape(template[last : found.start()]))
        parts.append(f"(?P<{found[2]}>{'[^/].*?' if found[1] else '[^/]+'})")
        last = found.end()
    parts.append(re.escape(template[last:]))
    return re.compile("".join(parts))


def _order(template: str) -> tuple[bool, int]:
    static = _PARAMETER.sub("", template)
    return "<path:" in template, -len(static)


class Dispatcher:
    """The ASGI application serving ``table`` (see the module)."""

    def __init__(
        self,
        table: Table,
        settings: Settings,
        *,
        shell: ASGIApp | None = None,
        allowed_origins: frozenset[str] | None = None,
        count_answer: CountAnswer | None = None,
        count_refusal: CountRefusal | None = None,
    ) -> None:
        self.table = table
        self._settings = settings
        self._shell = shell
        self._allowed = allowed_origins  # None: every origin
        self._count_answer = count_answer
        self._count_refusal = count_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._lifespan(scope, receive, send)
            return
        method: str = scope["method"]
        route, params, allowed = self.table.match(method, scope["path"])
        if route is not None and route.handler is None:
            await self._to_shell(route, scope, receive, send)
            return
        request = Request(scope, receive, self._settings, params)
        try:
            answer = await self._run(request, route, allowed)
        except Gone:
            return  # the client left: nobody to answer
        await self._send(request, route, answer, send)

    async def _run(self, request: Request, route: Route | None, allowed: list[str]) -> Answer:
        """The route's answer, or its refusal in the route's envelope."""
        try:
            if route is None:
                if allowed and request.method == "OPTIONS":
                    return _preflight(allowed)
                raise HordeError(RC.MethodNotAllowed if allowed else RC.NotFound)
            _check_url(request)
            assert route.handler is not None
            return await route.handler(request)
        except Gone:
            raise
        except Exception as exc:
            refusal = as_refusal(exc, f"{request.method} {request.path}")
            if self._count_refusal is not None:
                self._count_refusal(refusal.rc)
            envelope = route.envelope if route is not None else for_path(request.path)
            return envelope(refusal)

    # Sending ------------------------------------------------------------------

    async def _send(
        self, request: Request, route: Route | None, answer: Answer, send: Send
    ) -> None:
        headers = [(k.lower().encode(), v.encode("latin-1")) for k, v in answer.headers]
        self._cors(headers, request.header("origin"), request.method)
        if self._count_answer is not None:
            self._count_answer(route.template if route else None, request.method, answer.status)
        if answer.events is None:
            headers.append((b"content-length", str(len(answer.body)).encode()))
            start = {"type": "http.response.start", "status": answer.status, "headers": headers}
            body = b"" if request.method == "HEAD" else answer.body
            await _send_whole(request, send, start, body)
            return
        await _send_stream(request, send, answer, headers)

    def _cors(self, headers: list[tuple[bytes, bytes]], origin: str | None, method: str) -> None:
        """The CORS headers (``server.cors_origins``): ``*`` for every
        origin, or a listed origin by name, with ``Vary: Origin`` (the answer
        depends on it: a cache must not hand one origin's answer to
        another); a preflight is told what a page may send."""
        if self._allowed is not None:
            _add_vary(headers, b"Origin")
            if origin is None or origin.lower() not in self._allowed:
                return  # no header: the browser keeps the answer from the page
            headers.append((b"access-control-allow-origin", origin.encode("latin-1")))
        else:
            headers.append((b"access-control-allow-origin", b"*"))
        if method == "OPTIONS":
            headers.append((b"access-control-allow-headers", b"*"))
            headers.append((b"access-control-allow-methods", _PREFLIGHT_METHODS))

    # The shell and the lifespan ---------------------------------------------------

    async def _to_shell(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        """A shell route: the Quart app answers, with the CORS headers and
        the count added to its answer's head."""
        assert self._shell is not None, f"{route.template} is the shell's, and there is none"
        origin = header(scope, "origin")

        async def shell_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                self._cors(headers, origin, scope["method"])
                message = {**message, "headers": headers}
                if self._count_answer is not None:
                    self._count_answer(route.template, scope["method"], message["status"])
            await send(message)

        await self._shell(scope, receive, shell_send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The server's lifespan: the shell's, or answered here."""
        if self._shell is not None:
            await self._shell(scope, receive, send)
            return
        if scope["type"] != "lifespan":
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


def _check_url(request: Request) -> None:
    """Path segments and query values are text like a body's strings: a NUL
    or a surrogate half is refused here, before any route."""
    for name, value in request.params.items():
        check_text(name, value)
    for name, value in request.query():
        check_text(name, value)


def _preflight(allowed: list[str]) -> Answer:
    methods = {*allowed, "OPTIONS", *(["HEAD"] if "GET" in allowed else [])}
    return Answer(200, [("allow", ", ".join(sorted(methods))), ("content-type", "text/plain")])


def _add_vary(headers: list[tuple[bytes, bytes]], name: bytes) -> None:
    for i, (key, value) in enumerate(headers):
        if key == b"vary":
            headers[i] = (key, value + b", " + name)
            return
    headers.append((b"vary", name))


async def _send_whole(request: Request, send: Send, start: Message, body: bytes) -> None:
    """A whole answer. A request whose body is unread has the answer's bytes
    sent now and its end held until the body's drain (hordelite/http/guard);
    one that declares no body has its (empty) body read first, so the answer
    goes in one piece."""
    if not request.read_all and not request.declares_body():
        await request.body()
    await send(start)
    if request.read_all:
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _send_stream(
    request: Request, send: Send, answer: Answer, headers: list[tuple[bytes, bytes]]
) -> None:
    """A stream: each piece as it comes until it ends or its client leaves;
    its ``finish`` runs however it ends."""
    assert answer.finish is not None
    assert answer.events is not None
    events = answer.events
    try:
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        await request.unless_gone(lambda: _send_pieces(send, events))
    except Gone:
        pass
    finally:
        with anyio.CancelScope(shield=True):
            await answer.finish()


async def _send_pieces(send: Send, events: AsyncIterator[bytes]) -> None:
    async for piece in events:
        await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
