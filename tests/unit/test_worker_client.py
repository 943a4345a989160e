"""The worker's HTTP client (hordelite/worker/_client.py) against a peer of
the test's own: JSON both ways, connections kept alive and reused, a kept
connection the peer closed meanwhile replaced without a failure, a stream
read line by line, a peer that never answers cut at the deadline, and
httpx's client chosen when a proxy applies."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest

from hordelite.worker._client import Client, TransportError, open_client
from tests.integration._helpers import eventually

pytestmark = pytest.mark.anyio

Handler = Callable[[anyio.abc.SocketStream], Awaitable[None]]


class Peer:
    """An HTTP/1.1 peer on loopback: ``connections`` counts the accepted ones."""

    def __init__(self) -> None:
        self.connections = 0
        self.closed = 0  # connections the peer has closed
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.url = ""


async def _read_request(stream: anyio.abc.SocketStream, buffer: bytes) -> tuple[Any, bytes]:
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive()
        buffer += data
    head, _, rest = buffer.partition(b"\r\n\r\n")
    line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines)}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        rest += await stream.receive()
    return (line, headers, rest[:length]), rest[length:]


@asynccontextmanager
async def peer(
    answer: Callable[[Peer, str, bytes], bytes], close_after: int = 0
) -> AsyncIterator[Peer]:
    """A peer answering each request with ``answer(peer, request line,
    body)``; with ``close_after``, it closes a connection after that many
    answers (as a server whose keep-alive timeout ran out)."""
    p = Peer()

    async def serve(stream: anyio.abc.SocketStream) -> None:
        p.connections += 1
        buffer, answered = b"", 0
        try:
            async with stream:
                while not (close_after and answered >= close_after):
                    (line, headers, body), buffer = await _read_request(stream, buffer)
                    p.requests.append((line, headers, body))
                    await stream.send(answer(p, line, body))
                    answered += 1
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass
        finally:
            p.closed += 1  # its end is closed now

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    p.url = f"http://127.0.0.1:{port}/api"
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        try:
            yield p
        finally:
            tg.cancel_scope.cancel()


def echo(_: Peer, line: str, body: bytes) -> bytes:
    data = json.dumps({"line": line, "got": json.loads(body) if body else None}).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data)


async def test_json_goes_both_ways_on_one_kept_alive_connection() -> None:
    async with peer(echo) as p:
        client = Client(p.url, {"apikey": "k"}, 5, 5)
        try:
            first = await client.request("POST", "/pop", {"name": "w"})
            second = await client.request("GET", "/status")
        finally:
            await client.aclose()
    assert first.status_code == 200
    assert first.json() == {"line": "POST /api/pop HTTP/1.1", "got": {"name": "w"}}
    assert second.json()["line"] == "GET /api/status HTTP/1.1"
    assert p.connections == 1
    _, headers, _ = p.requests[0]
    assert headers["apikey"] == "k"
    assert headers["content-type"] == "application/json"
    assert headers["host"] == p.url.split("/")[2]


async def test_a_kept_connection_the_peer_closed_is_replaced_without_a_failure() -> None:
    async with peer(echo, close_after=1) as p:
        client = Client(p.url, {}, 5, 5)
        try:
            for n in range(3):
                assert (await client.request("POST", "/submit", {"n": n})).json()["got"] == {"n": n}
                await eventually(lambda n=n: p.closed > n)  # type: ignore[misc]
        finally:
            await client.aclose()
    assert p.connections == 3
    assert [json.loads(body) for _, _, body in p.requests] == [{"n": 0}, {"n": 1}, {"n": 2}]


async def test_an_error_status_is_an_answer_and_a_peer_that_never_answers_is_cut() -> None:
    def refuse(_: Peer, line: str, body: bytes) -> bytes:
        if "slow" in line:
            return b""  # never answers
        return b'HTTP/1.1 400 Bad\r\ncontent-length: 13\r\n\r\n{"rc": "Bad"}'

    async with peer(refuse) as p:
        client = Client(p.url, {}, 5, 5)
        try:
            refused = await client.request("POST", "/x", {})
            assert (refused.status_code, refused.is_success, refused.json()) == (
                400,
                False,
                {"rc": "Bad"},
            )
            with anyio.fail_after(3), pytest.raises(TransportError, match="no answer in time"):
                await client.request("GET", "/slow", within=0.2)
        finally:
            await client.aclose()


async def test_a_stream_is_read_line_by_line_and_its_connection_kept() -> None:
    def events(_: Peer, line: str, body: bytes) -> bytes:
        chunks = [b'data: {"n": 1}\n\n', b'data: {"n": 2}\n', b"\ndata: [DONE]\n\n"]
        out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        for chunk in chunks:
            out += b"%x\r\n%s\r\n" % (len(chunk), chunk)
        return out + b"0\r\n\r\n"

    async with peer(events) as p:
        client = Client(p.url, {}, 5, 5)
        try:
            async with client.stream("POST", "/v1/chat", {"stream": True}) as answer:
                assert answer.is_success
                lines = [line async for line in answer.aiter_lines()]
            again = await client.request("POST", "/v1/chat", {})
        finally:
            await client.aclose()
    assert [x for x in lines if x] == ['data: {"n": 1}', 'data: {"n": 2}', "data: [DONE]"]
    assert again.status_code == 200
    assert p.connections == 1


async def test_nobody_listening_is_a_transport_error() -> None:
    async with peer(echo) as p:
        url = p.url
    client = Client(url, {}, 5, 1)
    with pytest.raises(TransportError):
        await client.request("GET", "/status")
    await client.aclose()


def test_a_proxy_in_the_environment_gets_httpx_and_no_proxy_the_lean_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(open_client("http://horde.example:7001", {}, 5, 5), Client)
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    assert not isinstance(open_client("http://horde.example:7001", {}, 5, 5), Client)
    monkeypatch.setenv("no_proxy", "horde.example")
    assert isinstance(open_client("http://horde.example:7001", {}, 5, 5), Client)
