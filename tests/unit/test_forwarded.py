"""Where a signed URL starts: the connection's scheme and Host, or what a
trusted proxy forwarded, never a hostile value (contract.forwarded)."""

from __future__ import annotations

import pytest

from hordelite.config import Config
from hordelite.contract.forwarded import (
    client_address,
    parse_trusted_proxies,
    peer_trusted,
    public_url_problem,
    request_base_url,
    valid_host,
)
from hordelite.errors import ConfigError

LOCAL = parse_trusted_proxies("127.0.0.1, 10.0.0.0/8, ::1")


def base(peer: str | None = "127.0.0.1", host: str = "127.0.0.1:7001", **headers: str) -> str:
    return request_base_url(
        scheme="http", host=host, server="127.0.0.1:7001", peer=peer, trusted=LOCAL, **headers
    )


@pytest.mark.parametrize(
    "value",
    ["horde.example.org", "horde.example.org:8443", "127.0.0.1", "[::1]:7001", "[2001:db8::1]"],
)
def test_plain_hosts_are_valid(value: str) -> None:
    assert valid_host(value)


@pytest.mark.parametrize(
    "value",
    ["evil.com/x", "a@b", "a b", "", "evil.com:99999", "evil.com:", "x?y", "x#y", "[::1", "a\\b"],
)
def test_hosts_that_could_carry_more_than_a_host_are_not(value: str) -> None:
    assert not valid_host(value)


def test_without_forwarded_headers_the_connection_is_the_url() -> None:
    assert base() == "http://127.0.0.1:7001"


def test_x_forwarded_from_a_trusted_peer_is_used() -> None:
    got = base(forwarded_proto="https", forwarded_host="horde.example.org")
    assert got == "https://horde.example.org"


def test_a_trusted_network_and_an_ipv4_mapped_peer_count() -> None:
    assert peer_trusted("10.1.2.3", LOCAL)
    assert peer_trusted("::ffff:127.0.0.1", LOCAL)
    assert peer_trusted("::1", LOCAL)
    assert not peer_trusted("192.168.0.1", LOCAL)
    assert not peer_trusted("not-an-address", LOCAL)
    assert not peer_trusted(None, LOCAL)
    assert not peer_trusted("127.0.0.1", ())


def test_forwarded_headers_from_an_untrusted_peer_are_ignored() -> None:
    got = base(
        peer="192.168.0.9",
        forwarded="proto=https;host=horde.example.org",
        forwarded_proto="https",
        forwarded_host="horde.example.org",
    )
    assert got == "http://127.0.0.1:7001"


def test_rfc_7239_forwarded_is_read_quoted_or_not_and_wins() -> None:
    got = base(
        forwarded='for=192.0.2.60;proto=https;host="horde.example.org:8443"',
        forwarded_proto="http",
        forwarded_host="other.example.org",
    )
    assert got == "https://horde.example.org:8443"
    assert base(forwarded="Proto=HTTPS;Host=h.example.org") == "https://h.example.org"


def test_only_the_rightmost_value_the_trusted_proxy_wrote_counts() -> None:
    # The client sent the left one; the proxy appended the right one.
    got = base(
        forwarded="host=evil.example;proto=http, for=192.0.2.1;host=horde.example.org;proto=https"
    )
    assert got == "https://horde.example.org"
    got = base(forwarded_proto="http, https", forwarded_host="evil.example, horde.example.org")
    assert got == "https://horde.example.org"


@pytest.mark.parametrize("host", ["evil.com/x", "a@b", "a b", "evil.com:0", ""])
def test_a_hostile_forwarded_host_is_ignored(host: str) -> None:
    assert base(forwarded_host=host) == "http://127.0.0.1:7001"
    quoted = host.replace('"', "")
    assert base(forwarded=f'host="{quoted}"') == "http://127.0.0.1:7001"


@pytest.mark.parametrize("proto", ["javascript", "ftp", "https:", ""])
def test_a_forwarded_scheme_other_than_http_or_https_is_ignored(proto: str) -> None:
    assert base(forwarded_proto=proto) == "http://127.0.0.1:7001"


@pytest.mark.parametrize("header", ['host="unterminated', "host=a;;proto", "=x", "host=a b"])
def test_a_forwarded_header_that_does_not_parse_is_ignored(header: str) -> None:
    assert base(forwarded=header) == "http://127.0.0.1:7001"


def test_a_hostile_host_header_gives_way_to_the_listening_address() -> None:
    assert base(peer="192.168.0.9", host="evil.com/x") == "http://127.0.0.1:7001"


@pytest.mark.parametrize(
    "value", ["", "https://horde.example.org", "http://10.0.0.5:7001", "https://example.org/horde/"]
)
def test_fit_public_urls(value: str) -> None:
    assert public_url_problem(value) is None
    assert Config().replace(server={"public_url": value}).server.public_url == value


@pytest.mark.parametrize(
    "value",
    [
        "horde.example.org",
        "ftp://horde.example.org",
        "https://",
        "https://horde.example.org/?x=1",
        "https://horde.example.org/#top",
        "https://user@horde.example.org",
        "https://horde.example.org/a b",
    ],
)
def test_a_bad_public_url_is_a_config_error_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^server\.public_url: "):
        Config().replace(server={"public_url": value})


def test_a_bad_trusted_proxies_entry_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"^server\.trusted_proxies: .*'proxy\.local'"):
        Config().replace(server={"trusted_proxies": "127.0.0.1, proxy.local"})
    got = Config().replace(server={"trusted_proxies": " 127.0.0.1 , 10.0.0.0/8,"})
    assert parse_trusted_proxies(got.server.trusted_proxies) == LOCAL[:2]


# The client's address, which the anonymous budgets count (decision 0071) ---------


def test_the_client_is_the_peer_and_forwarded_for_is_ignored_from_an_untrusted_one() -> None:
    assert client_address("203.0.113.7", LOCAL) == "203.0.113.7"
    # Anyone can send the header: from a peer no proxy, it counts for nothing.
    assert client_address("203.0.113.7", LOCAL, "198.51.100.1") == "203.0.113.7"
    # Nothing is trusted by default, not even this machine.
    assert client_address("127.0.0.1", (), "198.51.100.1") == "127.0.0.1"


def test_from_a_trusted_proxy_the_rightmost_untrusted_hop_is_the_client() -> None:
    # What the client sent itself stands left of what the proxy appended.
    assert client_address("127.0.0.1", LOCAL, "1.1.1.1, 198.51.100.1") == "198.51.100.1"
    # Hops that are trusted proxies themselves are walked past.
    assert client_address("127.0.0.1", LOCAL, "1.1.1.1, 198.51.100.1, 10.0.0.5") == ("198.51.100.1")
    # Every hop trusted: the leftmost is the client.
    assert client_address("127.0.0.1", LOCAL, "10.0.0.9, 10.0.0.5") == "10.0.0.9"
    # A trusted proxy that forwards nothing is the client.
    assert client_address("127.0.0.1", LOCAL) == "127.0.0.1"


@pytest.mark.parametrize(
    ("hop", "client"),
    [
        ("198.51.100.1:5173", "198.51.100.1"),
        ("[2001:db8:1:2::9]:443", "2001:db8:1:2::/64"),
        (" 2001:db8:1:2::9 ", "2001:db8:1:2::/64"),
        ("::ffff:198.51.100.1", "198.51.100.1"),
    ],
)
def test_a_forwarded_hop_may_carry_a_port_brackets_or_a_mapped_address(
    hop: str, client: str
) -> None:
    assert client_address("127.0.0.1", LOCAL, f"1.1.1.1, {hop}") == client


@pytest.mark.parametrize("hop", ["unknown", "_hidden", "unix:/run/a.sock", ""])
def test_a_hop_that_is_no_address_stops_at_the_proxy_that_wrote_it(hop: str) -> None:
    # Its clients then share the proxy's budget: nothing a client sends
    # left of it can choose another.
    assert client_address("10.0.0.5", LOCAL, f"198.51.100.1, {hop}") == "10.0.0.5"


def test_an_ipv6_client_is_counted_by_its_64() -> None:
    one = client_address("2001:db8:1:2:aaaa::1", ())
    other = client_address("2001:db8:1:2:ffff:ffff:ffff:ffff", ())
    assert one == other == "2001:db8:1:2::/64"
    assert client_address("2001:db8:1:3::1", ()) == "2001:db8:1:3::/64"
    # A dual-stack socket's IPv4 client is its IPv4 address.
    assert client_address("::ffff:203.0.113.7", ()) == "203.0.113.7"


def test_a_peer_that_is_no_ip_address_has_no_client() -> None:
    assert client_address(None, LOCAL) is None
    assert client_address("/run/hordelite.sock", LOCAL, "198.51.100.1") is None
