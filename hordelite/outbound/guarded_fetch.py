"""Fetching an image a client names by ``http(s)`` URL, and calling the
webhook a client names, without letting either reach into the operator's
network.

The horde fetches a chat request's image URLs at submit. A client chooses
the URL, so a fetch made naively is a request the horde sends on the
client's behalf from inside its own network: to a database's admin page on
127.0.0.1, a router on 192.168.0.1, or the cloud's metadata service on
169.254.169.254, which hands out the machine's credentials. Every hop of a
fetch (the first URL and each redirect target) is therefore checked from
scratch: the scheme, then every address its host resolves to must be a
public one, unless the operator allows private addresses
(``[images] fetch_private``, for a horde whose clients are its own).

A webhook call (``post_json``) is checked the same way and follows no
redirect: it is one POST to the address checked. Webhook calls share one
client (``open_call_client``), opened by the task that makes them: building
a client loads the certificate store, which cost more CPU than the call.
Every client of this module verifies with one TLS context (``_tls``), built
once a process: building one costs about 20 ms of CPU, once per image
fetch and once per horde otherwise.

The check covers the address actually connected to: the fetch connects to
the checked address itself, so a name that resolves to a public address
when checked and to 127.0.0.1 a moment later (DNS rebinding) gains nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Literal

import anyio
import httpx

from hordelite.contract.limits import (
    IMAGE_FETCH_TIMEOUT,
    MAX_IMAGE_FETCH_BYTES,
    MAX_IMAGE_FETCH_REDIRECTS,
    WEBHOOK_ANSWER_BYTES,
)
from hordelite.errors import HordeliteError

Reason = Literal["scheme", "address", "redirects", "too_large", "timeout", "status", "unreachable"]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_DEFAULT_PORTS = {"http": 80, "https": 443}
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# The cloud metadata services, by name and by address. The addresses are
# link-local or unique-local and refused as such; they are named here too so
# that no change to the general rule lets them through.
_METADATA_NAMES = frozenset({"metadata.google.internal", "metadata.goog"})
_METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
# NAT64's well-known prefix: an IPv6 address that reaches the IPv4 address in
# its last 32 bits.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_BITS = 0xFFFFFFFF


class ImageFetchRefused(HordeliteError):
    """An image URL that was not fetched, with a short machine ``reason``.

    The message names the URL's host and nothing else of the horde's side:
    no resolved address, no internal error text.
    """

    def __init__(self, reason: Reason, host: str, why: str) -> None:
        self.reason: Reason = reason
        self.host = host
        super().__init__(f"the image at {host or 'this URL'} was not fetched: {why}")


@dataclasses.dataclass(frozen=True)
class Target:
    """One hop's URL, checked for its scheme: its host (lower case, no
    brackets, ASCII) and port."""

    url: httpx.URL
    host: str
    port: int


def parse_target(url: str | httpx.URL, *, reported_host: str = "") -> Target:
    """The URL as a fetch target, or ``scheme`` refused: only ``http`` and
    ``https`` URLs with a host are fetched."""
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
        host = parsed.raw_host.decode("ascii").lower().rstrip(".")
    except (httpx.InvalidURL, UnicodeError, TypeError):
        raise ImageFetchRefused("scheme", reported_host, "not an http(s) URL") from None
    if parsed.scheme not in _DEFAULT_PORTS or not host:
        raise ImageFetchRefused("scheme", reported_host or host, "not an http(s) URL")
    return Target(parsed, host, parsed.port or _DEFAULT_PORTS[parsed.scheme])


def address_is_public(address: IPAddress) -> bool:
    """Whether ``address`` is a public unicast address: not loopback,
    private, link-local, multicast, unspecified, reserved, shared (CGNAT) or
    a metadata service, nor an IPv6 form of such an IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # ::ffff:127.0.0.1 is 127.0.0.1
            return address_is_public(address.ipv4_mapped)
        if address.teredo is not None:  # a tunnel to an address of its own choosing
            return False
        if address in _NAT64:  # DNS64 answers so for every IPv4 host
            return address_is_public(ipaddress.IPv4Address(int(address) & _IPV4_BITS))
        embedded = address.sixtofour
        if embedded is not None and not address_is_public(embedded):
            return False
        if address.is_site_local:
            return False
    return address not in _METADATA_ADDRESSES and not (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
        or not address.is_global
    )


def redirect_target(current: Target, location: str) -> httpx.URL:
    """The URL a redirect's ``Location`` names, relative to the hop that
    answered it; it is checked as a new URL (``resolve_target``)."""
    return current.url.join(location)


async def resolve_target(
    url: str | httpx.URL, *, allow_private: bool, reported_host: str = ""
) -> tuple[Target, list[IPAddress]]:
    """Check one hop from scratch: its scheme, then every address its host
    resolves to (a host written as an address is that address). Refused with
    ``address`` when one of them is not public and private addresses are not
    allowed: a name resolving to a public and a private address is refused,
    as the connection could go to either."""
    target = parse_target(url, reported_host=reported_host)
    shown = reported_host or target.host
    if not allow_private and target.host in _METADATA_NAMES:
        raise ImageFetchRefused("address", shown, "the host is not a public address")
    try:
        addresses: list[IPAddress] = [ipaddress.ip_address(target.host)]
    except ValueError:
        try:
            infos = await anyio.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise ImageFetchRefused(
                "unreachable", shown, "the host name does not resolve"
            ) from None
        addresses = list(
            dict.fromkeys(
                ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
                for info in infos
                if info[0] in (socket.AF_INET, socket.AF_INET6)
            )
        )
    if not addresses:
        raise ImageFetchRefused("unreachable", shown, "the host name does not resolve")
    if not allow_private and not all(address_is_public(a) for a in addresses):
        raise ImageFetchRefused("address", shown, "the host is not a public address")
    return target, addresses


@dataclasses.dataclass(frozen=True)
class _Redirect:
    location: str


async def fetch_image(
    url: str,
    *,
    allow_private: bool,
    time_limit: float = IMAGE_FETCH_TIMEOUT,
    max_bytes: int = MAX_IMAGE_FETCH_BYTES,
) -> bytes:
    """The bytes at ``url``, fetched under the address policy above, or
    ``ImageFetchRefused``. ``time_limit`` bounds the whole fetch (resolution,
    connections, redirects, body); a body past ``max_bytes`` is not read
    further. Runs on trio and on asyncio."""
    try:
        shown = parse_target(url).host
    except ImageFetchRefused:
        shown = ""
    try:
        with anyio.fail_after(time_limit):
            return await _fetch(url, allow_private, max_bytes, shown)
    except TimeoutError:
        raise ImageFetchRefused(
            "timeout", shown, f"no complete answer within {time_limit} s"
        ) from None


@functools.cache
def _tls() -> ssl.SSLContext:
    # What httpx builds for a client with trust_env=False (certifi's store,
    # full verification, no SSL_CERT_FILE from the environment), made once.
    return httpx.create_ssl_context(trust_env=False)


async def _fetch(url: str, allow_private: bool, max_bytes: int, shown: str) -> bytes:
    # trust_env=False: no proxy from the environment (the connection must go
    # to the checked address, not to a proxy that resolves the name again)
    # and no .netrc credentials sent to a client's URL. timeout=None: the one
    # overall limit (fetch_image's cancel scope) bounds every step.
    async with httpx.AsyncClient(
        trust_env=False, follow_redirects=False, timeout=None, verify=_tls()
    ) as client:
        next_url: str | httpx.URL = url
        for _ in range(MAX_IMAGE_FETCH_REDIRECTS + 1):
            target, addresses = await resolve_target(
                next_url, allow_private=allow_private, reported_host=shown
            )
            answer = await _get(client, target, addresses, max_bytes, shown)
            if isinstance(answer, bytes):
                return answer
            next_url = redirect_target(target, answer.location)
    raise ImageFetchRefused("redirects", shown, f"more than {MAX_IMAGE_FETCH_REDIRECTS} redirects")


async def _get(
    client: httpx.AsyncClient,
    target: Target,
    addresses: list[IPAddress],
    max_bytes: int,
    shown: str,
) -> bytes | _Redirect:
    """One hop: the first checked address that accepts a connection answers."""
    for address in addresses:
        try:
            return await _exchange(client, target, address, max_bytes, shown)
        except httpx.ConnectError:
            continue
        except httpx.TimeoutException:
            raise ImageFetchRefused("timeout", shown, "the host did not answer in time") from None
        except httpx.HTTPError:
            raise ImageFetchRefused("unreachable", shown, "the host's answer broke off") from None
    raise ImageFetchRefused("unreachable", shown, "the host refused the connection")


async def _exchange(
    client: httpx.AsyncClient,
    target: Target,
    address: IPAddress,
    max_bytes: int,
    shown: str,
) -> bytes | _Redirect:
    request = _pinned_request(
        client,
        "GET",
        target,
        address,
        {
            "Accept": "image/*",
            # The cap counts bytes as received: a compressed body would be
            # inflated past it in one step before the count could stop it.
            "Accept-Encoding": "identity",
        },
    )
    response = await client.send(request, stream=True)
    try:
        if response.status_code in _REDIRECT_STATUSES:
            location = response.headers.get("location")
            if not location:
                raise ImageFetchRefused("status", shown, "a redirect without a Location")
            return _Redirect(location)
        if response.status_code != httpx.codes.OK:
            raise ImageFetchRefused("status", shown, f"HTTP status {response.status_code}")
        if response.headers.get("content-encoding", "identity").lower() != "identity":
            raise ImageFetchRefused("status", shown, "a compressed answer, not asked for")
        too_large = ImageFetchRefused("too_large", shown, f"larger than {max_bytes} bytes")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise too_large
        body = bytearray()
        with anyio.CancelScope() as reading:
            async for chunk in response.aiter_raw():
                if len(body) > max_bytes:
                    continue  # a chunk already buffered, before the cancellation lands
                body += chunk
                if len(body) > max_bytes:
                    # Cancelled, not left by break: the cancellation is raised
                    # at httpx's innermost read and ends each of the stream's
                    # nested generators on its way out, where a break would
                    # leave them to the garbage collector (which trio reports).
                    reading.cancel()
        if len(body) > max_bytes:
            raise too_large
        return bytes(body)
    finally:
        await response.aclose()


@dataclasses.dataclass(frozen=True)
class CallOutcome:
    """How one webhook call went: ``answered`` with a 2xx, else why not
    (``reason``, one of Reason's, for the log) and whether trying again could
    help (``final``: the address policy refused it, or its URL is unusable)."""

    answered: bool
    reason: str = ""
    final: bool = False
    status: int = 0


@contextlib.asynccontextmanager
async def open_call_client(max_connections: int) -> AsyncIterator[httpx.AsyncClient]:
    """The client webhook calls share (``post_json``), with at most
    ``max_connections`` open at once, closed when the block exits.

    Sharing it keeps the address policy: each call resolves and checks its
    host itself, and names the checked address in the request's URL, so the
    pool (keyed by scheme, address and port) only ever connects to, or
    reuses a connection to, an address that was checked. A connection made
    for one name is not reused for another at the same address over https
    (``_post`` asks such a connection to close after its answer): its
    certificate was verified for the first name only.
    """
    # trust_env=False, follow_redirects=False and timeout=None as in _fetch.
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections
    )
    async with httpx.AsyncClient(
        trust_env=False, follow_redirects=False, timeout=None, limits=limits, verify=_tls()
    ) as client:
        yield client


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    *,
    allow_private: bool,
    time_limit: float,
    headers: Mapping[str, str],
) -> CallOutcome:
    """POST ``body`` (JSON) to ``url`` with ``client`` (``open_call_client``)
    under the address policy above, within ``time_limit`` seconds in all,
    with ``headers`` besides the policy's own; the answer's body is not
    read. Runs on trio and on asyncio."""
    try:
        shown = parse_target(url).host
    except ImageFetchRefused:
        return CallOutcome(False, "scheme", final=True)
    try:
        with anyio.fail_after(time_limit):
            target, addresses = await resolve_target(
                url, allow_private=allow_private, reported_host=shown
            )
            return await _post(client, target, addresses, body, headers)
    except ImageFetchRefused as refused:
        return CallOutcome(False, refused.reason, final=refused.reason in ("scheme", "address"))
    except TimeoutError:
        return CallOutcome(False, "timeout")


def _pinned_request(
    client: httpx.AsyncClient,
    method: str,
    target: Target,
    address: IPAddress,
    headers: Mapping[str, str],
    content: bytes | None = None,
) -> httpx.Request:
    """A request to ``target`` that goes to the checked ``address``.

    The request goes to the address written in the URL, so httpx connects
    there and nowhere else (its connection pool is keyed by that address).
    The server still sees the name: the Host header is the original one, and
    for https the "sni_hostname" extension makes httpcore pass the name to
    ssl as server_hostname, which sends it as SNI and verifies the
    certificate against it. This works unchanged on trio and on asyncio
    (httpcore picks the running loop's network backend); a custom transport
    replacing the connection step would have to wrap that backend selection
    itself."""
    extensions = {}
    if str(address) != target.host:  # a name, not an address literal
        extensions["sni_hostname"] = target.host
    return client.build_request(
        method,
        target.url.copy_with(host=str(address)),
        headers={"Host": target.url.netloc.decode("ascii"), **headers},
        content=content,
        extensions=extensions,
    )


async def _post(
    client: httpx.AsyncClient,
    target: Target,
    addresses: list[IPAddress],
    body: bytes,
    headers: Mapping[str, str],
) -> CallOutcome:
    """One POST: the first checked address that accepts a connection takes it
    (connected to as ``_pinned_request`` explains)."""
    for address in addresses:
        named = str(address) != target.host
        request = _pinned_request(
            client,
            "POST",
            target,
            address,
            {
                **headers,
                "Content-Type": "application/json",
                # The pool is keyed by address: a TLS connection verified for
                # this name must not carry a later call to another name.
                **({"Connection": "close"} if named and target.url.scheme == "https" else {}),
            },
            content=body,
        )
        try:
            response = await client.send(request, stream=True)
            await _discard(response)
        except httpx.ConnectError:
            continue
        except httpx.TimeoutException:
            return CallOutcome(False, "timeout")
        except httpx.HTTPError:
            return CallOutcome(False, "unreachable")
        if 200 <= response.status_code < 300:
            return CallOutcome(True, status=response.status_code)
        return CallOutcome(False, "status", status=response.status_code)
    return CallOutcome(False, "unreachable")


async def _discard(response: httpx.Response) -> None:
    """Read and drop the answer's body, up to WEBHOOK_ANSWER_BYTES: the
    receiver's answer is not the horde's to hold, and a connection whose
    answer was read to its end can carry the next call; past them it is
    closed unread."""
    seen = 0
    try:
        with anyio.CancelScope() as reading:
            async for chunk in response.aiter_raw():
                seen += len(chunk)
                if seen > WEBHOOK_ANSWER_BYTES:
                    reading.cancel()  # not break: as in _exchange
    finally:
        await response.aclose()
