"""Whether an account may queue a request: kudos up front and the concurrency
limit. Pure: storage reads the account and its generations in flight inside
the transaction that queues the request, then applies what these decide."""

from __future__ import annotations

from typing import Literal

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
