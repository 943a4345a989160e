"""Each HTTP exchange guarded, whatever answers it (decision 0027).

- An answer sent before its request body was read (413, 404, any early
  error) drains what is left of the body, bounded, so the connection serves
  the next request, or, past the bound, closes it, telling the client so with
  ``Connection: close`` whenever the declared length already says so.
- Each send is shielded. Hypercorn does its side of a send (writing,
  recycling the connection for the next request, closing it, restarting its
  idle timer) in the application's own task; a handler cancelled as its
  client leaves (a long poll, a held call, a shell page whose client left)
  would cut that work half-way: ``Connection: close`` not honoured, the idle
  timer never restarted (idle connections never closed, holding shutdown for
  the whole grace period), a connection answered before its body was read
  hung. Hypercorn's own write is shielded already, so this adds no wait.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import trio

log = logging.getLogger("hordelite.http")

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

# What an answer sent before its request body was read may still read of the
# body, so that the connection serves the client's next request: more than
# this, or slower, and the connection is closed instead.
DRAIN_BYTES = 1024 * 1024
DRAIN_SECONDS = 2.0


class _GuardedExchange:
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


# When the request reached the application (anyio's clock): a long-poll's
# wait counts from here, not from whenever a busy loop ran its handler.
ARRIVED = "hordelite.arrived"


def guard_connections(app: ASGIApp) -> ASGIApp:
    """``app`` with each HTTP exchange guarded as the module describes."""

    async def guarded(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        scope[ARRIVED] = anyio.current_time()
        exchange = _GuardedExchange(scope, receive, send)
        try:
            await app(scope, exchange.receive, exchange.send)
        finally:
            await exchange.finish()

    return guarded
