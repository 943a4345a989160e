"""A raw HTTP/1.1 client connection, for tests of what the server does on
the wire (tests/integration/test_connections.py, test_wire.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import anyio.abc

from hordelite.testing._instance import TestHorde

HEARTBEAT = b"GET /api/v2/status/heartbeat HTTP/1.1\r\nHost: t\r\n\r\n"
# Long enough to tell "answered or closed" from a hang, far below a test's timeout.
PATIENCE = 10.0


class Raw:
    """One client connection, speaking HTTP/1.1 by hand."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def send(self, data: bytes) -> None:
        await self.stream.send(data)

    async def receive(self) -> bytes:
        """The next bytes the server sent; b"" once it closed."""
        try:
            return await self.stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return b""

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        """The next answer (status, headers in lower case, body); fails on a close."""
        while b"\r\n\r\n" not in self.buffer:
            data = await self.receive()
            assert data, f"the connection closed before an answer; had {self.buffer!r}"
            self.buffer += data
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            data = await self.receive()
            assert data, "the connection closed inside an answer's body"
            self.buffer += data
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    async def closed(self) -> bool:
        """Waits for the server to close; True then (False: it sent more bytes)."""
        data = await self.receive()
        self.buffer += data
        return data == b""


@contextlib.asynccontextmanager
async def connect(horde: TestHorde) -> AsyncIterator[Raw]:
    host, port = horde.url.removeprefix("http://").rsplit(":", 1)
    async with await anyio.connect_tcp(host, int(port)) as stream:
        yield Raw(stream)


async def assert_heartbeat(conn: Raw) -> None:
    await conn.send(HEARTBEAT)
    status, _, body = await conn.response()
    assert status == 200, body
