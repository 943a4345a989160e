"""The strict wire's head check (hordelite.http.wire), fed byte by byte.

A head arrives in whatever reads the network makes of it: each check must
give the same verdict when a CR and its LF, or a line end and the space of
an obs-fold after it, arrive in different reads. The integration tests
(tests/integration/test_wire.py) cannot choose the server's reads; here the
connection is fed one byte per read.
"""

from __future__ import annotations

import h11
import pytest

from hordelite.http.wire import StrictConnection, error_body

HEAD = b"GET /api/v2/status/heartbeat HTTP/1.1\r\nHost: t\r\nX-A: a\r\n\r\n"


def feed(data: bytes, *, step: int, max_head: int = 16384, h2c: bool = False) -> object:
    """The first event other than NEED_DATA, feeding ``step`` bytes a read."""
    conn = StrictConnection(max_head, h2c)
    for start in range(0, len(data), step):
        conn.receive_data(data[start : start + step])
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
    return conn.next_event()


def refusal(data: bytes, *, step: int, max_head: int = 16384) -> h11.RemoteProtocolError:
    with pytest.raises(h11.RemoteProtocolError) as caught:
        feed(data, step=step, max_head=max_head)
    return caught.value


@pytest.mark.parametrize("step", [1, 2, 3, 1000])
def test_a_plain_head_is_a_request_in_any_reads(step: int) -> None:
    event = feed(HEAD, step=step)
    assert isinstance(event, h11.Request)
    assert event.target == b"/api/v2/status/heartbeat"


@pytest.mark.parametrize("step", [1, 2, 3, 1000])
@pytest.mark.parametrize(
    ("data", "word"),
    [
        (HEAD.replace(b"X-A: a\r\n", b"X-A: a\r\n b\r\n"), "obs-fold"),
        (HEAD.replace(b"X-A: a\r\n", b"X-A: a\r\n\tb\r\n"), "obs-fold"),
        (HEAD.replace(b"Host: t\r\n", b"Host: t\n"), "bare LF"),
        (HEAD.replace(b"\r\n\r\n", b"\r\n\n"), "bare LF"),
        (HEAD.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\n"), "bare LF"),
    ],
)
def test_a_bad_line_is_refused_in_any_reads(data: bytes, word: str, step: int) -> None:
    exc = refusal(data, step=step)
    assert exc.error_status_hint == 400
    assert word in str(exc)


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_the_head_bound_counts_the_whole_head_in_any_reads(step: int) -> None:
    at_bound = HEAD.replace(b"X-A: a", b"X-A: " + b"a" * (1024 - len(HEAD) + 1))
    assert len(at_bound) == 1024
    assert isinstance(feed(at_bound, step=step, max_head=1024), h11.Request)
    over = at_bound.replace(b"X-A: a", b"X-A: aa")
    assert refusal(over, step=step, max_head=1024).error_status_hint == 431


def test_a_body_after_the_head_is_neither_measured_nor_checked() -> None:
    # A body of bare LFs, obs-fold-looking lines and more than the bound.
    body = b"a\n b\n" * 1000
    head = HEAD.replace(b"\r\n\r\n", f"\r\nContent-Length: {len(body)}\r\n\r\n".encode())
    assert isinstance(feed(head + body, step=len(head) + len(body), max_head=1024), h11.Request)


@pytest.mark.parametrize(
    ("headers", "word"),
    [
        (b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n", "together"),
        (b"transfer-encoding: chunked\r\ncontent-length: 1\r\n", "together"),
        (b"Content-Length: 1\r\nContent-Length: 1\r\n", "More than one Content-Length"),
        (b"Content-Length: 1,1\r\n", "More than one Content-Length"),
        (b"Transfer-Encoding: chunked\r\nTRANSFER-ENCODING: chunked\r\n", "Transfer-Encoding"),
        (b"Transfer-Encoding: chunked, chunked\r\n", "other than chunked"),
        (b"Transfer-Encoding: identity\r\n", "other than chunked"),
    ],
)
def test_ambiguous_framing_is_refused_naming_the_header(headers: bytes, word: str) -> None:
    exc = refusal(HEAD.replace(b"X-A: a\r\n", headers), step=1000)
    assert exc.error_status_hint == 400
    assert word in str(exc)


def test_the_http2_preface_is_refused_unless_h2c_is_on() -> None:
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    with pytest.raises(h11.RemoteProtocolError, match="h2c"):
        feed(preface, step=100)
    # Left to Hypercorn, which switches to HTTP/2 on it.
    assert isinstance(feed(preface, step=100, h2c=True), h11.Request)


def test_the_error_body_is_the_horde_envelope_with_the_status_name_as_rc() -> None:
    assert (
        error_body(431, "too big") == b'{"message": "too big", "rc": "RequestHeaderFieldsTooLarge"}'
    )
    assert error_body(400, "") == b'{"message": "Bad Request", "rc": "BadRequest"}'


# A chunked body's chunk sizes (server.max_body_bytes) ---------------------------------------

CHUNKED_HEAD = (
    b"POST /api/v2/generate/text/async HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def body_events(data: bytes, *, step: int, max_body: int = 1024) -> list[object]:
    """Every event of ``data`` (a request and its body), ``step`` bytes a read."""
    conn = StrictConnection(16384, False, max_body)
    events: list[object] = []
    for start in range(0, len(data), step):
        conn.receive_data(data[start : start + step])
        while (event := conn.next_event()) is not h11.NEED_DATA:
            events.append(event)
            if isinstance(event, h11.EndOfMessage):
                return events
    return events


def body_refusal(data: bytes, *, step: int) -> h11.RemoteProtocolError:
    with pytest.raises(h11.RemoteProtocolError) as caught:
        body_events(data, step=step)
    return caught.value


@pytest.mark.parametrize("step", [1, 2, 1000])
@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param(b"ffffffffffffffffffff\r\n", id="20-hex-digits"),
        pytest.param(b"401\r\n", id="one-past-the-limit"),
        pytest.param(b"200\r\n" + b"x" * 512 + b"\r\n201\r\n", id="the-second-chunk-past-it"),
    ],
)
def test_a_chunk_size_past_the_body_limit_is_refused_with_413_before_its_bytes(
    chunks: bytes, step: int
) -> None:
    exc = body_refusal(CHUNKED_HEAD + chunks, step=step)
    assert exc.error_status_hint == 413
    assert "max_body_bytes" in str(exc)


@pytest.mark.parametrize("step", [1, 1000])
def test_a_chunk_size_line_of_leading_zeros_without_end_is_refused_with_400(step: int) -> None:
    exc = body_refusal(CHUNKED_HEAD + b"0" * 2000, step=step)
    assert exc.error_status_hint == 400
    assert "chunk-size line" in str(exc)


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_chunks_summing_to_the_body_limit_are_read_whole(step: int) -> None:
    body = b"200\r\n" + b"x" * 512 + b"\r\n0200\r\n" + b"y" * 512 + b"\r\n0\r\n\r\n"
    events = body_events(CHUNKED_HEAD + body + CHUNKED_HEAD, step=step)
    assert isinstance(events[-1], h11.EndOfMessage)
    data = b"".join(e.data for e in events if isinstance(e, h11.Data))
    assert data == b"x" * 512 + b"y" * 512


def test_the_payload_refusal_carries_the_apps_rc() -> None:
    assert b'"rc": "PayloadTooLarge"' in error_body(413, "too large")
