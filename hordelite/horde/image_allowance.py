"""What an account's image intake may still bring in (decision 0070).

A request's images are counted against the account's image budget as they
arrive, not only in the transaction that queues the request, after every
image was fetched, decoded, normalised and stored: an account whose budget
is full is refused before any of that, and an image is refused as soon as
its bytes (a data URL's from its length, a fetch's as received) cannot fit.

The budget's holdings are read once, before the intake; the images of the
account's other intakes in this process are counted here, in memory, from
the moment their bytes are in hand until their request is queued or
refused. What reaches the blob store is counted first, so the blob folder
stays within the budget but for intakes of other processes and requests
queued between a read and a count, each bounded by its images. The
transaction that queues the request still checks the budget as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

from hordelite.contract import budgets


class IntakeLedger:
    """Image bytes being taken in, by account, in this process."""

    def __init__(self) -> None:
        self._taking: dict[Hashable, int] = {}

    def taking(self, account: Hashable) -> int:
        return self._taking.get(account, 0)

    def _add(self, account: Hashable, delta: int) -> None:
        total = self._taking.get(account, 0) + delta
        if total > 0:
            self._taking[account] = total
        else:  # forgotten at 0: the ledger holds only accounts with intakes
            self._taking.pop(account, None)


@dataclasses.dataclass
class ImageAllowance:
    """One request's intake against its account's image budget. ``budget``
    None or without an image limit: nothing is counted."""

    ledger: IntakeLedger
    account: Hashable  # a user, or one anonymous client address
    budget: budgets.Budget | None
    role: budgets.Role
    held: int  # the image bytes the account's requests held when read
    counted: int = 0  # this intake's own, in the ledger

    @property
    def limited(self) -> bool:
        return self.budget is not None and bool(self.budget.image_bytes)

    def room(self) -> int | None:
        """The bytes one more image may bring; None: no limit."""
        if self.budget is None or not self.budget.image_bytes:
            return None
        return self.budget.image_bytes - self.held - self.ledger.taking(self.account)

    def check_open(self) -> None:
        """Raise the refusal when not even one more byte of image fits."""
        self._refuse(1)

    def change(self, old: int, new: int) -> int:
        """Count an image at ``new`` bytes in place of ``old``: raises the
        budget's refusal (counting nothing) when the growth does not fit.
        Returns ``new``."""
        if not self.limited:
            return new
        if new > old:
            self._refuse(new - old)
        self.ledger._add(self.account, new - old)
        self.counted += new - old
        return new

    def refuse_past(self, received: int) -> None:
        """Raise the refusal of an image whose fetch stopped past
        ``received`` bytes, the room there was when it started: counted as
        the account's intakes stood then, should another have ended since
        (the image was not read to its end, so it is refused all the same)."""
        limit = self.budget.image_bytes if self.budget is not None else 0
        then = max(self.ledger.taking(self.account), limit - self.held - received)
        refusal = budgets.intake_refusal(self.budget, self.role, self.held, then, received + 1)
        if refusal is not None:
            raise refusal

    def release(self) -> None:
        """The request is queued (its images now held in storage) or refused."""
        self.ledger._add(self.account, -self.counted)
        self.counted = 0

    def _refuse(self, adding: int) -> None:
        taking = self.ledger.taking(self.account)
        refusal = budgets.intake_refusal(self.budget, self.role, self.held, taking, adding)
        if refusal is not None:
            raise refusal
