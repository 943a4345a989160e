"""A request as every route reads it, framework-free: its method, path and
path parameters, query, headers and checked JSON body; the client's address
and agent; the base URL it reached the horde by; and a way to wait that
ends when the client leaves.

One ``Request`` wraps one ASGI exchange (the dispatcher makes it,
hordelite/http/dispatch.py). Headers are read by a scan of the few a request
has rather than a dict: a held call keeps its request for minutes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import anyio
import anyio.to_thread

from hordelite.config import ServerConfig
from hordelite.contract import forwarded
from hordelite.contract.headers import checked_api_key, checked_operation_key, client_agent_of
from hordelite.contract.json_body import decode_json_body
from hordelite.errors import RC, HordeError, HordeliteError
from hordelite.http.connection import INBOX, Inbox
from hordelite.http.guard import ARRIVED

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

T = TypeVar("T")

# Bodies larger than this are decoded in a worker thread: a few megabytes of
# JSON take the parser tens of milliseconds, which every other connection
# would otherwise wait out.
DECODE_OFF_LOOP_BYTES = 256 * 1024


def header(scope: Scope, name: str) -> str | None:
    """The first value of header ``name`` (matched case-blind) in ``scope``."""
    values = _header_values(scope, name)
    return values[0] if values else None


def _header_values(scope: Scope, name: str) -> list[str]:
    wanted = name.lower().encode()
    return [v.decode("latin-1") for n, v in scope["headers"] if n.lower() == wanted]


class Gone(HordeliteError):
    """The client left while its answer was awaited: nobody to answer."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What reading any request needs of the server's configuration."""

    max_body: int
    body_timeout: float
    trusted: tuple[forwarded.Network, ...]
    public_url: str | None

    @classmethod
    def of(cls, server: ServerConfig) -> Settings:
        return cls(
            server.max_body_bytes,
            server.body_timeout,
            forwarded.parse_trusted_proxies(server.trusted_proxies),
            server.public_url.rstrip("/") if server.public_url else None,
        )


class Request:
    """One HTTP request (see the module)."""

    __slots__ = ("_query", "_receive", "params", "read_all", "scope", "settings")

    def __init__(
        self, scope: Scope, receive: Receive, settings: Settings, params: dict[str, str]
    ) -> None:
        self.scope = scope
        self._receive = receive
        self.settings = settings
        self.params = params  # the route template's parameters, by name
        self.read_all = False  # the body was read to its end
        self._query: list[tuple[str, str]] | None = None

    # What was asked ----------------------------------------------------------

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    @property
    def path(self) -> str:
        return str(self.scope["path"])

    @property
    def arrived(self) -> float | None:
        """When the request reached the application (anyio's clock)."""
        return self.scope.get(ARRIVED)

    def query(self) -> list[tuple[str, str]]:
        """The query's pairs in their order, blank values kept, as a form
        decodes them (``+`` a space, undecodable bytes replaced)."""
        if self._query is None:
            raw = self.scope.get("query_string", b"").decode("latin-1")
            self._query = parse_qsl(raw, keep_blank_values=True, errors="replace")
        return self._query

    def arg(self, name: str, default: str | None = None) -> str | None:
        """A query parameter's first value."""
        for key, value in self.query():
            if key == name:
                return value
        return default

    def header(self, name: str) -> str | None:
        """A header's first value (names are matched case-blind)."""
        return header(self.scope, name)

    def joined(self, name: str) -> str | None:
        """Repeated header lines as one comma-separated list (RFC 9110 5.3)."""
        values = _header_values(self.scope, name)
        return ", ".join(values) if values else None

    # The headers the routes share ---------------------------------------------

    def api_key(self) -> str:
        """The ``apikey`` header, checked (401 without one)."""
        return checked_api_key(self.header("apikey"))

    def operation_key(self) -> str | None:
        """The ``Idempotency-Key`` header: a resubmit with the same key
        returns the first request (a transfer: the first transfer's answer)."""
        return checked_operation_key(self.header("idempotency-key"))

    def client_agent(self) -> str:
        return client_agent_of(self.header("client-agent"), self.header("client_agent"))

    def accepts(self, coding: str) -> bool:
        """Whether ``Accept-Encoding`` takes ``coding`` (by name or ``*``)
        at a quality above zero."""
        for part in (self.joined("accept-encoding") or "").split(","):
            name, _, params = part.partition(";")
            if name.strip().lower() not in (coding, "*"):
                continue
            quality = params.strip().removeprefix("q=").removeprefix("Q=").strip()
            try:
                return not quality or float(quality) > 0
            except ValueError:
                return False
        return False

    def client_address(self) -> str | None:
        """The client's address as the anonymous budgets count it: the
        peer's, or what a trusted proxy forwarded (contract.forwarded)."""
        peer = self.scope.get("client")
        return forwarded.client_address(
            peer[0] if peer else None, self.settings.trusted, self.joined("x-forwarded-for")
        )

    def public_base_url(self) -> str:
        """Where the client reached the horde, which every signed URL handed
        to it starts with: ``server.public_url`` when set, else the request's
        scheme and Host, or what a trusted proxy forwarded."""
        if self.settings.public_url:
            return self.settings.public_url
        scope = self.scope
        peer = scope.get("client")
        listening = scope.get("server")
        return forwarded.request_base_url(
            scheme=scope.get("scheme", "http"),
            host=self.header("host") or "",
            server=_address(listening) if listening else "localhost",
            peer=peer[0] if peer else None,
            trusted=self.settings.trusted,
            forwarded=self.joined("forwarded"),
            forwarded_proto=self.joined("x-forwarded-proto"),
            forwarded_host=self.joined("x-forwarded-host"),
        )

    # The body -----------------------------------------------------------------

    def declared_length(self) -> int | None:
        """The body's Content-Length; None without one (a chunked body)."""
        value = self.header("content-length")
        try:
            return None if value is None else int(value)
        except ValueError:
            return None

    def declares_body(self) -> bool:
        """Whether the request declares a body: a chunked one, or a length
        other than 0 (which some clients send with every GET)."""
        if self.header("transfer-encoding") is not None:
            return True
        length = self.header("content-length")
        return length is not None and length.strip() != "0"

    async def json(self, *, optional: bool = False) -> Any:
        """The decoded, checked body (contract.json_body): 400 naming the
        field when it is not JSON or holds a value no route accepts; 413 past
        ``server.max_body_bytes``; 408 when it does not arrive within
        ``server.body_timeout``. ``optional``: no body at all reads as ``{}``
        (a route whose every field is optional, as the AI Horde's parsers
        read a missing body)."""
        raw = await self.body()
        if optional and not raw:
            return {}
        if len(raw) > DECODE_OFF_LOOP_BYTES:
            return await anyio.to_thread.run_sync(decode_json_body, raw)
        return decode_json_body(raw)

    async def body(self) -> bytes:
        """The whole body, bounded as ``json`` says."""
        limit = self.settings.max_body
        if (self.declared_length() or 0) > limit:
            raise HordeError(RC.PayloadTooLarge)
        chunks: list[bytes] = []
        size = 0
        try:
            with anyio.fail_after(self.settings.body_timeout):
                while not self.read_all:
                    message = await self._receive()
                    if message["type"] != "http.request":
                        break  # the client left: what came is all there is
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise HordeError(RC.PayloadTooLarge)
                    chunks.append(chunk)
                    self.read_all = not message.get("more_body", False)
        except TimeoutError:
            raise HordeError(RC.RequestTimeout) from None
        return b"".join(chunks)

    # Waiting --------------------------------------------------------------------

    async def unless_gone(self, work: Callable[[], Awaitable[T]]) -> T:
        """``work()``, cancelled if the client leaves meanwhile (``Gone``):
        a long poll or a held call whose client left ends, so a worker gone
        mid-pop is never handed a job and a call's request is cancelled.

        What is left of the body is read first (the watch reads what comes
        after it). On trio the connection's inbox cancels the work when the
        client leaves (hordelite/http/connection.py): a held call keeps no
        task watching; on asyncio a child task watches."""
        if not self.read_all:
            await self.body()
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
            raise Gone
        return result

    async def _unless_gone_watched(self, work: Callable[[], Awaitable[T]]) -> T:
        result: list[T] = []
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
            raise Gone
        return result[0]

    async def _watch(self, scope: anyio.CancelScope) -> None:
        """Cancel ``scope`` once the client leaves."""
        while (await self._receive())["type"] != "http.disconnect":
            pass
        scope.cancel()


def _address(listening: tuple[str, int | None]) -> str:
    host, port = listening
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}" if port else host
