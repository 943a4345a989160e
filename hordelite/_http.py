"""Hypercorn inside the caller's task group, on whichever loop is running.

The one module (with the app-class choice in api/app.py) that knows which
event loop runs: Hypercorn has one ``worker_serve`` per loop.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.lowlevel
import sniffio
from hypercorn.config import Config as HypercornConfig
from hypercorn.utils import wrap_app

from hordelite.config import ServerConfig

log = logging.getLogger("hordelite.http")


def current_backend() -> str:
    """ "trio" or "asyncio": the loop this code runs on."""
    return "trio" if sniffio.current_async_library() == "trio" else "asyncio"


async def serve_http(
    app: Any,
    server: ServerConfig,
    shutdown: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until ``shutdown`` is set; reports the base URL when listening.

    After shutdown Hypercorn stops accepting and gives open requests
    ``server.grace_period`` seconds before cancelling them.
    """
    config = HypercornConfig()
    config.bind = [f"{server.host}:{server.port}"]
    config.graceful_timeout = server.grace_period
    config.accesslog = None
    config.errorlog = log
    config.keep_alive_timeout = 75
    sockets = config.create_sockets()
    for sock in sockets.insecure_sockets:
        sock.listen(config.backlog)
    host, port = sockets.insecure_sockets[0].getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    task_status.started(f"http://{host}:{port}")
    if current_backend() == "trio":
        from hypercorn.trio.run import worker_serve as trio_serve

        await trio_serve(wrapped, config, sockets=sockets, shutdown_trigger=shutdown.wait)
    else:
        import asyncio

        from hypercorn.asyncio.run import worker_serve as asyncio_serve

        try:
            await asyncio_serve(wrapped, config, sockets=sockets, shutdown_trigger=shutdown.wait)
        except asyncio.InvalidStateError:
            # Hypercorn's asyncio worker_serve, when cancelled, fails in its
            # own cleanup with this instead of letting the cancellation
            # through: raise the cancellation it hides (a checkpoint in a
            # cancelled scope does), or the error if it was not one.
            await anyio.lowlevel.checkpoint()
            raise
