"""Redis commands and pub/sub on connections the calling task drives itself (RESP2).

A client that runs every connection with a reader task and a writer task
of its own (coredis, which the signals used until decision 0067) passes a
command through both and a memory stream each way, four or five task
switches: about 200 us of the server's CPU a command against about 60 us
for the same round trip driven by the caller (decision 0059,
bench/redis_clients.py). ``Commands`` sends each command and reads its
reply in the calling task, on one of a few pooled connections; ``listen``
reads a subscribed connection's messages in the listening task and hands
each to its callback.

What a connection that failed in any way held is unknown (a reply may be
on its way), so it is closed, never pooled again: a timeout or a
cancellation can never leave a connection answering the wrong command.
Errors are the caller's: ``OSError``, ``anyio`` stream errors and
``TimeoutError`` say Redis is unreachable (the circuit of ``RedisSignals``
opens on them), ``RedisReplyError`` that Redis refused the command.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio
import anyio.abc

from hordelite.errors import HordeliteError

# Connections kept idle for the next command; more may be open at once
# while commands run concurrently.
_IDLE_CONNECTIONS = 8
_RECEIVE_BYTES = 65536
_CRLF = b"\r\n"

Arg = str | bytes | int | float


class RedisReplyError(HordeliteError):
    """Redis answered a command with an error reply (``-ERR ...``)."""


def encode(args: Sequence[Arg]) -> bytes:
    """One command in RESP2: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class _Parser:
    """Replies read from a buffer: ``parse`` answers one, or raises
    ``_Incomplete`` when the buffer does not hold a whole one yet."""

    def __init__(self) -> None:
        self.buffer = b""
        self._at = 0

    def parse(self) -> Any:
        self._at = 0
        reply = self._reply()
        self.buffer = self.buffer[self._at :]
        return reply

    def _line(self) -> bytes:
        end = self.buffer.find(_CRLF, self._at)
        if end < 0:
            raise _Incomplete
        line = self.buffer[self._at : end]
        self._at = end + len(_CRLF)
        return line

    def _reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            end = self._at + size
            after = end + len(_CRLF)
            if len(self.buffer) < after:
                raise _Incomplete
            data = self.buffer[self._at : end]
            self._at = after
            # hordelite writes only UTF-8; bytes another client wrote read as
            # replacement characters (unreadable JSON), never a crash.
            return data.decode(errors="replace")
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self._reply() for _ in range(count)]
        if kind == b"-":
            return RedisReplyError(rest.decode())
        raise OSError(f"unreadable reply from Redis: {line[:40]!r}")


def _confirmed(reply: Any) -> None:
    """Check one reply to SUBSCRIBE or PSUBSCRIBE: [kind, name, count]."""
    if isinstance(reply, RedisReplyError):
        raise reply
    if not (isinstance(reply, list) and reply[:1] in (["subscribe"], ["psubscribe"])):
        raise OSError(f"unexpected reply to a subscription: {reply!r:.80}")


class _Incomplete(HordeliteError):
    """More bytes are needed for a whole reply."""


class _Connection:
    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.parser = _Parser()

    async def replies(self, data: bytes, count: int) -> list[Any]:
        await self.stream.send(data)
        return [await self.reply() for _ in range(count)]

    async def reply(self) -> Any:
        """The next reply (or pushed message), read from the buffer first."""
        while True:
            try:
                return self.parser.parse()
            except _Incomplete:
                try:
                    chunk = await self.stream.receive(_RECEIVE_BYTES)
                except anyio.EndOfStream:
                    raise ConnectionError("Redis closed the connection") from None
                self.parser.buffer += chunk


class Commands:
    """Request and reply commands to the Redis of ``url`` (redis:// or
    rediss://, with its user, password and database)."""

    def __init__(self, url: str, connect_timeout: float) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 6379
        self._tls = parts.scheme == "rediss"
        self._user = unquote(parts.username) if parts.username else None
        self._password = unquote(parts.password) if parts.password else None
        path = parts.path.strip("/")
        self._db = int(path) if path.isdigit() else 0
        self._connect_timeout = connect_timeout
        self._idle: list[_Connection] = []

    async def call(self, *args: Arg) -> Any:
        """One command's reply (bulk strings decoded as UTF-8); raises
        RedisReplyError for an error reply."""
        [reply] = await self.pipeline([args])
        if isinstance(reply, RedisReplyError):
            raise reply
        return reply

    async def pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """The replies of several commands sent in one round trip; an error
        reply is returned in its place, as a RedisReplyError."""
        connection = self._idle.pop() if self._idle else await self._connect()
        try:
            replies = await connection.replies(b"".join(encode(c) for c in commands), len(commands))
        except BaseException:
            # Whatever it still holds is unknown: never used again.
            with anyio.CancelScope(shield=True):
                await connection.stream.aclose()
            raise
        if len(self._idle) < _IDLE_CONNECTIONS:
            self._idle.append(connection)
        else:
            await connection.stream.aclose()
        return replies

    async def listen(
        self,
        channels: Sequence[str],
        patterns: Sequence[str],
        subscribed: Callable[[], None],
        heard: Callable[[str, str], None],
    ) -> None:
        """Subscribe a connection of its own to ``channels`` and ``patterns``,
        call ``subscribed()`` once Redis confirmed them all (within the
        connect timeout), then ``heard(channel, data)`` for each message, in
        this task, until the connection fails (raises, as a command does) or
        the caller is cancelled. The connection is never pooled."""
        connection = await self._connect()
        try:
            with anyio.fail_after(self._connect_timeout):
                await connection.stream.send(
                    (encode(["SUBSCRIBE", *channels]) if channels else b"")
                    + (encode(["PSUBSCRIBE", *patterns]) if patterns else b"")
                )
                for _ in range(len(channels) + len(patterns)):
                    _confirmed(await connection.reply())
            subscribed()
            while True:
                match await connection.reply():
                    case ["message", str(channel), str(data)]:
                        heard(channel, data)
                    case ["pmessage", _, str(channel), str(data)]:
                        heard(channel, data)
                    case other:
                        raise OSError(f"unexpected reply on a subscribed connection: {other!r:.80}")
        finally:
            with anyio.CancelScope(shield=True):
                await connection.stream.aclose()

    async def _connect(self) -> _Connection:
        with anyio.fail_after(self._connect_timeout):
            stream: anyio.abc.ByteStream
            if self._tls:
                stream = await anyio.connect_tcp(
                    self._host, self._port, ssl_context=ssl.create_default_context()
                )
            else:
                stream = await anyio.connect_tcp(self._host, self._port)
            connection = _Connection(stream)
            setup: list[list[Arg]] = []
            if self._password is not None:
                auth: list[Arg] = ["AUTH", self._password]
                if self._user is not None:
                    auth.insert(1, self._user)
                setup.append(auth)
            if self._db:
                setup.append(["SELECT", self._db])
            if setup:
                try:
                    replies = await connection.replies(
                        b"".join(encode(c) for c in setup), len(setup)
                    )
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        await stream.aclose()
                    raise
                errors = [r for r in replies if isinstance(r, RedisReplyError)]
                if errors:
                    await stream.aclose()
                    raise OSError(f"Redis refused the connection's set-up: {errors[0]}")
        return connection

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.stream.aclose()
