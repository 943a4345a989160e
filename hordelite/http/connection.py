"""One HTTP connection on trio: Hypercorn's ``TCPServer`` (0.18), lighter
by what every open connection keeps while its answer waits.

An OpenAI call, a long-polled pop or status waits with its connection open,
for minutes if need be, and a horde holds thousands of them (front.py (b)
measures the server's memory per open call). Hypercorn's own connection
keeps, for the whole wait:

- a read that wraps each ``recv`` in context managers and keeps the
  ``BlockingIOError`` of its first try, under a ``fail_after`` scope even
  with no read timeout (hordelite sets none: see ``_http.hypercorn_config``);
- a trio memory channel for the messages Hypercorn hands the application;
- and the application needs a task of its own reading that channel, to
  learn that its client left.

``Connection`` reads with ``wait_readable`` and ``recv`` on the socket
itself, and hands the application its messages through an ``Inbox``: a list
with trio's memory-channel semantics (bounded, waited on, each get and put a
checkpoint) that also tells whoever asks (``Inbox.on_leave``) the moment
the client leaves, so a waiting answer needs no watching task
(``lean._Exchange.unless_gone``). The exchange's scope carries its inbox
under ``INBOX``.

Everything else (the protocols, sending, closing, the idle timer) is
Hypercorn's, unchanged. Plain TCP only: hordelite serves no TLS itself (a
proxy in front terminates it).
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast

import trio
from hypercorn.config import Config
from hypercorn.events import Closed, RawData
from hypercorn.protocol import ProtocolWrapper
from hypercorn.trio.task_group import TaskGroup, _handle
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.typing import ConnectionState
from hypercorn.utils import parse_socket_addr

Message = MutableMapping[str, Any]

# The scope key of an exchange's Inbox.
INBOX = "hordelite.inbox"


class Inbox:
    """The messages of one exchange, from Hypercorn to the application: its
    request's body, then ``http.disconnect`` once its client leaves.

    As trio's memory channel of ``capacity`` (Hypercorn's
    ``max_app_queue_size``): ``put`` waits while it is full (so a client
    sending faster than the application reads is held back by TCP), ``get``
    waits while it is empty, and both are checkpoints."""

    __slots__ = ("_capacity", "_messages", "_ready", "_room", "left", "on_leave")

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._messages: list[Message] = []
        # Made only when a get (a put) has to wait: a held call has neither.
        self._ready: trio.Event | None = None
        self._room: trio.Event | None = None
        # The client left (an ``http.disconnect`` was put).
        self.left = False
        # Called once the client leaves, if set then (see lean.unless_gone).
        self.on_leave: Callable[[], object] | None = None

    async def put(self, message: Message) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._messages) >= self._capacity:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()
        self._messages.append(message)
        if self._ready is not None:
            self._ready.set()
            self._ready = None
        if message["type"] == "http.disconnect":
            self.left = True
            if self.on_leave is not None:
                self.on_leave()
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def get(self) -> Message:
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._messages:
            if self._ready is None:
                self._ready = trio.Event()
            await self._ready.wait()
        message = self._messages.pop(0)
        if self._room is not None:
            self._room.set()
            self._room = None
        await trio.lowlevel.cancel_shielded_checkpoint()
        return message


class _AppTasks(TaskGroup):
    """Hypercorn's trio task group, each application handed an ``Inbox``
    (in its scope too) where Hypercorn hands it a memory channel."""

    async def spawn_app(
        self,
        app: Any,
        config: Config,
        scope: Any,
        send: Callable[[Any], Awaitable[None]],
    ) -> Callable[[Any], Awaitable[None]]:
        inbox = Inbox(config.max_app_queue_size)
        scope[INBOX] = inbox
        assert self._nursery is not None
        self._nursery.start_soon(
            cast(Any, _handle),
            app,
            config,
            scope,
            inbox.get,
            send,
            trio.to_thread.run_sync,
            trio.from_thread.run,
        )
        return inbox.put


class Connection(TCPServer):
    """``TCPServer`` for one accepted plain-TCP connection, ``raw`` its
    socket (the one ``stream`` wraps), with the reading and the inboxes
    the module describes."""

    def __init__(
        self,
        app: Any,
        config: Config,
        context: Any,
        state: Any,
        stream: trio.SocketStream,
        raw: socket.socket,
    ) -> None:
        super().__init__(app, config, context, state, stream)  # type: ignore[arg-type]
        self._raw = raw

    async def run(self) -> None:
        try:
            client = parse_socket_addr(self._raw.family, self._raw.getpeername())
            server = parse_socket_addr(self._raw.family, self._raw.getsockname())
            async with _AppTasks() as task_group:
                self._task_group = task_group
                self.protocol = ProtocolWrapper(
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    False,
                    client,
                    server,
                    self.protocol_send,
                    "http/1.1",
                )
                await self.protocol.initiate()
                await self.idle_task.restart(self._task_group, self._idle_timeout)
                await self._read_data()
        except OSError:
            pass
        finally:
            await self._close()

    async def _read_data(self) -> None:
        sock = self._raw
        while True:
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                data = sock.recv(MAX_RECV)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_readable(sock)
                except trio.ClosedResourceError:  # closed by the idle timer or a send
                    break
                continue
            except OSError:  # reset, or closed meanwhile
                break
            await trio.lowlevel.cancel_shielded_checkpoint()
            await self.protocol.handle(RawData(data))
            if not data:
                break
        await self.protocol.handle(Closed())
