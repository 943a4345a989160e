"""PostgreSQL transactions on the event loop's own thread.

A transaction is a synchronous query function over a SQLAlchemy
``Connection`` (the same function SQLite runs). On PostgreSQL each of its
statements waits for the server. In a worker thread that wait is cheap, but
the thread and the event loop then hand the GIL to each other at every
statement, and a transaction's result crosses back through the loop: on the
text cycle that hand-off cost more server CPU than the statements
(docs/performance.md, "The fast path").

Here the query function runs in a greenlet on the loop's thread. psycopg's
synchronous connection does all its I/O through one method, ``wait``, which
drives a generator of socket waits; ``LoopConnection.wait`` hands those
waits, as an awaitable, to the task that started the greenlet
(``run_on_loop``), which awaits them with anyio (``wait_readable``), so
the loop serves other requests meanwhile, then switches back with the
outcome. No thread, no GIL hand-off, the same query code.

Outside a greenlet started by ``run_on_loop`` (migrations, the CLI, a
thread) the connection blocks as psycopg's own does.
"""

from __future__ import annotations

import functools
import select
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import greenlet
import psycopg
from psycopg import errors as pg_errors
from psycopg.waiting import READY_R, READY_W, WAIT_R, WAIT_RW, WAIT_W

from hordelite.storage._libpq import PREPARED_MAX, Statements

T = TypeVar("T")


class _OnLoop(greenlet.greenlet):  # type: ignore[misc]  # greenlet is untyped
    """A greenlet whose waits the task that started it awaits."""


def on_loop() -> bool:
    """Whether this code runs in a greenlet started by ``run_on_loop``."""
    return isinstance(greenlet.getcurrent(), _OnLoop)


def await_on_loop(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` from synchronous code running under ``run_on_loop``:
    the greenlet switches to its task, which awaits it and switches back with
    the result (or raises its exception here)."""
    current = greenlet.getcurrent()
    if not isinstance(current, _OnLoop):
        raise RuntimeError("await_on_loop outside run_on_loop")
    return current.parent.switch(awaitable)  # type: ignore[no-any-return]


async def run_on_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` run in a greenlet on this thread, each awaitable it hands
    over (``await_on_loop``) awaited here. Returns what ``fn`` returns, raises
    what it raises.

    A cancellation of the caller while an awaitable is awaited is thrown
    into ``fn`` at that point; callers that must not be cut half-way (a
    transaction) shield this call.
    """
    child = _OnLoop(fn)
    step = child.switch(*args)
    while not child.dead:
        try:
            value = await step
        except BaseException as exc:  # thrown into fn, which decides; it re-raises
            step = child.throw(exc)
        else:
            step = child.switch(value)
    return step  # type: ignore[no-any-return]


class LoopConnection(psycopg.Connection[Any]):
    """psycopg's synchronous connection, its socket waits awaited on the
    event loop when it runs under ``run_on_loop``."""

    # How many statements it prepares at most (0 with
    # storage.prepared_statements false, set when it connects).
    prepared_max = PREPARED_MAX

    @functools.cached_property
    def statements(self) -> Statements:
        """This connection's prepared plans on libpq (``Tx``'s fast path)."""
        return Statements(self, self.prepared_max)

    def wait(self, gen: Generator[Any, Any, T], *args: Any, **kwargs: Any) -> T:
        if not on_loop():
            return super().wait(gen, *args, **kwargs)
        # Its first step here: a generator that needs no socket wait (setting
        # autocommit on an idle connection, twice per read) ends in it, with
        # no switch to the loop and back.
        try:
            state = next(gen)
        except StopIteration as end:
            return end.value  # type: ignore[no-any-return]
        except OSError as exc:
            raise pg_errors.OperationalError("connection socket closed") from exc
        fileno = self.pgconn.socket
        return await_on_loop(_drive(gen, fileno, kwargs.get("timeout"), state))


def connect(*args: Any, **kwargs: Any) -> LoopConnection:
    """A new LoopConnection (SQLAlchemy's ``do_connect``): opened in a
    worker thread when on the loop, where connecting (name lookup, TCP,
    authentication) would otherwise block every other request."""
    if on_loop():
        return await_on_loop(
            anyio.to_thread.run_sync(lambda: LoopConnection.connect(*args, **kwargs))
        )
    return LoopConnection.connect(*args, **kwargs)


async def _drive(gen: Generator[Any, Any, T], fileno: int, limit: float | None, state: int) -> T:
    """Run psycopg's generator to its end from the socket wait ``state`` it
    asked for first, awaiting each wait, within ``limit`` seconds when
    psycopg gives one."""
    try:
        if limit is None:  # nearly always: a scope would cost more than the wait
            return await _consume(gen, fileno, state)
        with anyio.fail_after(limit):
            return await _consume(gen, fileno, state)
    except TimeoutError:
        raise pg_errors.OperationalError("timed out waiting for the server") from None
    except OSError as exc:
        raise pg_errors.OperationalError("connection socket closed") from exc


async def _consume(gen: Generator[Any, Any, T], fileno: int, state: int) -> T:
    try:
        while True:
            state = gen.send(await _ready(fileno, state))
    except StopIteration as end:
        return end.value  # type: ignore[no-any-return]


async def _ready(fileno: int, state: int) -> int:
    """Wait until the socket is ready as ``state`` asks; what it is ready for."""
    if state == WAIT_R:
        await anyio.wait_readable(fileno)
        return READY_R
    if state == WAIT_W:
        await anyio.wait_writable(fileno)
        return READY_W
    if state != WAIT_RW:
        raise pg_errors.InternalError(f"bad poll status: {state}")
    # Flushing a large statement: whichever comes first. A socket asked for
    # writing nearly always is writable, so look before waiting on both.
    readable, writable, _ = select.select([fileno], [fileno], [], 0)
    if readable or writable:
        return (READY_R if readable else 0) | (READY_W if writable else 0)
    ready = 0
    async with anyio.create_task_group() as tg:

        async def wait(waiter: Callable[[int], Awaitable[None]], flag: int) -> None:
            nonlocal ready
            await waiter(fileno)
            ready |= flag
            tg.cancel_scope.cancel()

        tg.start_soon(wait, anyio.wait_readable, READY_R)
        tg.start_soon(wait, anyio.wait_writable, READY_W)
    return ready
