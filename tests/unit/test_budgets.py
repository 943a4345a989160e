"""The per-user budgets' pure rules (contract/budgets.py): which budget an
account has, and what each refuses with."""

from __future__ import annotations

import pytest

from hordelite.config import Config
from hordelite.contract.budgets import (
    HELD_RETRY_SECONDS,
    Budget,
    Budgets,
    Cost,
    Holdings,
    refusal,
    role_key,
    too_many_images,
)
from hordelite.horde.service import budgets_of

ANON, USER, TRUSTED = Budget(requests_per_minute=1), Budget(requests_per_minute=2), Budget()
BUDGETS = Budgets(anonymous=ANON, user=USER, trusted=TRUSTED)


@pytest.mark.parametrize(
    ("flags", "budget"),
    [
        ({"anonymous": True, "trusted": False, "admin": False}, ANON),
        ({"anonymous": False, "trusted": False, "admin": False}, USER),
        ({"anonymous": False, "trusted": True, "admin": False}, TRUSTED),
        ({"anonymous": False, "trusted": True, "admin": True}, None),
        # The anonymous user is never exempt, whatever its row says.
        ({"anonymous": True, "trusted": False, "admin": True}, ANON),
    ],
)
def test_each_role_has_its_budget_and_an_admin_none(
    flags: dict[str, bool], budget: Budget | None
) -> None:
    assert BUDGETS.of(**flags) == budget


def test_the_configuration_sets_each_role_from_its_keys() -> None:
    config = Config().replace(
        budgets={
            "requests_per_minute": 7,
            "anonymous_requests_per_minute": 3,
            "trusted_images_per_request": 99,
        }
    )
    built = budgets_of(config)
    assert built.user.requests_per_minute == 7
    assert built.anonymous.requests_per_minute == 3
    assert built.trusted.images_per_request == 99
    assert built.user.stored_bytes == config.budgets.stored_bytes


def test_the_limit_a_refusal_names_is_the_role_key() -> None:
    assert role_key("user", "stored_bytes") == "budgets.stored_bytes"
    assert role_key("anonymous", "stored_bytes") == "budgets.anonymous_stored_bytes"
    assert role_key("trusted", "image_bytes") == "budgets.trusted_image_bytes"


def test_no_budget_refuses_nothing() -> None:
    held = Holdings(recent=10**6, held=10**6, held_bytes=10**12, image_bytes=10**12)
    assert refusal(None, "user", held, Cost(10**12, 10**12, 10**6), 0.0) is None
    assert refusal(Budget(), "user", held, Cost(10**12, 10**12, 10**6), 0.0) is None


def test_the_rate_counts_the_window_and_retries_when_its_oldest_leaves() -> None:
    budget = Budget(requests_per_minute=3)
    assert refusal(budget, "user", Holdings(recent=2, oldest_recent=100.0), Cost(1), 130.0) is None
    refused = refusal(budget, "user", Holdings(recent=3, oldest_recent=100.0), Cost(1), 130.0)
    assert refused is not None
    assert refused.rc.name == "RequestRateExceeded"
    assert refused.status == 429
    assert refused.extra["retry_after"] == 30
    assert refused.extra["limit"] == "budgets.requests_per_minute"


def test_a_retry_is_at_least_a_second() -> None:
    budget = Budget(requests_per_minute=1)
    refused = refusal(budget, "user", Holdings(recent=1, oldest_recent=70.0), Cost(1), 129.99)
    assert refused is not None
    assert refused.extra["retry_after"] == 1


def test_requests_held_counts_the_new_one() -> None:
    budget = Budget(requests_held=2)
    assert refusal(budget, "user", Holdings(held=1), Cost(1), 0.0) is None
    refused = refusal(budget, "anonymous", Holdings(held=2), Cost(1), 0.0)
    assert refused is not None
    assert (refused.rc.name, refused.status) == ("TooManyPrompts", 429)
    assert refused.extra == {"limit": "budgets.anonymous_requests_held", "retry_after": 10}
    assert HELD_RETRY_SECONDS == refused.extra["retry_after"]


@pytest.mark.parametrize("name", ["stored_bytes", "image_bytes"])
def test_bytes_alone_over_are_413_and_beside_what_is_held_429(name: str) -> None:
    budget = Budget(**{name: 100})
    alone = Cost(101, 0) if name == "stored_bytes" else Cost(1, 101)
    refused = refusal(budget, "user", Holdings(), alone, 0.0)
    assert refused is not None
    assert (refused.rc.name, refused.status) == ("RequestTooLarge", 413)
    assert "retry_after" not in refused.extra
    fits = Cost(50, 0) if name == "stored_bytes" else Cost(1, 50)
    holding = (
        Holdings(held_bytes=50, image_bytes=0)
        if name == "stored_bytes"
        else Holdings(image_bytes=50)
    )
    assert refusal(budget, "user", holding, fits, 0.0) is None
    more = Holdings(held_bytes=51) if name == "stored_bytes" else Holdings(image_bytes=51)
    refused = refusal(budget, "user", more, fits, 0.0)
    assert refused is not None
    assert (refused.rc.name, refused.status) == ("StoredBytesExceeded", 429)
    assert refused.extra["limit"] == f"budgets.{name}"


def test_too_many_images_is_413_naming_the_messages() -> None:
    budget = Budget(images_per_request=2)
    assert too_many_images(budget, "user", 2) is None
    refused = too_many_images(budget, "trusted", 3)
    assert refused is not None
    assert (refused.rc.name, refused.status) == ("TooManyImages", 413)
    assert refused.extra["param"] == "messages"
    assert refused.extra["limit"] == "budgets.trusted_images_per_request"
    assert too_many_images(None, "user", 10**6) is None


def test_a_single_oversized_request_is_413_before_the_rate_is_looked_at() -> None:
    budget = Budget(requests_per_minute=1, stored_bytes=10)
    refused = refusal(budget, "user", Holdings(recent=5, oldest_recent=0.0), Cost(11), 1.0)
    assert refused is not None
    assert refused.status == 413
