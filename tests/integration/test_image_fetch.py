"""hordelite.images.fetch.fetch_image against a loopback HTTP server of the
test's own: what it fetches with private addresses allowed, and what it
refuses by default, before any connection is made.

The server is a small HTTP/1.1 responder on an anyio TCP listener; it counts
the connections it accepts and records the Host header of each request.
"""

from __future__ import annotations

import contextlib
import dataclasses

import anyio
import anyio.abc
import pytest

from hordelite.contract.limits import MAX_IMAGE_FETCH_BYTES, MAX_IMAGE_FETCH_REDIRECTS
from hordelite.outbound.guarded_fetch import ImageFetchRefused, fetch_image
from tests.integration._helpers import loopback_server, request_head

pytestmark = pytest.mark.anyio

IMAGE = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 16
CHUNK = b"\0" * 65536


@dataclasses.dataclass
class Server:
    port: int
    connections: int = 0
    hosts: list[str] = dataclasses.field(default_factory=list)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


def _answer(status: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _respond(server: Server, stream: anyio.abc.ByteStream, path: str, host: str) -> None:
    if path == "/image":
        await stream.send(_answer("200 OK", {"Content-Length": str(len(IMAGE))}, IMAGE))
    elif path == "/host":
        body = host.encode()
        await stream.send(_answer("200 OK", {"Content-Length": str(len(body))}, body))
    elif path.startswith("/redirect/"):
        left = int(path.rsplit("/", 1)[1])
        target = "/image" if left == 1 else f"/redirect/{left - 1}"
        await stream.send(_answer("302 Found", {"Location": target, "Content-Length": "0"}))
    elif path.startswith("/redirect-to?"):
        target = path.split("?", 1)[1]
        await stream.send(_answer("302 Found", {"Location": target, "Content-Length": "0"}))
    elif path.startswith("/declared/"):
        # Declares a length, then sends zeros until the client goes away.
        await stream.send(_answer("200 OK", {"Content-Length": path.rsplit("/", 1)[1]}))
        while True:
            await stream.send(CHUNK)
    elif path == "/endless":
        # No length: a body that never ends, until the client goes away.
        await stream.send(_answer("200 OK", {"Connection": "close"}))
        while True:
            await stream.send(CHUNK)
    elif path == "/silent":
        await anyio.sleep_forever()
    else:
        await stream.send(_answer("404 Not Found", {"Content-Length": "0"}))


async def _handle(server: Server, stream: anyio.abc.ByteStream) -> None:
    server.connections += 1
    while True:  # one request after another on a kept-alive connection
        path, headers = await request_head(stream)
        host = headers.get("host", "")
        server.hosts.append(host)
        await _respond(server, stream, path, host)


def serve() -> contextlib.AbstractAsyncContextManager[Server]:
    return loopback_server(Server, _handle)


async def refused(url: str, **kwargs: object) -> ImageFetchRefused:
    with pytest.raises(ImageFetchRefused) as caught:
        await fetch_image(url, **kwargs)  # type: ignore[arg-type]
    return caught.value


# Allowed private addresses: the fetch itself --------------------------------


async def test_with_private_addresses_allowed_a_fetch_returns_the_bytes() -> None:
    async with serve() as server:
        assert await fetch_image(server.url("/image"), allow_private=True) == IMAGE


async def test_a_name_is_fetched_from_its_checked_address_with_the_name_as_Host() -> None:
    # The connection goes to the address localhost resolved to (the server
    # listens on 127.0.0.1 only), and the request still names localhost.
    async with serve() as server:
        body = await fetch_image(server.url("/host", "localhost"), allow_private=True)
    assert body == f"localhost:{server.port}".encode()


async def test_redirects_up_to_the_limit_are_followed() -> None:
    async with serve() as server:
        url = server.url(f"/redirect/{MAX_IMAGE_FETCH_REDIRECTS}")
        assert await fetch_image(url, allow_private=True) == IMAGE


async def test_one_redirect_more_than_the_limit_is_refused() -> None:
    async with serve() as server:
        url = server.url(f"/redirect/{MAX_IMAGE_FETCH_REDIRECTS + 1}")
        assert (await refused(url, allow_private=True)).reason == "redirects"
    assert server.connections >= 1


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://127.0.0.1/x.png"])
async def test_a_redirect_target_is_checked_again_for_its_scheme(location: str) -> None:
    async with serve() as server:
        error = await refused(server.url(f"/redirect-to?{location}"), allow_private=True)
    assert error.reason == "scheme"


async def test_a_redirect_to_another_name_is_resolved_and_fetched_again() -> None:
    async with serve() as server:
        location = server.url("/host", "localhost")
        body = await fetch_image(server.url(f"/redirect-to?{location}"), allow_private=True)
    assert body == f"localhost:{server.port}".encode()
    assert server.hosts == [f"127.0.0.1:{server.port}", f"localhost:{server.port}"]


async def test_a_declared_length_past_the_cap_is_refused_without_reading_it() -> None:
    async with serve() as server:
        url = server.url(f"/declared/{MAX_IMAGE_FETCH_BYTES + 1}")
        assert (await refused(url, allow_private=True)).reason == "too_large"


async def test_a_body_without_a_length_is_read_only_up_to_the_cap() -> None:
    # The body never ends: the fetch returns only because it stops reading.
    async with serve() as server:
        error = await refused(server.url("/endless"), allow_private=True, max_bytes=200_000)
    assert error.reason == "too_large"


async def test_a_body_longer_than_its_declared_length_within_the_cap_is_cut_there() -> None:
    # Content-Length: 1000 with more bytes following: HTTP/1.1 framing ends
    # the body at 1000, the rest is never taken as image bytes.
    async with serve() as server:
        body = await fetch_image(server.url("/declared/1000"), allow_private=True)
    assert body == b"\0" * 1000


async def test_a_server_that_never_answers_is_refused_at_the_time_limit() -> None:
    async with serve() as server:
        error = await refused(server.url("/silent"), allow_private=True, time_limit=0.3)
    assert error.reason == "timeout"
    assert server.connections == 1


async def test_an_error_status_is_refused() -> None:
    async with serve() as server:
        assert (await refused(server.url("/missing"), allow_private=True)).reason == "status"


async def test_a_closed_port_is_unreachable() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()
    error = await refused(f"http://127.0.0.1:{port}/image", allow_private=True)
    assert error.reason == "unreachable"


# The default: private addresses refused before any connection --------------


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "[::1]", "localhost", "[::ffff:127.0.0.1]", "127.1", "2130706433"],
)
async def test_a_loopback_url_is_refused_before_any_connection(host: str) -> None:
    async with serve() as server:
        error = await refused(server.url("/image", host), allow_private=False)
    assert error.reason == "address"
    assert server.connections == 0


async def test_a_redirecting_url_on_a_private_address_is_refused_before_its_first_hop() -> None:
    async with serve() as server:
        error = await refused(server.url("/redirect/1"), allow_private=False)
    assert error.reason == "address"
    assert server.connections == 0


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/image.png",
        "http://172.16.5.4/image.png",
        "http://192.168.1.1/image.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://[fe80::1]/image.png",
        "http://0.0.0.0/image.png",
        "http://224.0.0.1/image.png",
        "https://10.0.0.1/image.png",
    ],
)
async def test_private_and_metadata_addresses_are_refused(url: str) -> None:
    assert (await refused(url, allow_private=False)).reason == "address"


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://example.com/image.png",
        "gopher://example.com/",
        "data:image/png;base64,iVBORw0KGgo=",
        "http:///image.png",
        "not a url",
    ],
)
@pytest.mark.parametrize("allow_private", [False, True])
async def test_only_http_and_https_are_fetched(url: str, allow_private: bool) -> None:
    assert (await refused(url, allow_private=allow_private)).reason == "scheme"


async def test_a_refusal_names_the_host_and_not_the_address_it_resolved_to() -> None:
    async with serve() as server:
        error = await refused(server.url("/image", "localhost"), allow_private=False)
    assert "localhost" in str(error)
    assert "127.0.0.1" not in str(error)
    assert "::1" not in str(error)
