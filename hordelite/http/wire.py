"""A strict HTTP/1.1 wire: heads a proxy could read otherwise are refused.

h11, which parses HTTP/1.1 for Hypercorn, is lenient where RFC 9112 lets a
server be: it unfolds obs-fold header lines, takes a bare LF for a line
end, lets ``Transfer-Encoding: chunked`` win over a ``Content-Length``
beside it, and collapses equal ``Content-Length`` headers into one. A proxy
in front that reads the same bytes another way (its own length, its own line
ends) forwards a different request boundary than hordelite parses, and the
bytes in between run as a request the proxy never saw. So each request head
is checked here before h11 parses it, and any of these is refused with 400
and the connection closed (see decision 0050):

- ``Transfer-Encoding`` together with ``Content-Length``;
- more than one ``Content-Length`` (also a list such as ``5, 5``), more than
  one ``Transfer-Encoding``, or a ``Transfer-Encoding`` other than
  ``chunked`` (h11 refuses the last two itself, with a bare 501);
- a header line starting with a space or a tab (obs-fold);
- a line of the head ending in a bare LF.

A chunked body is checked the same way, chunk by chunk, before h11 reads
each chunk-size line: h11 takes a size of up to 20 hex digits and then waits
for that many bytes, so a size past ``server.max_body_bytes`` held the
connection until the body's timeout. A size that takes the body past the
limit is refused with 413 (``PayloadTooLarge``, as a ``Content-Length`` past
it is) as soon as its digits say so, and a chunk-size line over
MAX_CHUNK_LINE_BYTES (leading zeros without end) with 400.

h11's ``max_incomplete_event_size`` bounds only a head still incomplete
after a read, so a head arriving whole in one read (or completed by its last
one) passed ``server.max_header_bytes`` by up to a read's size. The head is
measured here whatever the reads: past the limit, 431 and the connection is
closed.

HTTP/2 in cleartext is Hypercorn's whenever an HTTP/1.1 request says
``Upgrade: h2c`` or a client opens with the HTTP/2 preface. It is served
only with ``server.h2c``: otherwise an upgrade is ignored (the request is
answered in HTTP/1.1) and the preface is refused with 400. When it is
served, ``ClosingH2Protocol`` mends how Hypercorn's HTTP/2 ends a connection
(see there), without which a client leaving mid-answer held the server.

Every such refusal, and h11's own, is answered in the horde's error envelope
(``{"message", "rc"}``) with ``Connection: close``.

Hypercorn builds its HTTP/1.1 protocol (``H11Protocol``, which holds the
``h11.Connection``) and its HTTP/2 one in one place,
``hypercorn.protocol.ProtocolWrapper``, on trio and asyncio alike:
``install`` puts ``StrictH11Protocol`` and ``ClosingH2Protocol`` there. They
differ from Hypercorn's only for a server configured with ``WireConfig``;
any other keeps Hypercorn's behaviour.
"""

from __future__ import annotations

import contextlib
import json
import re
from http import HTTPStatus
from typing import Any

import anyio
import h2.exceptions
import h11
import hypercorn.protocol
from h11._readers import ChunkedReader
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, RawData
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import H11Protocol

from hordelite.contract.limits import MAX_CHUNK_LINE_BYTES
from hordelite.errors import RC

# The longest message an error answer carries: h11's own messages quote the
# offending line, which may be as long as a head.
_MESSAGE_CHARS = 300


class WireConfig(HypercornConfig):
    """Hypercorn's configuration, for a server on the strict wire."""

    # Serve HTTP/2 in cleartext (Upgrade: h2c, or the HTTP/2 preface).
    h2c: bool = False
    # The most bytes a chunked body may declare (server.max_body_bytes);
    # None: no bound at the wire.
    max_body_bytes: int | None = None


def refusal(message: str, status: int = 400) -> h11.RemoteProtocolError:
    """What the wire raises: Hypercorn answers it with ``status`` and closes."""
    return h11.RemoteProtocolError(message, error_status_hint=status)


def check_framing(head: bytes | bytearray) -> None:
    """Refuse a head (lower-cased, whole) that frames its body ambiguously."""
    lengths = head.count(b"\ncontent-length:")
    codings = head.count(b"\ntransfer-encoding:")
    if not (lengths or codings):
        return  # no body, or one plain length: the common heads stop here
    if codings and lengths:
        raise refusal(
            "Transfer-Encoding and Content-Length together: a request may carry only one."
        )
    if lengths > 1 or b"," in _value(head, b"\ncontent-length:"):
        raise refusal("More than one Content-Length: a request carries one length.")
    if codings > 1:
        raise refusal("More than one Transfer-Encoding header.")
    if codings and _value(head, b"\ntransfer-encoding:").strip(b" \t") != b"chunked":
        raise refusal("A Transfer-Encoding other than chunked: only chunked is accepted.")


def _value(head: bytes | bytearray, name: bytes) -> bytes | bytearray:
    start = head.find(name) + len(name)
    return head[start : head.find(b"\r", start)]


class StrictConnection(h11.Connection):
    """h11's server side, with each request head checked first (see the module)."""

    def __init__(self, max_head_bytes: int, h2c: bool, max_body_bytes: int | None = None) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self._max_head = max_head_bytes
        self._h2c = h2c
        self._max_body = max_body_bytes
        # The body bytes of the request being received that h11 handed on.
        self._body_bytes = 0
        # How much of the head being received was checked already, so that
        # a head arriving in many small reads is read once, not once a read.
        self._checked = 0
        # Why the connection was refused: the error answer's message.
        self.refusal: h11.RemoteProtocolError | None = None

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        try:
            if self.their_state is h11.IDLE:
                self._check_head()
            elif (
                self.their_state is h11.SEND_BODY
                and self.our_state is h11.SEND_RESPONSE
                and self._max_body is not None
            ):
                # Once the app has begun its answer (one sent before the body
                # was read), the rest of the body is drained, bounded
                # (hordelite.http.server), and a refusal would cut that answer.
                self._check_chunk_size(self._max_body)
            event = super().next_event()
            if type(event) is h11.Data:
                self._body_bytes += len(event.data)
            elif type(event) is h11.Request:
                self._checked = 0  # the next head starts afresh
                self._body_bytes = 0
                if event.method == b"PRI" and not self._h2c:
                    raise refusal("HTTP/2 is not served on this port (server.h2c is off).")
        except h11.RemoteProtocolError as exc:
            self.refusal = exc
            if self.their_state is not h11.ERROR:
                # As h11 does for its own: the app's sends after it are then
                # dropped by Hypercorn, not raised into the app.
                self._process_error(self.their_role)
            raise
        return event

    def _check_head(self) -> None:
        # While the client is IDLE, all h11 holds is the next request's head
        # (and perhaps its body after it): read in place, since h11 offers
        # only a copy. h11 (0.16) keeps it in its ReceiveBuffer's bytearray.
        data: bytearray = self._receive_buffer._data
        checked = self._checked
        if len(data) == checked:
            return
        # Resume a few bytes back, so that a line end split across reads is
        # seen whole.
        end = data.find(b"\r\n\r\n", max(0, checked - 3))
        head_end = len(data) if end < 0 else end + 4
        if head_end > self._max_head:
            raise refusal(f"The request head is over {self._max_head} bytes.", 431)
        back = max(0, checked - 1)
        if data.count(b"\n", checked, head_end) != data.count(b"\r\n", back, head_end):
            raise refusal("A line of the request head ends in a bare LF: lines end in CRLF.")
        if data.find(b"\n ", back, head_end) >= 0 or data.find(b"\n\t", back, head_end) >= 0:
            raise refusal("A header line starts with a space or a tab (obs-fold).")
        if end < 0:
            self._checked = head_end
            return
        check_framing(data[:head_end].lower())

    def _check_chunk_size(self, max_body: int) -> None:
        # h11 (0.16) reads a chunked body with its ChunkedReader: between two
        # chunks (none of the last one left to read) it reads the next
        # chunk-size line, after the CRLF that ends the chunk before.
        reader = self._reader
        if not isinstance(reader, ChunkedReader) or reader._reading_trailer:
            return
        if reader._bytes_in_chunk:
            return
        data: bytearray = self._receive_buffer._data
        start = len(reader._bytes_to_discard)
        if len(data) <= start:
            return
        end = data.find(b"\r\n", start)
        line = data[start : len(data) if end < 0 else end]
        if len(line) + 2 > MAX_CHUNK_LINE_BYTES:
            raise refusal(f"A chunk-size line is over {MAX_CHUNK_LINE_BYTES} bytes.")
        digits = _HEX_DIGITS.match(line)
        if digits is None:
            return  # no size: h11 refuses the line once it is whole
        # More digits only make the size larger: a size already past the
        # limit is refused before the line ends.
        if int(digits.group(), 16) > max_body - self._body_bytes:
            raise refusal(
                f"A chunk size takes the request body over {max_body} bytes "
                "(server.max_body_bytes).",
                413,
            )


_HEX_DIGITS = re.compile(rb"[0-9A-Fa-f]+")


class StrictH11Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol on a ``StrictConnection``, with h2c as
    configured and error answers in the horde's envelope; Hypercorn's own
    for a server not configured with ``WireConfig``."""

    def __init__(self, app: Any, config: HypercornConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(app, config, *args, **kwargs)
        self._strict: StrictConnection | None = None
        self._h2c = True
        if isinstance(config, WireConfig):
            self._h2c = config.h2c
            self._strict = StrictConnection(
                config.h11_max_incomplete_size, config.h2c, config.max_body_bytes
            )
            self.connection = self._strict

    async def _check_protocol(self, event: h11.Request) -> None:
        # Hypercorn answers Upgrade: h2c with 101 and the preface by switching
        # to HTTP/2 here. With h2c off the upgrade is ignored, as a server
        # that does not know it does, and the preface was refused already.
        if self._h2c:
            await super()._check_protocol(event)

    async def _send_error_response(self, status_code: int) -> None:
        if self._strict is None:
            await super()._send_error_response(status_code)
            return
        exc = self._strict.refusal
        message = str(exc)[:_MESSAGE_CHARS] if exc is not None else ""
        body = error_body(status_code, message)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        # One write: an app answering meanwhile (a refusal inside a body it
        # has not read) cannot slip its answer between these events.
        events = (
            h11.Response(status_code=status_code, headers=headers),
            h11.Data(data=body),
            h11.EndOfMessage(),
        )
        data = b"".join(self.connection.send(event) or b"" for event in events)
        await self.send(RawData(data=data))


class ClosingH2Protocol(H2Protocol):
    """Hypercorn's HTTP/2 protocol, whose sends end when its sending ends.

    Hypercorn (0.18) sends each stream's answer from a buffer, which one
    sending task empties. When the connection closes, or the server's grace
    period cancels it, that task ends, but the buffers stay open: a send
    waiting for its buffer to drain (the end of every answer) or to fall
    below its high water waits for a task that is gone. Quart would cancel
    it; the sends are shielded (hordelite.http.server, decision 0027), so the
    handler, and a stopping server after it, waited for ever whenever an
    HTTP/2 client left, or sat on a full window, before its answer was sent.
    Closing the buffers once the task ends ends those sends (Hypercorn drops
    what they held: it would never be sent).

    And once the server is stopping, a stream's end no longer restarts the
    connection's idle timer: on asyncio that made a task in the connection's
    task group while the grace period's end was cancelling it, and the
    RuntimeError came out of the server. The connection is closed instead
    once no stream is left, as Hypercorn's HTTP/1.1 protocol does.
    """

    async def send_task(self) -> None:
        try:
            await super().send_task()
        finally:
            if isinstance(self.config, WireConfig):
                with anyio.CancelScope(shield=True):
                    for buffer in list(self.stream_buffers.values()):
                        await buffer.close()

    async def stream_send(self, event: StreamEvent) -> None:
        stopping = self.context.terminated.is_set() and isinstance(self.config, WireConfig)
        if not (stopping and isinstance(event, StreamClosed)):
            await super().stream_send(event)
            return
        await self._close_stream(event.stream_id)
        if not self.streams:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.connection.close_connection()  # GOAWAY
                await self._flush()
            await self.send(Closed())


def error_body(status: int, message: str) -> bytes:
    """The horde's error envelope for an answer the app never saw: the rc is
    the status's name, as for any HTTP error without an rc of its own."""
    phrase = HTTPStatus(status).phrase
    if status == RC.PayloadTooLarge.status:  # the rc the app gives a body past the limit
        return json.dumps(
            {
                "message": message or RC.PayloadTooLarge.default_message,
                "rc": RC.PayloadTooLarge.name,
            }
        ).encode()
    return json.dumps({"message": message or phrase, "rc": phrase.replace(" ", "")}).encode()


def install() -> None:
    """Have Hypercorn build ``StrictH11Protocol`` for each HTTP/1.1
    connection and ``ClosingH2Protocol`` for each HTTP/2 one (both are
    made in hypercorn.protocol.ProtocolWrapper, 0.18)."""
    hypercorn.protocol.H11Protocol = StrictH11Protocol  # type: ignore[attr-defined]
    hypercorn.protocol.H2Protocol = ClosingH2Protocol  # type: ignore[attr-defined]
