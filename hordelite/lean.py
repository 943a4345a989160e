"""The hottest native routes as plain ASGI, in front of the Quart app.

Every client polls its request's status and every worker pops and submits,
so a handful of routes carry nearly every request a busy horde answers.
Quart's per-request machinery (a request and its context, an app context,
Werkzeug's routing, the before and after hooks, a response object, a task
to watch the connection) cost those requests more server CPU than the
horde's own work on them (docs/performance.md, "The fast path").

``LeanRoutes`` answers the plain shape of these routes itself:

- ``POST /api/v2/generate/{text,chat}/async``, ``POST
  /api/v2/generate/text/{pop,submit,progress}`` with a ``Content-Length``
  body and no query;
- ``GET /api/v2/generate/{text,chat}/status/<id>`` with an id of letters,
  digits and ``-`` (a request id is a UUID) and no query but ``wait``;
- ``POST /v1/chat/completions`` and ``POST /v1/completions`` (the OpenAI
  front's calls, ``front.openai.serve``) with a ``Content-Length`` body and
  no query.

It calls the same service methods and renders the same JSON as the Quart
routes in ``native.py``, with the same headers (CORS, the metrics count)
and the same refusals (``native_refusal``). Anything else, an odd query,
a chunked body, a ``HEAD``, goes to the Quart app untouched, which answers
it as it always has: the lane takes only what it answers exactly as Quart
would (``tests/integration/test_lean_routes.py`` sends both the same
requests and compares the answers).

A long poll (a pop's ``wait``, a status's ``?wait=``) and an OpenAI call
watch their connection while they wait: a client that leaves cancels them,
as Quart cancels a handler whose client left, so a worker gone mid-pop is
never handed a job and a call whose client left cancels its request.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import anyio.to_thread

from hordelite.api import _render
from hordelite.contract import forwarded
from hordelite.contract.headers import checked_api_key, checked_operation_key, client_agent_of
from hordelite.contract.json_body import decode_json_body
from hordelite.contract.text import parse_status_wait
from hordelite.errors import RC, HordeError, HordeliteError, StorageUnavailable
from hordelite.front._errors import error_answer
from hordelite.front.openai import Admission, Caller, ChatPlan, CompletionPlan, Plan, serve
from hordelite.horde.results import Queued
from hordelite.horde.service import Horde
from hordelite.http.connection import INBOX, Inbox
from hordelite.http.server import ARRIVED

log = logging.getLogger("hordelite.api")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_PREFIX = "/api/v2/generate/"
# A request id the lane takes: a UUID's characters (any other id, the
# lane leaves to Quart, which checks it and answers 404 as ever).
_ID = re.compile(r"[0-9A-Za-z-]{1,64}")
# The only query a status read may carry on the lane: a plain number of seconds.
_WAIT_QUERY = re.compile(rb"wait=[0-9.]{0,16}")
# As hordelite._request: larger bodies are decoded off the event loop.
_DECODE_OFF_LOOP_BYTES = 256 * 1024
_JSON = (b"content-type", b"application/json")
# The front's routes on the lane, and the call each is.
_FRONT_PLANS: dict[str, Plan] = {
    "/v1/chat/completions": ChatPlan,
    "/v1/completions": CompletionPlan,
}


class _Answer(HordeliteError):
    """An answer decided before the route's handler runs (an HTTP error)."""

    def __init__(self, rc: RC) -> None:
        super().__init__(rc.name)
        self.rc = rc


class LeanRoutes:
    """``app`` (the Quart app), with the hot routes answered as the module says."""

    def __init__(self, app: Any, horde: Horde, admission: Admission) -> None:
        self._app: ASGIApp = app
        self._horde = horde
        self._admission = admission  # the front's open calls (the Quart routes' own)
        server = horde.config.server
        self._max_body = server.max_body_bytes
        self._body_timeout = server.body_timeout
        self._allowed = server.allowed_origins
        self._count = horde.config.metrics.enabled
        self._trusted = forwarded.parse_trusted_proxies(server.trusted_proxies)
        self._posts: dict[str, tuple[str, _Handler]] = {
            "text/async": ("/api/v2/generate/text/async", self._text_async),
            "chat/async": ("/api/v2/generate/chat/async", self._chat_async),
            "text/pop": ("/api/v2/generate/text/pop", self._pop),
            "text/submit": ("/api/v2/generate/text/submit", self._submit),
            "text/progress": ("/api/v2/generate/text/progress", self._progress),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope) if scope["type"] == "http" else None
        if route is None:
            await self._app(scope, receive, send)
            return
        template, handler, arg = route
        exchange = _Exchange(scope, receive, send)
        plan = _FRONT_PLANS.get(template)
        if plan is not None:
            await self._front(exchange, template, plan)
            return
        try:
            status, body, extra = await handler(exchange, arg)
        except _Gone:
            return  # the client left a long poll: nobody to answer
        except _Answer as answer:
            status, body, extra = self._refusal(answer.rc, None, {})
        except HordeError as exc:
            status, body, extra = self._refusal(exc.rc, exc.message, exc.extra)
        except StorageUnavailable as exc:
            log.error("storage unavailable: %s", exc)
            status, body, extra = self._refusal(RC.StorageUnavailable, None, {})
        except Exception:
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            status, body, extra = self._refusal(RC.InternalServerError, None, {})
        await self._answer(exchange, template, status, body, extra)

    # Routing -------------------------------------------------------------

    def _route(self, scope: Scope) -> tuple[str, _Handler, str] | None:
        path: str = scope["path"]
        if path in _FRONT_PLANS:
            plain = scope["method"] == "POST" and not scope["query_string"]
            if not plain or _declared_length(scope) is None:
                return None
            return path, self._no_handler, ""
        if not path.startswith(_PREFIX):
            return None
        rest = path[len(_PREFIX) :]
        method = scope["method"]
        if method == "POST":
            found = self._posts.get(rest)
            if found is None or scope["query_string"] or _declared_length(scope) is None:
                return None
            return found[0], found[1], ""
        if method != "GET":
            return None
        kind, _, tail = rest.partition("/status/")
        if kind not in ("text", "chat") or not _ID.fullmatch(tail):
            return None
        query = scope["query_string"]
        if (query and not _WAIT_QUERY.fullmatch(query)) or _has_body(scope):
            return None  # an odd query, or a GET with a body
        return f"/api/v2/generate/{kind}/status/<request_id>", self._status, f"{kind}/{tail}"

    # The routes (as in native.py) ------------------------------------------

    async def _text_async(self, ex: _Exchange, _: str) -> _Result:
        body = await self._json(ex)
        answer = await self._horde.requests.submit_text(
            _api_key(ex), body, _client_agent(ex), _operation_key(ex), client=self._client(ex)
        )
        return (202 if isinstance(answer, Queued) else 200), _render.queued(answer), ()

    async def _chat_async(self, ex: _Exchange, _: str) -> _Result:
        body = await self._json(ex)
        answer = await self._horde.requests.submit_chat(
            _api_key(ex), body, _client_agent(ex), _operation_key(ex), client=self._client(ex)
        )
        return 202, _render.queued(answer), ()

    async def _pop(self, ex: _Exchange, _: str) -> _Result:
        body = await self._json(ex)
        arrived = ex.scope.get(ARRIVED)
        base_url = self._public_base_url(ex)
        key = _api_key(ex)
        pop = self._horde.jobs.pop
        wait = body.get("wait") if isinstance(body, dict) else None
        if wait:  # a long poll: the worker may leave meanwhile
            answer = await ex.unless_gone(
                lambda: pop(key, body, arrived=arrived, base_url=base_url)
            )
        else:
            answer = await pop(key, body, arrived=arrived, base_url=base_url)
        return 200, _render.pop(answer), ()

    async def _submit(self, ex: _Exchange, _: str) -> _Result:
        body = await self._json(ex)
        return 200, _render.submitted(await self._horde.jobs.submit(_api_key(ex), body)), ()

    async def _progress(self, ex: _Exchange, _: str) -> _Result:
        body = await self._json(ex)
        return 200, _render.progress(await self._horde.jobs.post_progress(_api_key(ex), body)), ()

    async def _status(self, ex: _Exchange, which: str) -> _Result:
        if not await ex.read_empty():
            raise _Gone
        kind, _, request_id = which.partition("/")
        query = ex.scope["query_string"]
        wait = parse_status_wait(query[len(b"wait=") :].decode() if query else None)
        status = self._horde.requests.status
        if wait:
            found = await ex.unless_gone(lambda: status(kind, request_id, wait=wait))
        else:
            found = await status(kind, request_id, wait=wait)
        return 200, _render.status(found), ()

    async def _no_handler(self, ex: _Exchange, _: str) -> _Result:
        raise AssertionError("the front's calls are answered by _front")

    # The OpenAI front (front/openai.py serves the call) ------------------------

    async def _front(self, ex: _Exchange, template: str, plan: Plan) -> None:
        """An OpenAI call: served by ``front.openai.serve`` as the Quart route
        serves it, its refusals in OpenAI's envelope; cancelled when its
        client leaves.

        The body is read first, so that the connection can be watched for
        the whole call; a body that cannot be read is refused when ``serve``
        asks for it, after admission, as the Quart route refuses it."""
        horde = self._horde
        read: list[Any] = []  # the document, until serve takes it (not held for the call)
        failure: HordeError | None = None
        try:
            read.append(await self._json(ex))
        except _Answer as early:  # 413, 408: the call's refusals, as the app renders them
            failure = HordeError(early.rc)
        except HordeError as exc:  # 400: not JSON, or a value no route accepts
            failure = exc

        async def body() -> Any:
            if failure is not None:
                raise failure
            return read.pop()

        caller = Caller(body, ex.header(b"authorization"), _client_agent(ex), self._client(ex))
        try:
            answer = await ex.unless_gone(lambda: serve(horde, self._admission, plan, caller))
        except _Gone:
            return
        except HordeError as exc:  # the front at capacity (admission precedes the call)
            answer = error_answer(horde, exc)
        except StorageUnavailable as exc:
            log.error("storage unavailable: %s", exc)
            answer = error_answer(horde, HordeError(RC.StorageUnavailable))
        except Exception:
            log.exception("unexpected error on %s %s", ex.scope["method"], ex.scope["path"])
            answer = error_answer(horde, HordeError(RC.InternalServerError))
        headers = [(k.lower().encode(), v.encode("latin-1")) for k, v in answer.headers]
        if answer.events is None:
            headers.insert(1, (b"content-length", str(len(answer.body)).encode()))
        headers += self._cors(ex)
        if self._count:
            status = str(answer.status)
            horde.metrics.http_requests.labels(template, ex.scope["method"], status).inc()
        start = {"type": "http.response.start", "status": answer.status, "headers": headers}
        if answer.events is None:
            await ex.send(start)
            await ex.send_body(answer.body)
            return
        assert answer.finish is not None
        try:
            await ex.send(start)
            await ex.unless_gone(lambda: _send_events(ex, answer.events))
        except _Gone:
            pass
        finally:
            with anyio.CancelScope(shield=True):
                await answer.finish()

    # Reading ---------------------------------------------------------------

    async def _json(self, ex: _Exchange) -> Any:
        """The checked body, as ``_request.json_body`` reads it (413 past the
        cap, 408 when it does not arrive within ``body_timeout``)."""
        declared = _declared_length(ex.scope) or 0
        if declared > self._max_body:
            raise _Answer(RC.PayloadTooLarge)
        raw = await ex.read_body(self._max_body, self._body_timeout)
        if len(raw) > _DECODE_OFF_LOOP_BYTES:
            return await anyio.to_thread.run_sync(decode_json_body, raw)
        return decode_json_body(raw)

    def _client(self, ex: _Exchange) -> str | None:
        """As ``_request.client_address``."""
        peer = ex.scope.get("client")
        return forwarded.client_address(
            peer[0] if peer else None, self._trusted, ex.joined(b"x-forwarded-for")
        )

    def _public_base_url(self, ex: _Exchange) -> str:
        """As ``_request.public_base_url``."""
        server = self._horde.config.server
        if server.public_url:
            return server.public_url.rstrip("/")
        scope = ex.scope
        peer = scope.get("client")
        listening = scope.get("server")
        return forwarded.request_base_url(
            scheme=scope.get("scheme", "http"),
            host=ex.header(b"host") or "",
            server=_address(listening) if listening else "localhost",
            peer=peer[0] if peer else None,
            trusted=self._trusted,
            forwarded=ex.joined(b"forwarded"),
            forwarded_proto=ex.joined(b"x-forwarded-proto"),
            forwarded_host=ex.joined(b"x-forwarded-host"),
        )

    # Answering -------------------------------------------------------------

    def _refusal(self, rc: RC, message: str | None, extra: dict[str, Any]) -> _Result:
        """A refusal in the native envelope, as app._error renders it."""
        self._horde.metrics.refusals.labels(rc.name).inc()
        body = {"message": message or rc.default_message, "rc": rc.name, **extra}
        headers: tuple[tuple[bytes, bytes], ...] = ()
        if "retry_after" in extra:
            headers = ((b"retry-after", str(extra["retry_after"]).encode()),)
        return rc.status, body, headers

    async def _answer(
        self,
        ex: _Exchange,
        template: str,
        status: int,
        body: Any,
        extra: tuple[tuple[bytes, bytes], ...],
    ) -> None:
        data = json.dumps(body).encode()
        headers = [_JSON, (b"content-length", str(len(data)).encode()), *extra]
        headers += self._cors(ex)
        if self._count:
            method = ex.scope["method"]
            self._horde.metrics.http_requests.labels(template, method, str(status)).inc()
        await ex.send({"type": "http.response.start", "status": status, "headers": headers})
        await ex.send_body(data)

    def _cors(self, ex: _Exchange) -> list[tuple[bytes, bytes]]:
        """As app._cors (the lane serves no OPTIONS)."""
        if self._allowed is None:
            return [(b"access-control-allow-origin", b"*")]
        origin = ex.header(b"origin") or ""
        headers = [(b"vary", b"Origin")]
        if origin.lower() in self._allowed:
            headers.append((b"access-control-allow-origin", origin.encode("latin-1")))
        return headers


_Result = tuple[int, Any, tuple[tuple[bytes, bytes], ...]]
_Handler = Callable[["_Exchange", str], Awaitable[_Result]]


class _Exchange:
    """One request on the lane: its scope, its headers, its body."""

    __slots__ = ("read_all", "receive", "scope", "send")

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.read_all = False  # the request's body was read to its end

    def _values(self, name: bytes) -> list[str]:
        # A scan of the few headers a request has: the lane reads three or
        # four, and a dict of them would be kept for the whole of a held call.
        return [v.decode("latin-1") for n, v in self.scope["headers"] if n.lower() == name]

    def header(self, name: bytes) -> str | None:
        """The first value of a header (as Werkzeug's ``headers.get``)."""
        values = self._values(name)
        return values[0] if values else None

    def joined(self, name: bytes) -> str | None:
        """Repeated header lines as one comma-separated list (RFC 9110 5.3)."""
        values = self._values(name)
        return ", ".join(values) if values else None

    async def read_body(self, limit: int, seconds: float) -> bytes:
        """The whole body, within ``seconds`` (408) and ``limit``
        bytes (413), as Quart reads it."""
        chunks: list[bytes] = []
        size = 0
        try:
            with anyio.fail_after(seconds):
                while True:
                    message = await self.receive()
                    if message["type"] != "http.request":
                        break  # the client left: what came is all there is
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise _Answer(RC.PayloadTooLarge)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        self.read_all = True
                        break
        except TimeoutError:
            raise _Answer(RC.RequestTimeout) from None
        return b"".join(chunks)

    async def send_body(self, data: bytes) -> None:
        """An answer's whole body. Answered before the request's body was
        read (a 413 on its declared length), its bytes go now and its end
        after the body's drain (see hordelite.http.server), as Quart sends them."""
        if self.read_all:
            await self.send({"type": "http.response.body", "body": data})
            return
        await self.send({"type": "http.response.body", "body": data, "more_body": True})
        await self.send({"type": "http.response.body", "body": b""})

    async def read_empty(self) -> bool:
        """Read a GET's (empty) body to its end; False when the client left first."""
        while True:
            message = await self.receive()
            if message["type"] != "http.request":
                return False
            if not message.get("more_body", False):
                self.read_all = True
                return True

    async def unless_gone(self, work: Callable[[], Awaitable[Any]]) -> Any:
        """``work()``, cancelled if the client leaves meanwhile (its
        ``http.disconnect``); a client gone gets no answer. The body must
        have been read (the watch reads what comes next).

        On trio the connection's inbox cancels the work when the client
        leaves (hordelite.http.connection): a held call keeps no task watching."""
        inbox: Inbox | None = self.scope.get(INBOX)
        if inbox is None:
            return await self._unless_gone_watched(work)
        with anyio.CancelScope() as scope:
            inbox.on_leave = scope.cancel
            try:
                if inbox.left:
                    scope.cancel()
                result = await work()
            finally:
                inbox.on_leave = None
        if scope.cancelled_caught:
            raise _Gone
        return result

    async def _unless_gone_watched(self, work: Callable[[], Awaitable[Any]]) -> Any:
        """``unless_gone`` with a task reading the connection (asyncio)."""
        result: list[Any] = []
        failure: list[Exception] = []
        # The work runs in this task and one child watches the connection:
        # a held call costs one task less than a task for each.
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch, tg.cancel_scope)
            try:
                result.append(await work())
            except Exception as exc:  # raised below, outside the group
                failure.append(exc)
            tg.cancel_scope.cancel()
        if failure:
            raise failure[0]
        if not result:
            raise _Gone
        return result[0]

    async def _watch(self, scope: anyio.CancelScope) -> None:
        """Cancel ``scope`` once the client leaves."""
        while (await self.receive())["type"] != "http.disconnect":
            pass
        scope.cancel()


class _Gone(HordeliteError):
    """The client left during a long poll: nothing to answer."""


def _declared_length(scope: Scope) -> int | None:
    """The body's Content-Length, or None without one (a chunked body,
    which the lane leaves to Quart)."""
    for name, value in scope["headers"]:
        if name == b"content-length" or name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_events(ex: _Exchange, events: AsyncIterator[bytes] | None) -> None:
    """A stream's events, each as it comes, then its end."""
    assert events is not None
    async for piece in events:
        await ex.send({"type": "http.response.body", "body": piece, "more_body": True})
    await ex.send({"type": "http.response.body", "body": b""})


def _has_body(scope: Scope) -> bool:
    """Whether the request declares a body: a chunked one, or a length
    other than 0 (which some clients send with every GET)."""
    for name, value in scope["headers"]:
        name = name.lower()
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _api_key(ex: _Exchange) -> str:
    return checked_api_key(ex.header(b"apikey"))


def _operation_key(ex: _Exchange) -> str | None:
    return checked_operation_key(ex.header(b"idempotency-key"))


def _client_agent(ex: _Exchange) -> str:
    return client_agent_of(ex.header(b"client-agent"), ex.header(b"client_agent"))


def _address(listening: tuple[str, int | None]) -> str:
    host, port = listening
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}" if port else host
