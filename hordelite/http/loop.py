"""The one module that knows which event loop runs: Hypercorn has one
``worker_serve`` per loop, Quart one app class, and cancellation reaches a
task differently on each."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import sniffio
from quart import Quart

T = TypeVar("T")


def current_backend() -> str:
    """ "trio" or "asyncio": the loop this code runs on."""
    return "trio" if sniffio.current_async_library() == "trio" else "asyncio"


def quart_app(name: str, backend: str) -> Quart:
    """An empty Quart app for ``backend``: QuartTrio on trio, Quart on
    asyncio; no static folder of its own (a blueprint brings its files)."""
    if backend == "trio":
        from quart_trio import QuartTrio

        return QuartTrio(name, static_folder=None)
    return Quart(name, static_folder=None)


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
