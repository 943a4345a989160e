"""Hypercorn inside the caller's task group, on whichever loop is running.

The one module that knows which event loop runs: Hypercorn has one
``worker_serve`` per loop, and Quart one app class (``quart_app``).

It also bounds what one connection can hold (see decision 0027):

- a connection without a complete request head is closed after
  ``keep_alive_timeout`` (Hypercorn's idle timer runs from the connection's
  start, or the end of its last response, until a request head is complete,
  so it is both the keep-alive timeout and the head's read deadline);
- a head larger than ``max_header_bytes`` gets 431 and the connection closes,
  and a head a proxy could frame otherwise gets 400 (hordelite.http.wire);
- a body gets ``body_timeout`` to arrive (Quart answers 408 past it);
- an answer sent before its request body was read (413, 404, any early
  error) drains what is left of the body, bounded, so the connection serves
  the next request, or, past the bound, closes it, telling the client so with
  ``Connection: close`` whenever the declared length already says so.

Hypercorn does its side of a send (writing, recycling the connection for the
next request, closing it, restarting its idle timer) in the application's own
task. Quart cancels that task as soon as its receiver sees the disconnect
message that Hypercorn sends while finishing the response, so that work was
cut half-way: ``Connection: close`` was not honoured, the idle timer never
restarted (idle connections were never closed, and held shutdown for the
whole grace period), and a connection answered before its body was read hung.
Each send is therefore shielded here; Hypercorn's own write is shielded
already, so this adds no wait that was not there.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar, cast

import anyio
import anyio.lowlevel
import sniffio
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.utils import wrap_app
from quart import Quart

from hordelite.config import ServerConfig
from hordelite.http import wire as _wire

log = logging.getLogger("hordelite.http")

# Each HTTP/1.1 connection of a server configured by hypercorn_config is on
# the strict wire (see hordelite.http.wire).
_wire.install()

T = TypeVar("T")

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

# What an answer sent before its request body was read may still read of the
# body, so that the connection serves the client's next request: more than
# this, or slower, and the connection is closed instead.
DRAIN_BYTES = 1024 * 1024
DRAIN_SECONDS = 2.0

# Connections accepted at once when the listening socket is readable (see
# _accept_loop).
ACCEPT_BATCH = 256
_ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}

# Open files the server asks for (at most the hard limit): each connection is
# one, and the default soft limit of 1,024 caps the connections a server holds.
_WANTED_OPEN_FILES = 65536


def current_backend() -> str:
    """ "trio" or "asyncio": the loop this code runs on."""
    return "trio" if sniffio.current_async_library() == "trio" else "asyncio"


def quart_app(name: str, backend: str) -> Quart:
    """An empty Quart app for ``backend``: QuartTrio on trio, Quart on asyncio."""
    if backend == "trio":
        from quart_trio import QuartTrio

        return QuartTrio(name)
    return Quart(name)


class _Exchange:
    """One request and its answer, as the guard sees them."""

    # Slots: one is kept for each open connection's request, a held call's too.
    __slots__ = ("_receive", "_send", "body_done", "declared", "disconnected", "held", "received")

    def __init__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self.declared: int | None = None
        for name, value in scope.get("headers", ()):
            if name.lower() == b"content-length":
                try:
                    self.declared = int(value)
                except ValueError:
                    pass  # h11 refuses such a request before it gets here
        self.received = 0
        self.body_done = False
        self.disconnected = False
        self.held: Message | None = None

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if not message.get("more_body", False):
                self.body_done = True
        elif message["type"] == "http.disconnect":
            self.disconnected = True
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and not self.body_done:
            left = None if self.declared is None else self.declared - self.received
            if left is not None and left > DRAIN_BYTES:
                # More body than a drain reads: the connection closes after
                # this answer, and the client learns it from the answer.
                message = {**message, "headers": [*message["headers"], (b"connection", b"close")]}
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            if not self.body_done and not self.disconnected:
                # The answer's bytes have all gone; its end waits until the
                # rest of the body is read (see finish).
                self.held = message
                return
        await self._shielded_send(message)

    async def _shielded_send(self, message: Message) -> None:
        try:
            with anyio.CancelScope(shield=True):
                await self._send(message)
        except trio.BusyResourceError:
            # Hypercorn on trio shuts the socket of a client that left from
            # the reading task, without its send lock; a send racing that
            # shutdown has nowhere to go.
            log.debug("a send on a connection being closed was dropped")

    async def finish(self) -> None:
        """Drain the rest of the body (bounded), then end the answer.

        Past the bound the body is left unread: Hypercorn then closes the
        connection rather than read the rest as a next request. Meanwhile
        the discarding goes on, so that Hypercorn, which hands the
        application each piece of body and its disconnect through a small
        queue, never waits on that queue while it closes.
        """
        held, self.held = self.held, None
        if held is None:
            return
        try:
            with anyio.move_on_after(DRAIN_SECONDS):
                while not (self.body_done or self.disconnected) and self.received <= DRAIN_BYTES:
                    await self.receive()
        finally:
            async with anyio.create_task_group() as tg:
                if not (self.body_done or self.disconnected):
                    tg.start_soon(self._discard)
                await self._shielded_send(held)
                tg.cancel_scope.cancel()

    async def _discard(self) -> None:
        while not self.disconnected:
            await self.receive()


_CLEANUPS = "hordelite.on_exchange_end"
# When the request reached the application (anyio's clock): a long-poll's
# wait counts from here, not from whenever a busy loop ran its handler.
ARRIVED = "hordelite.arrived"


def on_exchange_end(scope: Any, cleanup: Callable[[], Awaitable[None]]) -> None:
    """Run ``cleanup`` once the exchange of ``scope`` (Quart's ``request.scope``)
    ends, however it ends.

    For what a streamed answer's body would release: a client that leaves
    before the body begins to be sent has the application cancelled before
    the body's own ``finally`` could ever run.
    """
    scope.setdefault(_CLEANUPS, []).append(cleanup)


def guard_connections(app: ASGIApp) -> ASGIApp:
    """``app`` with each HTTP exchange guarded as the module describes."""

    async def guarded(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        scope[ARRIVED] = anyio.current_time()
        exchange = _Exchange(scope, receive, send)
        try:
            await app(scope, exchange.receive, exchange.send)
        finally:
            for cleanup in scope.get(_CLEANUPS, ()):
                try:
                    await run_to_completion(cleanup)
                except Exception:
                    log.exception("an exchange's cleanup failed")
            await exchange.finish()

    return guarded


def raise_open_files_limit() -> None:
    """Lift the soft limit on open files towards the hard limit, so that the
    number of connections is not capped by a default of 1,024."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, _WANTED_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as exc:
            log.warning("open files stay limited to %d: %s", soft, exc)
        else:
            log.info("open files limit raised from %d to %d", soft, wanted)


def hypercorn_config(server: ServerConfig) -> HypercornConfig:
    config = _wire.WireConfig()
    config.h2c = server.h2c
    config.max_body_bytes = server.max_body_bytes
    config.bind = [f"{server.host}:{server.port}"]
    config.graceful_timeout = server.grace_period
    config.accesslog = None
    config.errorlog = log
    config.backlog = server.backlog
    config.keep_alive_timeout = server.keep_alive_timeout
    config.h11_max_incomplete_size = server.max_header_bytes
    # The same bound, advertised to an HTTP/2 client (server.h2c).
    config.h2_max_header_list_size = server.max_header_bytes
    # Hypercorn's read_timeout bounds every read, also the silence while a
    # long-poll or an OpenAI call waits for its answer, so it stays unset:
    # the head's deadline is the idle timer, the body's is Quart's.
    config.read_timeout = None
    return config


def listen(server: ServerConfig, *, shared: bool = False) -> socket.socket:
    """A socket bound to ``server.host:server.port`` and listening: what
    ``serve_http`` serves. An address that cannot be had raises OSError.

    ``shared``: with SO_REUSEPORT, so that more such sockets can bind the
    same port (one per serving process; the kernel spreads new connections
    over them)."""
    config = hypercorn_config(server)
    if shared:
        config.workers = 2  # what makes Hypercorn set SO_REUSEPORT
    sock = config.create_sockets().insecure_sockets[0]  # one bind, one socket
    sock.listen(config.backlog)
    return sock


def claim_port(server: ServerConfig) -> int:
    """The port ``server.host:server.port`` names (for port 0, the one the
    kernel picks), once no socket listens on it; an address that cannot be
    had raises OSError, as ``listen`` does.

    For the SO_REUSEPORT sockets of ``listen(shared=True)``: one of them
    joins any other SO_REUSEPORT socket already on the port, another
    horde's as well, and the kernel would then spread new connections over
    both hordes. A socket without SO_REUSEPORT, bound here and closed at
    once, is refused when anything listens on the port (SO_REUSEADDR, as
    for every socket of the server, still lets it past connections of an
    earlier run waiting out TIME_WAIT)."""
    probe = hypercorn_config(server).create_sockets().insecure_sockets[0]
    with probe:
        return int(probe.getsockname()[1])


def base_url(sock: socket.socket) -> str:
    """``http://host:port`` of a listening socket (the port it really got)."""
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"


async def serve_http(
    app: Any,
    server: ServerConfig,
    shutdown: anyio.Event,
    *,
    sock: socket.socket | None = None,
    grace_left: Callable[[], float] | None = None,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until ``shutdown`` is set; reports the base URL when listening.

    ``sock`` is a socket already listening (one that several processes
    share, see ``hordelite serve --processes``); without it the server binds
    ``server.host:server.port`` itself. After shutdown Hypercorn stops
    accepting, closes idle connections, and gives open requests
    ``server.grace_period`` seconds before cancelling them, or what
    ``grace_left()`` says is left of it when shutdown is set (a caller that
    drained before).
    """
    config = hypercorn_config(server)

    async def stop() -> None:
        await shutdown.wait()
        if grace_left is not None:
            config.graceful_timeout = max(grace_left(), 0.0)

    raise_open_files_limit()
    if sock is None:
        sock = listen(server)
    sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
    # Hypercorn types the app with its own message dicts.
    wrapped = wrap_app(cast(Any, guard_connections(app)), config.wsgi_max_body_size, "asgi")
    task_status.started(base_url(sock))
    if current_backend() == "trio":
        await _serve_trio(wrapped, config, sockets.insecure_sockets, stop)
    else:
        import asyncio

        from hypercorn.asyncio.run import worker_serve as asyncio_serve

        try:
            await asyncio_serve(wrapped, config, sockets=sockets, shutdown_trigger=stop)
        except asyncio.InvalidStateError:
            # Hypercorn's asyncio worker_serve, when cancelled, fails in its
            # own cleanup with this instead of letting the cancellation
            # through: raise the cancellation it hides (a checkpoint in a
            # cancelled scope does), or the error if it was not one.
            await anyio.lowlevel.checkpoint()
            raise


async def _serve_trio(
    app: Any,
    config: HypercornConfig,
    sockets: list[socket.socket],
    stop: Callable[[], Awaitable[None]],
) -> None:
    """Hypercorn's trio ``worker_serve`` (0.18), less TLS, QUIC and statsd,
    with the accept loop below in place of ``trio.serve_listeners`` and
    ``hordelite.http.connection.Connection`` in place of its ``TCPServer``.

    On shutdown: no more accepts, idle connections close at once (Hypercorn's
    idle timer watches ``context.terminated``), open requests get
    ``graceful_timeout`` seconds, then the rest is cancelled.
    """
    from hypercorn.trio.lifespan import Lifespan
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.typing import ConnectionState

    from hordelite.http.connection import Connection

    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(app, config, lifespan_state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            handler = functools.partial(
                Connection, app, config, context, ConnectionState(lifespan_state.copy())
            )
            try:
                async with trio.open_nursery() as accepting:
                    for sock in sockets:
                        accepting.start_soon(_accept_loop, sock, handler, connections)
                    await stop()
                    accepting.cancel_scope.cancel()
            finally:
                for sock in sockets:
                    sock.close()  # no more connections queue up meanwhile
                await context.terminated.set()
                connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


async def _accept_loop(
    sock: socket.socket,
    handler: Callable[[trio.SocketStream, socket.socket], Awaitable[object]],
    connections: trio.Nursery,
) -> None:
    """Accept every connection waiting, up to ACCEPT_BATCH, each time the
    listening socket is readable.

    ``trio.serve_listeners`` accepts one connection per pass of trio's
    scheduler, and a pass with many requests in it takes milliseconds: with
    2,000 connections arriving in two seconds, ~1,800 waited in the listen
    queue, up to half a minute, and a long-poll's wait only starts once it
    is accepted.
    """
    sock.setblocking(False)
    while True:
        await trio.lowlevel.wait_readable(sock)
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                    raise
                # Out of file descriptors or memory: the connections wait
                # in the listen queue until some close.
                log.error("accept failed (%s); retrying in 0.1 s", os.strerror(exc.errno or 0))
                await trio.sleep(0.1)
                break
            connections.start_soon(_run_connection, conn, handler)


async def _run_connection(
    conn: socket.socket,
    handler: Callable[[trio.SocketStream, socket.socket], Awaitable[object]],
) -> None:
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(conn))
    try:
        await handler(stream, conn)
    finally:
        await trio.aclose_forcefully(stream)


async def run_to_completion(fn: Callable[[], Awaitable[T]]) -> T:
    """``fn()`` run to its end even when the caller is cancelled meanwhile;
    the cancellation is then raised at the caller's next checkpoint.

    For work whose result the caller needs to undo it (a submission it must
    cancel when its client left). Trio's shield does exactly this. On
    asyncio Quart cancels a handler natively (``Task.cancel``), which no
    anyio shield stops: the work runs in a shielded task of its own, and the
    cancellation, once the work is done, is raised again.
    """
    if current_backend() == "trio":
        with anyio.CancelScope(shield=True):
            result = await fn()
        return result
    import asyncio

    async def work() -> T:
        return await fn()

    # Its own task, awaited on every path: the anyio shield keeps anyio's
    # cancellation out, asyncio.shield absorbs Quart's single native one.
    task = asyncio.ensure_future(work())
    with anyio.CancelScope(shield=True):
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            try:
                result = await task
            finally:
                current = asyncio.current_task()
                assert current is not None
                current.cancel()
    return result
