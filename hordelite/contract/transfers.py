"""A kudos transfer between users (``POST /kudos/transfer``), checked as
the AI Horde checks it. Pure: storage moves the kudos under both users'
locks, so that the ledger's sum never changes."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hordelite.contract._fields import expect_object, get_str, kind_name
from hordelite.contract.limits import MAX_NAME, MAX_USER_ID_DIGITS
from hordelite.errors import RC, HordeError, bad_request

# Kudos are shown to the hundredth: a transfer moves whole hundredths, so
# that no sum of transfers too small to see can move a balance.
KUDOS_DECIMALS = 2
# The largest transfer: far above any balance, far below where a float
# loses its hundredths.
MAX_TRANSFER = 1e12


@dataclasses.dataclass(frozen=True)
class Transfer:
    """To whom (``name#id``, split) and how much."""

    name: str
    user_id: int
    amount: float


def parse_transfer(body: Any) -> Transfer:
    body = expect_object(body, "body")
    # name#id: a user's name and its id's digits.
    username = get_str(body, "username", "username", MAX_NAME + 1 + MAX_USER_ID_DIGITS)
    amount = body.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        raise bad_request("amount", f"expected a number, got {kind_name(amount)}")
    if not math.isfinite(amount) or abs(amount) > MAX_TRANSFER:
        raise bad_request("amount", f"must be a finite number of at most {MAX_TRANSFER:.0f}")
    if amount <= 0:
        raise HordeError(
            RC.NegativeKudosTransfer, "amount: a transfer must move more than 0 kudos."
        )
    if round(amount, KUDOS_DECIMALS) != amount:
        raise bad_request(
            "amount", f"at most {KUDOS_DECIMALS} decimals: kudos are whole hundredths"
        )
    name, _, digits = username.rpartition("#")
    if not name or not (digits.isascii() and digits.isdigit()) or len(digits) > MAX_USER_ID_DIGITS:
        raise HordeError(
            RC.InvalidTargetUsername,
            "username: expected the user as name#id, as /find_user shows it.",
            errors={"username": "expected name#id"},
        )
    return Transfer(name, int(digits), float(amount))
