"""What to queue for a request (``NewRequest``), and whether an account may
queue it: kudos up front and the concurrency limit (the budgets are
contract/budgets.py's). Pure: storage reads the
account and its generations in flight inside the transaction that queues
the request, then applies what these decide."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from hordelite.contract import generations
from hordelite.contract.budgets import Cost
from hordelite.contract.eligibility import RequestView

# "accepted": queued as asked; "downgrade": queued at its downgraded
# max_length; "refused": KudosUpfront.
Upfront = Literal["accepted", "downgrade", "refused"]


def upfront(
    max_length: int,
    upfront_max_length: int,
    quote: float,
    kudos: float,
    anonymous: bool,
    can_downgrade: bool,
) -> Upfront:
    """A request over the free max_length needs its quote in kudos up front,
    from a named account; without them it is downgraded when it allows it,
    else refused."""
    if max_length <= upfront_max_length:
        return "accepted"
    if kudos >= quote and not anonymous:
        return "accepted"
    return "downgrade" if can_downgrade else "refused"


def concurrency_limit(
    own: int | None, anonymous: bool, concurrency: int, anonymous_concurrency: int
) -> int:
    """The account's limit on generations in flight: its own, else the
    configured one for its kind of account. 0 or less: no limit."""
    if own is not None:
        return own
    return anonymous_concurrency if anonymous else concurrency


def unlimited(limit: int) -> bool:
    return limit <= 0


def over_limit(in_flight: int, n: int, limit: int) -> bool:
    """Whether ``n`` more generations would pass the limit."""
    return not unlimited(limit) and in_flight + n > limit


@dataclasses.dataclass(frozen=True)
class NewRequest:
    """What admission decided to queue: a text or a chat request (storage
    stores it as it is).

    ``eligibility`` holds every field that decides which worker may take it,
    declared once in RequestView: the requests table has a column of each
    name and the queue rows are derived from it (``queueing.enqueue``).
    """

    eligibility: RequestView
    prompt: str  # the text prompt, or the kept conversation flattened
    params: dict[str, Any]
    n: int
    quote: float  # the dry-run price, checked against kudos up front
    # The most its jobs may cost in all, when more than ``quote`` (a text
    # request naming no model: on the largest model online); what a shared
    # key holds for it.
    ceiling: float | None = None
    softprompt: str | None = None
    proxied_account: str | None = None
    webhook: str | None = None
    chat: dict[str, Any] | None = None
    submitted_prompt: str | None = None
    context_adjustments: list[dict[str, Any]] | None = None
    operation_key: str | None = None
    fingerprint: str | None = None
    # Queued instead when the kudos up front are missing (allow_downgrade).
    downgrade: NewRequest | None = None
    downgrade_field: str = "params.max_length"
    # What it holds stored, for its user's budgets (contract/budgets.py):
    # bytes of prompt and conversation, and of stored images, and the
    # number of images.
    stored_bytes: int = 0
    image_bytes: int = 0
    images: int = 0

    @property
    def kind(self) -> str:
        return self.eligibility.kind

    @property
    def held(self) -> float:
        """What it holds on a shared key while in flight: the most its jobs
        may cost."""
        return self.quote if self.ceiling is None else max(self.quote, self.ceiling)

    @property
    def held_bytes(self) -> int:
        """What it counts in its user's stored bytes while it is held: its
        prompt and conversation, and the stored bound of each of its n
        generations, reserved while it is held (decision 0069)."""
        return self.stored_bytes + generations.reserved_bytes(self.kind, self.max_length, self.n)

    @property
    def cost(self) -> Cost:
        return Cost(self.held_bytes, self.image_bytes, self.images)

    @property
    def max_length(self) -> int:
        return self.eligibility.max_length


def text_bytes(*texts: str | None) -> int:
    """The bytes these texts take stored (UTF-8), at least 1: a request that
    holds anything counts as held (contract/budgets.py)."""
    return max(1, sum(len(t.encode("utf-8", "surrogatepass")) for t in texts if t))
