"""The rules of a request through a shared key (contract.shared_keys): its
price within what the key has left once its requests in flight hold theirs,
and Idempotency-Keys of its own."""

from __future__ import annotations

import pytest

from hordelite.contract import shared_keys as rules
from hordelite.contract.headers import checked_operation_key
from hordelite.contract.kudos import request_quote
from hordelite.errors import HordeError


def test_a_price_is_checked_against_what_is_left_once_reservations_are_held() -> None:
    rules.check_request(30.0, 4.0, rules.UNLIMITED, 512, 26.0)  # 26 of 26 free
    with pytest.raises(HordeError) as refused:
        rules.check_request(30.0, 4.01, rules.UNLIMITED, 512, 26.0)
    assert refused.value.rc.name == "SharedKeyInsufficientKudos"
    assert "4.01 held" in refused.value.message
    # An unlimited key reserves nothing and refuses no price.
    rules.check_request(rules.UNLIMITED, 10**9, rules.UNLIMITED, 512, 10**6)
    assert rules.available(30.0, 45.0) == 0.0


def test_a_jobs_price_is_its_share_of_the_quote() -> None:
    for n in (1, 3, 7):
        quote = request_quote(512, n, 13.0)
        assert rules.job_price(quote, n) == request_quote(512, 1, 13.0)


def test_a_shared_keys_operation_keys_are_its_own() -> None:
    a, b = "a" * 64, "b" * 64
    assert rules.operation_key_of(a, "k1") != rules.operation_key_of(b, "k1")
    assert rules.operation_key_of(a, "k1") != rules.operation_key_of(a, "k2")
    scoped = rules.operation_key_of(a, "k" * 255)
    assert len(scoped) <= 255
    # No Idempotency-Key a client sends can be one a shared key's request is
    # stored under.
    with pytest.raises(HordeError) as refused:
        checked_operation_key(scoped)
    assert refused.value.rc.name == "BadRequest"
    assert checked_operation_key("k1") == "k1"
