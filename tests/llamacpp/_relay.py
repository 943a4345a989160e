"""A TCP relay that records the HTTP requests passing through it.

The worker talks to llama-server through it, so that a test can assert on
the routes the worker really called (``POST /tokenize``, a chat completion
sent or not) while llama-server answers as itself: the bytes are relayed
unchanged both ways, and the client's side is parsed only to note each
request's method, path and body.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc


@dataclasses.dataclass(frozen=True)
class Seen:
    method: str
    path: str
    body: Any  # the decoded JSON body, or None


@dataclasses.dataclass
class Relay:
    url: str
    seen: list[Seen] = dataclasses.field(default_factory=list)

    def paths(self, method: str = "POST") -> list[str]:
        return [s.path for s in self.seen if s.method == method]

    def bodies(self, path: str) -> list[Any]:
        return [s.body for s in self.seen if s.path == path]


class _Parser:
    """Splits the client's byte stream into requests (heads and
    Content-Length bodies, as httpx sends them)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.buffer = b""

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            headers = dict(
                (name.strip().lower(), value.strip())
                for name, _, value in (line.partition(":") for line in head[1:])
            )
            length = int(headers.get("content-length", "0"))
            if len(self.buffer) < end + 4 + length:
                return
            raw = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            method, path, _ = head[0].split(" ", 2)
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            self.relay.seen.append(Seen(method, path, body))


@contextlib.asynccontextmanager
async def open_relay(port: int) -> AsyncIterator[Relay]:
    """A relay on 127.0.0.1 (an ephemeral port) to 127.0.0.1:``port``."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    relay = Relay(f"http://127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}")

    async def pipe(
        source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, parser: _Parser | None
    ) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            async for data in source:
                if parser is not None:
                    parser.feed(data)
                await sink.send(data)
        with contextlib.suppress(anyio.BrokenResourceError, OSError):
            await sink.send_eof()

    async def handle(client: anyio.abc.SocketStream) -> None:
        async with client, await anyio.connect_tcp("127.0.0.1", port) as server:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pipe, client, server, _Parser(relay))
                tg.start_soon(pipe, server, client, None)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        try:
            yield relay
        finally:
            tg.cancel_scope.cancel()
