"""The image fetch's address policy, and the re-check of a redirect target.

A redirect from a public server to a private address cannot be staged on a
test machine (a first hop there is itself private), so the rule is shown
here on the functions every hop goes through: ``redirect_target`` builds the
next URL from a Location, ``resolve_target`` checks it from scratch.
"""

from __future__ import annotations

import ipaddress

import pytest

from hordelite.outbound.guarded_fetch import (
    ImageFetchRefused,
    address_is_public,
    parse_target,
    redirect_target,
    resolve_target,
)

REFUSED = [
    "127.0.0.1",
    "127.255.0.9",
    "10.0.0.1",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.169.254",
    "169.254.0.1",
    "100.64.0.1",  # shared address space (carrier NAT)
    "0.0.0.0",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "::1",
    "::",
    "fc00::1",
    "fd00:ec2::254",
    "fe80::1",
    "fec0::1",
    "ff02::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::7f00:1",  # IPv4-compatible form of 127.0.0.1
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "2001::1",  # Teredo
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not address_is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address: str) -> None:
    assert address_is_public(ipaddress.ip_address(address))


def test_a_relative_location_stays_on_the_hop_that_answered() -> None:
    hop = parse_target("https://images.example/a/b.png")
    assert str(redirect_target(hop, "c.png")) == "https://images.example/a/c.png"
    assert str(redirect_target(hop, "//other.example/x")) == "https://other.example/x"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "location",
    [
        "http://127.0.0.1:8080/x.png",
        "http://[::1]/x.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:10.0.0.1]/x.png",
        "http://metadata.google.internal/computeMetadata/v1/",
    ],
)
async def test_a_redirect_to_a_private_address_is_refused_as_a_new_url(location: str) -> None:
    hop = parse_target("https://images.example/a.png")
    with pytest.raises(ImageFetchRefused) as caught:
        await resolve_target(redirect_target(hop, location), allow_private=False)
    assert caught.value.reason == "address"


@pytest.mark.anyio
async def test_a_redirect_to_another_scheme_is_refused() -> None:
    hop = parse_target("https://images.example/a.png")
    with pytest.raises(ImageFetchRefused) as caught:
        await resolve_target(redirect_target(hop, "file:///etc/passwd"), allow_private=False)
    assert caught.value.reason == "scheme"


@pytest.mark.anyio
async def test_with_private_addresses_allowed_a_private_target_resolves() -> None:
    target, addresses = await resolve_target("http://10.0.0.1:81/x", allow_private=True)
    assert (target.host, target.port) == ("10.0.0.1", 81)
    assert addresses == [ipaddress.ip_address("10.0.0.1")]


def test_a_host_is_compared_in_lower_case_without_its_final_dot() -> None:
    assert parse_target("http://Metadata.Google.Internal./x").host == "metadata.google.internal"
