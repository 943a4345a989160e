"""A strict wire (decision 0050): raw sockets against the in-process horde.

Each head a proxy in front could frame otherwise (Transfer-Encoding beside
Content-Length, either twice, a coding other than chunked, obs-fold, bare
LF) gets 400 in the horde's envelope and the connection closes, and a request
smuggled inside such a body never runs; a head over ``max_header_bytes``
gets 431 however it is written; cleartext HTTP/2 is served only with
``server.h2c``, and then an HTTP/2 client that leaves before its answer does
not hold the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from anyio.streams.text import TextReceiveStream
from prometheus_client.parser import text_string_to_metric_families

from hordelite.config import Config
from hordelite.testing import open_horde
from hordelite.testing._instance import TestHorde
from tests.integration._raw import HEARTBEAT, PATIENCE, Raw, assert_heartbeat, connect

pytestmark = pytest.mark.anyio

HEARTBEAT_ROUTE = "/api/v2/status/heartbeat"


def server(**keys: Any) -> Config:
    return Config().replace(server=keys)


async def assert_refused_and_closed(conn: Raw, status: int, rc: str, *words: str) -> None:
    """The next answer is ``status`` in the horde's envelope, naming each
    of ``words``, and the connection closes after it."""
    got, headers, body = await conn.response()
    assert got == status, body
    answer = json.loads(body)
    assert answer["rc"] == rc
    for word in words:
        assert word in answer["message"], answer
    assert headers["connection"].lower() == "close"
    assert await conn.closed()


async def heartbeats_answered(horde: TestHorde) -> float:
    """GET /api/v2/status/heartbeat answers the app counted (its /metrics)."""
    async with connect(horde) as conn:
        await conn.send(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        status, _, body = await conn.response()
    assert status == 200
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "hordelite_http_requests_total"
        and sample.labels["route"] == HEARTBEAT_ROUTE
    )


# Framing a proxy could read otherwise --------------------------------------------------------


async def test_transfer_encoding_with_content_length_is_refused_and_the_hidden_request_never_runs() -> (
    None
):
    # Read by its Content-Length (as a proxy in front may), the body holds
    # a heartbeat GET; read as chunked (as h11 did), the body ends at "0"
    # and the GET runs as the connection's next request.
    hidden = HEARTBEAT
    body = b"0\r\n\r\n" + hidden
    head = (
        f"POST /api/v2/generate/text/async HTTP/1.1\r\nHost: t\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    async with open_horde() as horde:
        with anyio.fail_after(PATIENCE):
            async with connect(horde) as conn:
                await conn.send(head + body)
                await assert_refused_and_closed(
                    conn, 400, "BadRequest", "Transfer-Encoding", "Content-Length"
                )
            assert await heartbeats_answered(horde) == 0
            # The count is live: a heartbeat sent plainly is counted.
            async with connect(horde) as conn:
                await assert_heartbeat(conn)
            assert await heartbeats_answered(horde) == 1


def _get(*headers: str, body: bytes = b"") -> bytes:
    """A heartbeat GET with ``headers`` (each a whole line, without its CRLF)."""
    lines = "".join(f"{h}\r\n" for h in headers)
    return f"GET {HEARTBEAT_ROUTE} HTTP/1.1\r\nHost: t\r\n{lines}\r\n".encode() + body


# The heartbeat answers 200 to each of these when they are let through.
REFUSED = [
    pytest.param(
        _get("Content-Length: 1", "Content-Length: 1", body=b"x"),
        "Content-Length",
        id="two-equal-content-lengths",
    ),
    pytest.param(
        _get("Content-Length: 1, 1", body=b"x"), "Content-Length", id="content-length-list"
    ),
    pytest.param(
        _get("Transfer-Encoding: chunked", "Transfer-Encoding: chunked", body=b"0\r\n\r\n"),
        "Transfer-Encoding",
        id="two-transfer-encodings",
    ),
    pytest.param(
        _get("Transfer-Encoding: gzip, chunked", body=b"0\r\n\r\n"),
        "Transfer-Encoding",
        id="a-coding-other-than-chunked",
    ),
    pytest.param(_get("X-A: a", " b"), "obs-fold", id="obs-fold-space"),
    pytest.param(
        _get("Transfer-Encoding:", "\tchunked", body=b"0\r\n\r\n"),
        "obs-fold",
        id="obs-fold-tab-of-transfer-encoding",
    ),
    pytest.param(HEARTBEAT.replace(b"\r\n", b"\n"), "bare LF", id="bare-lf-everywhere"),
    pytest.param(_get("X-A: a\nX-B: b"), "bare LF", id="bare-lf-in-one-line"),
]


@pytest.mark.parametrize(("request_bytes", "word"), REFUSED)
async def test_an_ambiguous_head_gets_400_naming_it_and_the_connection_closes(
    request_bytes: bytes, word: str
) -> None:
    async with open_horde() as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            await conn.send(request_bytes)
            await assert_refused_and_closed(conn, 400, "BadRequest", word)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(_get("Transfer-Encoding: chunked", body=b"0\r\n\r\n"), id="chunked"),
        pytest.param(_get("Transfer-Encoding: Chunked", body=b"0\r\n\r\n"), id="Chunked"),
        pytest.param(_get("Content-Length: 1", body=b"x"), id="one-length"),
        pytest.param(_get("X-Content-Length: 1", "Content-Length: 0"), id="a-lookalike-name"),
        pytest.param(HEARTBEAT + HEARTBEAT, id="two-pipelined"),
    ],
)
async def test_plainly_framed_requests_are_served_and_kept_alive(request_bytes: bytes) -> None:
    async with open_horde() as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            await conn.send(request_bytes)
            for _ in range(request_bytes.count(b"GET ")):
                status, _, body = await conn.response()
                assert status == 200, body
            await assert_heartbeat(conn)


# The header block's bound --------------------------------------------------------------------


def _head_of(size: int) -> bytes:
    """A heartbeat GET whose head is exactly ``size`` bytes."""
    short = _get("X-Pad: ")
    return _get("X-Pad: " + "y" * (size - len(short)))


@pytest.mark.parametrize("size", [17 * 1024, 20 * 1024])
async def test_a_head_over_the_bound_in_one_write_gets_431_and_the_connection_closes(
    size: int,
) -> None:
    async with open_horde() as horde, connect(horde) as conn:  # 16 KiB by default
        with anyio.fail_after(PATIENCE):
            await conn.send(_head_of(size))
            await assert_refused_and_closed(conn, 431, "RequestHeaderFieldsTooLarge", "16384")


async def test_a_head_over_the_bound_completed_by_its_last_write_gets_431() -> None:
    # Sixteen writes of 1 KiB hold no more than the bound while the head is
    # incomplete, which is all h11 measures; the last write completes it.
    head = _head_of(19 * 1024)
    async with open_horde() as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            for start in range(0, 16 * 1024, 1024):
                await conn.send(head[start : start + 1024])
            await conn.send(head[16 * 1024 :])
            await assert_refused_and_closed(conn, 431, "RequestHeaderFieldsTooLarge")


async def test_a_head_at_the_bound_is_served_whether_written_whole_or_in_pieces() -> None:
    head = _head_of(16 * 1024)
    async with open_horde() as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            await conn.send(head)
            status, _, _ = await conn.response()
            assert status == 200
            # In pieces cut between a CR and its LF, and inside the last CRLFCRLF.
            for piece in (head[:17], head[17:-3], head[-3:-1], head[-1:]):
                await conn.send(piece)
            status, _, _ = await conn.response()
            assert status == 200


# A chunked body's chunk sizes ------------------------------------------------------------------

# Routes that read their body before anything else: a generation's submit,
# an OpenAI call, and a route of the native API's other routes.
CHUNKED_ROUTES = [
    pytest.param("/api/v2/generate/text/async", id="native-submit"),
    pytest.param("/v1/chat/completions", id="openai-call"),
    pytest.param("/api/v2/kudos/transfer", id="native-route"),
]


def _chunked(route: str, chunks: bytes) -> bytes:
    return (
        f"POST {route} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        "Authorization: Bearer 0000000000\r\napikey: 0000000000\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode() + chunks


# body_timeout far above PATIENCE: a size waited for is a failure, not a 408.
CHUNKED_LIMIT = server(max_body_bytes=1024, body_timeout=600)


@pytest.mark.parametrize("route", CHUNKED_ROUTES)
@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param(b"ffffffffffffffffffff\r\n", id="20-hex-digits"),
        pytest.param(b"401\r\n", id="one-past-the-limit"),
        pytest.param(b"200\r\n" + b"x" * 512 + b"\r\n201\r\n", id="the-second-chunk-past-it"),
    ],
)
async def test_a_chunk_size_past_the_body_limit_gets_413_at_once(route: str, chunks: bytes) -> None:
    async with open_horde(config=CHUNKED_LIMIT) as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            await conn.send(_chunked(route, chunks))
            await assert_refused_and_closed(conn, 413, "PayloadTooLarge", "1024", "max_body_bytes")


@pytest.mark.parametrize("route", CHUNKED_ROUTES)
async def test_a_chunk_size_line_of_leading_zeros_gets_400_at_once(route: str) -> None:
    async with open_horde(config=CHUNKED_LIMIT) as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            await conn.send(_chunked(route, b"0" * 4000))
            await assert_refused_and_closed(conn, 400, "BadRequest", "chunk-size line")


async def test_chunked_bodies_up_to_the_limit_are_read_on_a_kept_alive_connection() -> None:
    # Two requests, each at the limit in two chunks: the count starts afresh
    # with each request.
    chunks = b"200\r\n" + b" " * 512 + b"\r\n0200\r\n" + b" " * 510 + b"{}\r\n0\r\n\r\n"
    async with open_horde(config=CHUNKED_LIMIT) as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            for _ in range(2):
                await conn.send(_chunked("/api/v2/generate/text/async", chunks))
                status, headers, body = await conn.response()
                # Read whole and judged by the app: an empty submit names its prompt.
                assert status == 400, body
                assert json.loads(body)["rc"] != "PayloadTooLarge"
                assert headers.get("connection", "").lower() != "close"


# Cleartext HTTP/2 -----------------------------------------------------------------------------

UPGRADE = (
    f"GET {HEARTBEAT_ROUTE} HTTP/1.1\r\nHost: t\r\n"
    "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: {settings}\r\n\r\n"
)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def h2_client() -> h2.connection.H2Connection:
    return h2.connection.H2Connection(
        config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )


async def h2_answer(conn: Raw, client: h2.connection.H2Connection, stream_id: int) -> int:
    """Read frames until ``stream_id`` ends; its :status."""
    status = 0
    data, conn.buffer = conn.buffer, b""
    while True:
        for event in client.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id:
                status = int(dict(event.headers)[":status"])
            elif isinstance(event, h2.events.DataReceived):
                client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream_id:
                return status
        outgoing = client.data_to_send()
        if outgoing:
            await conn.send(outgoing)
        data = await conn.receive()
        assert data, "the connection closed before the HTTP/2 answer"


async def test_by_default_an_h2c_upgrade_is_answered_in_http_1_1_and_kept_alive() -> None:
    async with open_horde() as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            await conn.send(UPGRADE.format(settings="AAMAAABkAARAAAAAAAIAAAAA").encode())
            status, headers, body = await conn.response()
            assert status == 200, body
            assert "upgrade" not in headers
            await assert_heartbeat(conn)


async def test_by_default_the_http2_preface_gets_400_and_the_connection_closes() -> None:
    async with open_horde() as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            await conn.send(PREFACE)
            await assert_refused_and_closed(conn, 400, "BadRequest", "HTTP/2", "server.h2c")


async def test_with_h2c_on_http2_with_prior_knowledge_is_served() -> None:
    client = h2_client()
    client.initiate_connection()
    client.send_headers(
        1,
        [(":method", "GET"), (":path", HEARTBEAT_ROUTE), (":scheme", "http"), (":authority", "t")],
        end_stream=True,
    )
    async with open_horde(config=server(h2c=True)) as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            await conn.send(client.data_to_send())
            assert await h2_answer(conn, client, 1) == 200


async def test_with_h2c_on_an_upgrade_switches_to_http2_and_answers_on_stream_1() -> None:
    client = h2_client()
    settings = client.initiate_upgrade_connection()
    async with open_horde(config=server(h2c=True)) as horde, connect(horde) as conn:
        with anyio.fail_after(PATIENCE):
            await conn.send(UPGRADE.format(settings=settings.decode()).encode())
            while b"\r\n\r\n" not in conn.buffer:
                data = await conn.receive()
                assert data, "the connection closed before the 101"
                conn.buffer += data
            head, conn.buffer = conn.buffer.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 101"), head
            await conn.send(client.data_to_send())  # the client's preface
            assert await h2_answer(conn, client, 1) == 200


@contextlib.asynccontextmanager
async def serve_process(tmp_path: Path, backend: str) -> AsyncIterator[anyio.abc.Process]:
    """``hordelite serve`` with h2c on, as a process: a server that hangs can
    then be killed, where one in this process would hang the test."""
    config = tmp_path / "hordelite.toml"
    config.write_text(
        "[server]\nport = 0\ngrace_period = 1\nh2c = true\n"
        f'backend = "{backend}"\n[storage]\ndatabase = "{tmp_path / "h.db"}"\n',
        encoding="utf-8",
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HORDELITE_")}
    process = await anyio.open_process(
        [sys.executable, "-m", "hordelite", "--config", str(config), "serve"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        env=environment,
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.aclose()


async def banner_url(process: anyio.abc.Process) -> str:
    assert process.stdout is not None
    text = ""
    async for chunk in TextReceiveStream(process.stdout):
        text += chunk
        if "keys create" in text:  # the banner's last line
            return next(w for w in text.split() if w.startswith("http://"))
    pytest.fail(f"hordelite serve exited before its banner: {text!r}")


async def _upgrade(conn: Raw) -> None:
    """Ask for the upgrade and read the 101; never send the preface."""
    await conn.send(UPGRADE.format(settings="AAMAAABkAARAAAAAAAIAAAAA").encode())
    while b"\r\n\r\n" not in conn.buffer:
        data = await conn.receive()
        assert data, "the connection closed before the 101"
        conn.buffer += data
    assert conn.buffer.startswith(b"HTTP/1.1 101")


async def _request_with_no_window(conn: Raw) -> None:
    """An HTTP/2 request with prior knowledge, with a window of 0 (the server
    can send the answer's head, never its body), until its answer began."""
    client = h2_client()
    client.initiate_connection()
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    client.send_headers(
        1,
        [(":method", "GET"), (":path", HEARTBEAT_ROUTE), (":scheme", "http"), (":authority", "t")],
        end_stream=True,
    )
    await conn.send(client.data_to_send())
    while True:
        data = await conn.receive()
        assert data, "the connection closed before the answer's head"
        if any(isinstance(e, h2.events.ResponseReceived) for e in client.receive_data(data)):
            return


@pytest.mark.parametrize(
    ("start", "leaves"),
    [
        pytest.param(_upgrade, True, id="upgraded-then-left"),
        pytest.param(_request_with_no_window, True, id="answer-begun-then-left"),
        pytest.param(_request_with_no_window, False, id="answer-begun-and-stays"),
    ],
)
async def test_with_h2c_on_an_http2_answer_never_sent_does_not_hold_the_stop(
    tmp_path: Path,
    anyio_backend: str,
    start: Callable[[Raw], Awaitable[None]],
    leaves: bool,
) -> None:
    # An answer waits to be sent to a client that left, or that gives it no
    # window: the server must still stop within its grace period (1 s).
    async with serve_process(tmp_path, anyio_backend) as process:
        with anyio.fail_after(3 * PATIENCE):  # a start, not a hang
            url = await banner_url(process)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        async with await anyio.connect_tcp(host, int(port)) as stream:
            with anyio.fail_after(PATIENCE):
                await start(Raw(stream))
            if leaves:
                await stream.aclose()
            process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(PATIENCE):
                await process.wait()
        assert process.returncode == 0, f"the server did not stop cleanly: {process.returncode}"
