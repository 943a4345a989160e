"""Hypercorn inside the caller's task group, on whichever loop is running.

It bounds what one connection can hold (see decision 0027):

- a connection without a complete request head is closed after
  ``keep_alive_timeout`` (Hypercorn's idle timer runs from the connection's
  start, or the end of its last response, until a request head is complete,
  so it is both the keep-alive timeout and the head's read deadline);
- a head larger than ``max_header_bytes`` gets 431 and the connection closes,
  and a head a proxy could frame otherwise gets 400 (hordelite.http.wire);
- a body gets ``body_timeout`` to arrive (hordelite.http.request answers
  408 past it);
- each exchange is guarded (hordelite.http.guard).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

import anyio
import anyio.lowlevel
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.utils import wrap_app

from hordelite.config import ServerConfig
from hordelite.http import wire as _wire
from hordelite.http.guard import guard_connections
from hordelite.http.loop import current_backend

log = logging.getLogger("hordelite.http")

# Each HTTP/1.1 connection of a server configured by hypercorn_config is on
# the strict wire (see hordelite.http.wire).
_wire.install()

# Connections accepted at once when the listening socket is readable (see
# _accept_loop).
ACCEPT_BATCH = 256
_ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}

# Open files the server asks for (at most the hard limit): each connection is
# one, and the default soft limit of 1,024 caps the connections a server holds.
_WANTED_OPEN_FILES = 65536


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
