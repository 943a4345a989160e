"""The horde's own URL as a client reached it: the start of every signed URL.

A worker fetches its images and offloaded messages from the signed URLs its
pop answer holds, so they must start with an address the worker can reach.
Behind a reverse proxy the connection's scheme and ``Host`` are the proxy's
(``http://127.0.0.1:7001``); the proxy says what the client used in
``X-Forwarded-Proto``/``X-Forwarded-Host`` or RFC 7239 ``Forwarded``.

Anyone can send those headers, so they are read only from a connection whose
peer is a trusted proxy (``server.trusted_proxies``, as Hypercorn's
ProxyFixMiddleware and uvicorn's ``--forwarded-allow-ips`` do), and only the
rightmost value, the one that proxy wrote: values to its left came from
further away. A value that is not ``http``/``https`` or not a plain
``host[:port]`` is ignored, never copied into a signed URL.

The client's address, which the anonymous user's budgets are counted by
(decision 0071), is the peer's; from a trusted proxy it is the rightmost
address of ``X-Forwarded-For`` that is not itself a trusted proxy: each
proxy appends the address it was reached from, so everything left of the
first untrusted hop is what that client chose to send. ``Forwarded``'s
``for=`` is not read for it: a proxy that writes one of the two headers
passes the other on as the client sent it, and every common proxy writes
``X-Forwarded-For``.

Pure functions: ``hordelite.api.native`` passes the request's parts in.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from urllib.parse import urlsplit

from hordelite.contract.limits import ANONYMOUS_IPV6_PREFIX

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = ("http", "https")

# A DNS name or IPv4 address, or a bracketed IPv6 address, then an optional
# port: nothing that could carry a path, user info or a second URL.
_HOST = re.compile(
    r"(?:\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252}))(?::[0-9]{1,5})?"
)

# One ``name=value`` pair of a Forwarded element; a value is a token or a
# quoted string (RFC 7230 section 3.2.6).
_PAIR = re.compile(r'\s*([A-Za-z]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;,\s"]+)\s*')


def valid_host(value: str) -> bool:
    """Whether ``value`` is a ``host[:port]`` fit to start a URL."""
    match = _HOST.fullmatch(value)
    if match is None:
        return False
    port = value.rpartition(":")[2] if not value.endswith("]") and ":" in value else ""
    return not port or 0 < int(port) <= 65535


def public_url_problem(value: str) -> str | None:
    """What is wrong with a ``server.public_url`` value; None when fit."""
    if not value:
        return None
    parts = urlsplit(value)
    if parts.scheme not in SCHEMES or not parts.netloc:
        return f"must be an http:// or https:// URL, got {value!r}"
    if "?" in value or "#" in value:
        return f"must have no query or fragment, got {value!r}"
    if not valid_host(parts.netloc):
        return f"must name a host[:port] (no user info), got {value!r}"
    if any(c.isspace() for c in parts.path):
        return f"must have no space in its path, got {value!r}"
    return None


@functools.lru_cache(maxsize=16)
def parse_trusted_proxies(value: str) -> tuple[Network, ...]:
    """The addresses and networks of a comma-separated list; ValueError naming
    the entry that is neither."""
    networks = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or CIDR network") from None
    return tuple(networks)


def peer_trusted(peer: str | None, trusted: tuple[Network, ...]) -> bool:
    """Whether the connection's peer address is one of ``trusted``."""
    if not trusted or not peer:
        return False
    address = _ip(peer)  # None: a Unix socket or anything that is no IP address
    return address is not None and _in(address, trusted)


def _in(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, trusted: tuple[Network, ...]
) -> bool:
    return any(address in network for network in trusted)


def _ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``value`` names (an IPv4-mapped IPv6 one as IPv4: an
    IPv4 client of a dual-stack socket appears as ::ffff:a.b.c.d), None when
    it names none."""
    try:
        address = ipaddress.ip_address(value.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _hop(entry: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of one X-Forwarded-For entry: ``a.b.c.d``, ``a.b.c.d:port``,
    ``v6`` or ``[v6]:port``; None for anything else (``unknown``, a Unix
    socket, an obfuscated name)."""
    entry = entry.strip()
    if entry.startswith("["):
        entry = entry[1:].partition("]")[0]
    elif entry.count(":") == 1:
        entry = entry.partition(":")[0]
    return _ip(entry)


def client_address(
    peer: str | None, trusted: tuple[Network, ...], forwarded_for: str | None = None
) -> str | None:
    """The client as the anonymous budgets count it: its IPv4 address, or
    its IPv6 /64 (``2001:db8:1:2::/64``); None when the peer is no IP
    address (nothing to count it by).

    From a trusted ``peer``, the hops of ``forwarded_for`` are read right
    to left: the first that is not a trusted proxy is the client; one that
    is no address stops the walk at the trusted proxy that wrote it, which
    then stands for its clients; all trusted, the leftmost is the client."""
    address = _ip(peer) if peer else None
    if address is None:
        return None
    if forwarded_for and trusted and _in(address, trusted):
        for entry in reversed(forwarded_for.split(",")):
            hop = _hop(entry)
            if hop is None:
                break
            address = hop
            if not _in(hop, trusted):
                break
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, ANONYMOUS_IPV6_PREFIX), strict=False))
    return str(address)


def _last_forwarded_element(header: str) -> dict[str, str] | None:
    """The rightmost element of a Forwarded header as lowercased names to
    unquoted values; None when the header does not parse."""
    elements: list[dict[str, str]] = [{}]
    position = 0
    while position < len(header):
        match = _PAIR.match(header, position)
        if match is None:
            return None
        name, value = match.group(1).lower(), match.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        elements[-1][name] = value
        position = match.end()
        if position < len(header):
            separator = header[position]
            if separator == ",":
                elements.append({})
            elif separator != ";":
                return None
            position += 1
    return elements[-1]


def _last(header: str | None) -> str | None:
    """The rightmost value of a comma-separated X-Forwarded-* header."""
    if header is None:
        return None
    return header.rsplit(",", 1)[-1].strip() or None


def request_base_url(
    *,
    scheme: str,
    host: str,
    server: str,
    peer: str | None,
    trusted: tuple[Network, ...],
    forwarded: str | None = None,
    forwarded_proto: str | None = None,
    forwarded_host: str | None = None,
) -> str:
    """``scheme://host`` as the client reached the horde.

    ``scheme`` and ``host`` are the connection's (its ``Host`` header);
    ``server`` is the listening address, used when ``host`` is no valid host.
    From a trusted ``peer``, ``Forwarded`` proto/host win, then
    ``X-Forwarded-Proto``/``X-Forwarded-Host``; each valid one replaces the
    connection's, an invalid one is ignored."""
    if not valid_host(host):
        host = server
    if peer_trusted(peer, trusted):
        element = _last_forwarded_element(forwarded) if forwarded else None
        element = element or {}
        proto = (element.get("proto") or _last(forwarded_proto) or "").lower()
        if proto in SCHEMES:
            scheme = proto
        via = element.get("host") or _last(forwarded_host) or ""
        if valid_host(via):
            host = via
    return f"{scheme}://{host}"
