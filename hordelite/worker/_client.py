"""The worker's HTTP client: JSON requests on kept-alive HTTP/1.1 connections.

Every job costs the worker three requests or more (its pop, the backend's
completion, its submit), and on the OpenAI front's cycle the worker's CPU is
part of what a call costs. httpx spent about 0.8 ms of the worker's CPU a
request there (84% of the worker's CPU per job, py-spy, 2026-12-06): its
URL and cookie handling, its transport's connection pool and its body
streams run on every request. ``Client`` sends a request with h11 on an
anyio stream it keeps alive for the next, in the calling task
(decision 0063).

When a proxy applies to a URL (the ``http_proxy``, ``https_proxy``,
``all_proxy`` and ``no_proxy`` variables, as httpx reads them),
``open_client`` answers an httpx client instead, with the same interface:
the lean one speaks to its peer directly only.

Errors: ``TransportError`` when the peer cannot be reached, breaks the
connection or the protocol, or does not answer in time; an answer of any
status is a ``Reply``.
"""

from __future__ import annotations

import contextlib
import json
import select
import ssl
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import anyio
import anyio.abc
import h11
import httpx

from hordelite.errors import HordeliteError

_RECEIVE_BYTES = 65536
_SUCCESS = 2  # the hundreds of a 2xx status
# Idle connections kept for the next requests (one per concurrent request at most).
_IDLE_CONNECTIONS = 32


class TransportError(HordeliteError):
    """The request got no answer: no connection, a broken one, a broken
    protocol, or no answer in time."""


class _Answer:
    """What every answer holds: the request it answers, and its status."""

    __slots__ = ("method", "path", "status_code")

    def __init__(self, method: str, path: str, status_code: int) -> None:
        self.method = method
        self.path = path
        self.status_code = status_code

    @property
    def is_success(self) -> bool:
        return self.status_code // 100 == _SUCCESS


class Reply(_Answer):
    """An answer: its status and its whole body."""

    __slots__ = ("content",)

    def __init__(self, method: str, path: str, status_code: int, content: bytes) -> None:
        super().__init__(method, path, status_code)
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body decoded as JSON; ValueError when it is not."""
        return json.loads(self.content)


class Stream(Protocol):
    """An answer whose body is read as it comes."""

    status_code: int
    method: str
    path: str

    @property
    def is_success(self) -> bool: ...

    def aiter_lines(self) -> AsyncIterator[str]: ...

    async def aread(self) -> Reply: ...


class HttpClient(Protocol):
    """What the worker asks of an HTTP client (``Client``, or httpx's under a proxy)."""

    async def request(
        self, method: str, path: str, body: Any = None, *, within: float | None = None
    ) -> Reply: ...

    def stream(
        self, method: str, path: str, body: Any = None
    ) -> contextlib.AbstractAsyncContextManager[Stream]: ...

    async def aclose(self) -> None: ...


def open_client(
    url: str, headers: Mapping[str, str], timeout: float, connect_timeout: float
) -> HttpClient:
    """A client of ``url`` (``path`` arguments are appended to it): the lean
    one, or httpx's when a proxy applies to the URL."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
        return _Httpx(url, headers, timeout, connect_timeout)
    return Client(url, headers, timeout, connect_timeout)


class _Connection:
    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    async def next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self.stream.receive(_RECEIVE_BYTES)
            except anyio.EndOfStream:
                data = b""
            self.h11.receive_data(data)

    def reusable(self) -> bool:
        """Whether the exchange ended cleanly and the connection is kept alive
        (it is then made ready for the next)."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False


class Client:
    """JSON requests to one peer (``url``'s scheme, host and port; its path
    is the prefix of every request's), on connections kept alive."""

    def __init__(
        self, url: str, headers: Mapping[str, str], timeout: float, connect_timeout: float
    ) -> None:
        parts = urlsplit(url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        default_port = self._port == (443 if self._tls else 80)
        authority = self._host if default_port else f"{self._host}:{self._port}"
        if ":" in self._host and not default_port:  # an IPv6 address
            authority = f"[{self._host}]:{self._port}"
        self._headers = [("host", authority), *headers.items()]
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()  # kept or in use: what aclose closes
        self._tls_context: ssl.SSLContext | None = None

    async def request(
        self, method: str, path: str, body: Any = None, *, within: float | None = None
    ) -> Reply:
        """The answer to one request (``body`` sent as JSON), within
        ``within`` seconds (the client's by default)."""
        try:
            with anyio.fail_after(self._timeout if within is None else within):
                connection = await self._connection()
                return await self._exchange(connection, method, path, body)
        except TimeoutError:
            raise TransportError(f"{method} {path}: no answer in time") from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise TransportError(f"{method} {path}: {exc!r}") from exc
        except h11.ProtocolError as exc:
            raise TransportError(f"{method} {path}: the peer broke HTTP/1.1 ({exc})") from exc

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, body: Any = None) -> AsyncIterator[Stream]:
        """The answer to one request, its body read as it comes (an SSE
        stream); the connection is closed if the block leaves it unread."""
        connection = await self._connect_or_fail(method, path)
        try:
            await self._send(connection, method, path, body)
            event = await connection.next_event()
            if not isinstance(event, h11.Response):
                raise TransportError(f"{method} {path}: the connection closed before an answer")
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._close(connection)
            if isinstance(exc, (OSError, anyio.BrokenResourceError, h11.ProtocolError)):
                raise TransportError(f"{method} {path}: {exc!r}") from exc
            raise
        answer = _StreamReply(connection, method, path, event.status_code)
        try:
            yield answer
        finally:
            with anyio.CancelScope(shield=True):
                if answer.ended and connection.reusable():
                    await self._keep(connection)
                else:
                    await self._close(connection)

    async def _exchange(self, connection: _Connection, method: str, path: str, body: Any) -> Reply:
        ended = False
        try:
            await self._send(connection, method, path, body)
            event = await connection.next_event()
            if not isinstance(event, h11.Response):
                raise TransportError(f"{method} {path}: unexpected {event!r}")
            status, chunks = event.status_code, []
            while True:
                event = await connection.next_event()
                if isinstance(event, h11.Data):
                    chunks.append(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    raise TransportError(f"{method} {path}: the answer was cut short")
            ended = connection.reusable()
            return Reply(method, path, status, b"".join(chunks))
        finally:
            if ended:
                await self._keep(connection)
            else:
                with anyio.CancelScope(shield=True):
                    await self._close(connection)

    async def _send(self, connection: _Connection, method: str, path: str, body: Any) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        headers = list(self._headers)
        if body is not None:
            headers += [("content-type", "application/json"), ("content-length", str(len(data)))]
        request = h11.Request(method=method, target=self._prefix + path, headers=headers)
        out = connection.h11.send(request) or b""
        if data:
            out += connection.h11.send(h11.Data(data=data)) or b""
        out += connection.h11.send(h11.EndOfMessage()) or b""
        await connection.stream.send(out)

    async def _keep(self, connection: _Connection) -> None:
        """Keep a connection for the next request, or close it past the bound."""
        if len(self._idle) < _IDLE_CONNECTIONS:
            self._idle.append(connection)
            return
        with anyio.CancelScope(shield=True):
            await self._close(connection)

    async def _close(self, connection: _Connection) -> None:
        self._open.discard(connection)
        await connection.stream.aclose()

    async def _connection(self) -> _Connection:
        """A kept connection the peer has not closed, or a new one.

        A kept connection with something to read has been closed by its
        peer (its keep-alive ran out) or is out of step: it is dropped
        before anything is sent on it, as no request may be sent twice
        (a pop or a submit the peer took would be lost or repeated)."""
        while self._idle:
            connection = self._idle.pop()
            if not _readable(connection):
                return connection
            await self._close(connection)
        return await self._connect()

    async def _connect_or_fail(self, method: str, path: str) -> _Connection:
        try:
            return await self._connect()
        except (OSError, TimeoutError) as exc:
            raise TransportError(f"{method} {path}: {exc!r}") from exc

    async def _connect(self) -> _Connection:
        with anyio.fail_after(self._connect_timeout):
            if self._tls:
                if self._tls_context is None:
                    self._tls_context = ssl.create_default_context()
                stream: anyio.abc.ByteStream = await anyio.connect_tcp(
                    self._host, self._port, ssl_context=self._tls_context
                )
            else:
                stream = await anyio.connect_tcp(self._host, self._port)
        connection = _Connection(stream)
        self._open.add(connection)
        return connection

    async def aclose(self) -> None:
        """Close every connection, kept or in use (a request still under way
        then fails)."""
        self._idle = []
        for connection in list(self._open):
            await self._close(connection)


def _readable(connection: _Connection) -> bool:
    """Whether a kept connection has anything to read (the peer's end)."""
    sock = connection.stream.extra(anyio.abc.SocketAttribute.raw_socket)
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


class _StreamReply(_Answer):
    """A streamed answer (see ``Client.stream``)."""

    __slots__ = ("_connection", "ended")

    def __init__(self, connection: _Connection, method: str, path: str, status: int) -> None:
        super().__init__(method, path, status)
        self._connection = connection
        self.ended = False

    async def _chunks(self) -> AsyncIterator[bytes]:
        while not self.ended:
            try:
                event = await self._connection.next_event()
            except (OSError, anyio.BrokenResourceError, h11.ProtocolError) as exc:
                raise TransportError(f"{self.method} {self.path}: {exc!r}") from exc
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.ended = True
            else:
                raise TransportError(f"{self.method} {self.path}: the stream was cut short")

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines, as they come."""
        pending = b""
        async for chunk in self._chunks():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if pending:
            yield pending.rstrip(b"\r").decode("utf-8", "replace")

    async def aread(self) -> Reply:
        """The rest of the body, whole."""
        body = b"".join([chunk async for chunk in self._chunks()])
        return Reply(self.method, self.path, self.status_code, body)


class _Httpx:
    """The same requests through httpx (whose proxies it honours)."""

    def __init__(
        self, url: str, headers: Mapping[str, str], timeout: float, connect_timeout: float
    ) -> None:
        self._client = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers=dict(headers),
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
        )
        self._connect_timeout = connect_timeout

    async def request(
        self, method: str, path: str, body: Any = None, *, within: float | None = None
    ) -> Reply:
        limit = (
            httpx.USE_CLIENT_DEFAULT
            if within is None
            else httpx.Timeout(within, connect=self._connect_timeout)
        )
        try:
            response = await self._client.request(method, path, json=body, timeout=limit)
        except httpx.TransportError as exc:
            raise TransportError(f"{method} {path}: {exc!r}") from exc
        return Reply(method, path, response.status_code, response.content)

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, body: Any = None) -> AsyncIterator[Stream]:
        try:
            async with self._client.stream(method, path, json=body) as response:
                yield _HttpxStream(method, path, response)
        except httpx.TransportError as exc:
            raise TransportError(f"{method} {path}: {exc!r}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


class _HttpxStream(_Answer):
    __slots__ = ("_response",)

    def __init__(self, method: str, path: str, response: httpx.Response) -> None:
        super().__init__(method, path, response.status_code)
        self._response = response

    async def aiter_lines(self) -> AsyncIterator[str]:
        async for line in self._response.aiter_lines():
            yield line

    async def aread(self) -> Reply:
        return Reply(self.method, self.path, self.status_code, await self._response.aread())
