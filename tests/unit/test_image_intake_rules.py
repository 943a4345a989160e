"""The image budget as an intake counts it (decision 0070): the pure rule
(contract/budgets.intake_refusal), a data URL's size from its length, and
the per-process count of what each account is taking in
(horde/image_allowance.py)."""

from __future__ import annotations

import base64

import pytest

from hordelite.contract.budgets import HELD_RETRY_SECONDS, Budget, intake_refusal
from hordelite.contract.image_normalise import data_url_bytes, parse_data_url
from hordelite.errors import HordeError
from hordelite.horde.image_allowance import ImageAllowance, IntakeLedger

BUDGET = Budget(image_bytes=1000)


def test_an_image_that_fits_beside_what_is_held_and_taken_in_is_not_refused() -> None:
    assert intake_refusal(BUDGET, "user", held=600, taking=300, adding=100) is None


def test_one_byte_past_what_is_left_is_429_naming_the_key() -> None:
    refusal = intake_refusal(BUDGET, "anonymous", held=600, taking=300, adding=101)
    assert refusal is not None
    assert (refusal.status, refusal.rc.name) == (429, "StoredBytesExceeded")
    assert refusal.extra["limit"] == "budgets.anonymous_image_bytes"
    assert refusal.extra["retry_after"] == HELD_RETRY_SECONDS
    assert "600 bytes of images, 300 more are being taken in" in refusal.message


def test_a_full_budget_has_no_room_for_another_image() -> None:
    refusal = intake_refusal(BUDGET, "user", held=1000, taking=0, adding=1)
    assert refusal is not None
    assert refusal.rc.name == "StoredBytesExceeded"
    assert "no room for another image" in refusal.message


def test_an_image_larger_than_the_whole_budget_is_413() -> None:
    refusal = intake_refusal(BUDGET, "trusted", held=0, taking=0, adding=1001)
    assert refusal is not None
    assert (refusal.status, refusal.rc.name) == (413, "RequestTooLarge")
    assert refusal.extra["limit"] == "budgets.trusted_image_bytes"


@pytest.mark.parametrize("budget", [None, Budget(image_bytes=0)])
def test_no_image_limit_refuses_nothing(budget: Budget | None) -> None:
    assert intake_refusal(budget, "user", held=10**12, taking=10**12, adding=10**9) is None


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 1000, 1001, 1002])
def test_a_data_urls_size_from_its_length_is_never_below_its_bytes(size: int) -> None:
    url = "data:image/png;base64," + base64.b64encode(b"x" * size).decode()
    assert size <= data_url_bytes(url) <= size + 2
    assert len(parse_data_url(url)) == size


def allowance(ledger: IntakeLedger, held: int, account: int = 1) -> ImageAllowance:
    return ImageAllowance(ledger, account, BUDGET, "user", held)


def test_an_accounts_intakes_count_together_and_leave_nothing_when_released() -> None:
    ledger = IntakeLedger()
    first, second = allowance(ledger, held=200), allowance(ledger, held=200)
    other = allowance(ledger, held=0, account=2)
    first.change(0, 500)  # received
    assert second.room() == 300
    with pytest.raises(HordeError) as refused:
        second.change(0, 301)
    assert refused.value.rc.name == "StoredBytesExceeded"
    assert ledger.taking(1) == 500  # the refused image counted nothing
    assert other.room() == 1000  # another account's budget is its own
    first.change(500, 120)  # normalised: its JPEG counts instead
    second.change(0, 680)
    assert second.room() == 0
    with pytest.raises(HordeError):
        second.check_open()
    first.release()
    second.release()
    assert ledger.taking(1) == 0
    assert ledger._taking == {}  # an account without intakes is forgotten


def test_a_fetch_stopped_at_what_was_left_is_refused_even_if_room_grew_since() -> None:
    ledger = IntakeLedger()
    fetching, ending = allowance(ledger, held=0), allowance(ledger, held=0)
    ending.change(0, 900)
    room = fetching.room()
    assert room == 100
    ending.release()  # another intake of the account ends meanwhile
    with pytest.raises(HordeError) as refused:
        fetching.refuse_past(room)
    assert refused.value.rc.name == "StoredBytesExceeded"


def test_no_image_limit_counts_nothing() -> None:
    ledger = IntakeLedger()
    free = ImageAllowance(ledger, 1, None, "user", 0)
    assert free.room() is None
    assert free.change(0, 10**9) == 10**9
    free.check_open()
    assert ledger.taking(1) == 0
