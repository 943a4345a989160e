"""Per-user budgets: what one account may queue and hold stored, and how
many workers it may register.

The anonymous user is one account, but its budgets are counted per client
address (decision 0071): storage reads what that address holds, so one
anonymous client cannot spend the others' budgets. Each account has a role (anonymous, user, trusted) and each role
its own budget; an admin is exempt, as the AI Horde's moderators are from
its per-user limits. Pure: storage reads what the account holds inside the
transaction that queues the request (``Holdings``), and raises what
``refusal`` answers from it (decision 0049). A user's workers are counted
inside the pop's transaction, which asks ``WorkerCap.refuses`` whether one
more may be registered; the models cap is applied by
``text.parse_pop_request``, before any transaction, since it needs nothing
stored. 0 means no limit, and admins are exempt.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from hordelite.errors import RC, HordeError

# The window requests_per_minute counts over, in seconds.
RATE_WINDOW_SECONDS = 60.0
# A budget of what is held frees up when the account's own requests end,
# which no one can foretell: a refused client is told to come back after
# this many seconds, about one sweep of the horde's timers.
HELD_RETRY_SECONDS = 10

Role = Literal["anonymous", "user", "trusted"]

# The refusals of a budget, each counted toward requests_per_minute as a
# request would be (decision 0071): a flooder past a budget is then refused
# by the rate's one read, not by the whole submit each time. The rate's own
# refusal is not among them, so a flooder stores at most a window's budget
# of refusals.
COUNTED_REFUSALS: frozenset[RC] = frozenset(
    {RC.TooManyPrompts, RC.StoredBytesExceeded, RC.RequestTooLarge, RC.TooManyImages}
)


@dataclasses.dataclass(frozen=True)
class Budget:
    """One role's budgets; 0 is no limit."""

    requests_per_minute: int = 0
    requests_held: int = 0
    stored_bytes: int = 0
    images_per_request: int = 0
    image_bytes: int = 0

    @property
    def counts_held(self) -> bool:
        """Whether checking it needs what the account holds."""
        return bool(self.requests_held or self.stored_bytes or self.image_bytes)


@dataclasses.dataclass(frozen=True)
class Budgets:
    """Every role's budget of requests (``hordelite.config.BudgetsConfig``;
    the caps on workers are the pop's)."""

    anonymous: Budget = Budget()
    user: Budget = Budget()
    trusted: Budget = Budget()

    def of(self, *, anonymous: bool, trusted: bool, admin: bool) -> Budget | None:
        """The budget of an account with these flags; None: exempt."""
        if admin and not anonymous:
            return None
        if anonymous:
            return self.anonymous
        return self.trusted if trusted else self.user


UNLIMITED = Budgets()


def role_key(role: Role, name: str) -> str:
    """The configuration key of a role's budget, as a refusal names it."""
    prefix = "" if role == "user" else f"{role}_"
    return f"budgets.{prefix}{name}"


@dataclasses.dataclass(frozen=True)
class Holdings:
    """What an account holds now, as storage read it: requests queued in the
    last minute (and when the oldest of them was), requests still holding
    stored content, and the bytes of text and of images they hold."""

    recent: int = 0
    oldest_recent: float | None = None
    held: int = 0
    held_bytes: int = 0
    image_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Cost:
    """What one new request would add: its stored bytes of prompt and
    messages, and of images (normalised JPEG)."""

    stored_bytes: int
    image_bytes: int = 0
    images: int = 0


def too_many_images(budget: Budget | None, role: Role, images: int) -> HordeError | None:
    """413 TooManyImages for a request with more images than the role may
    send in one (checked before any image is read)."""
    if budget is None or not budget.images_per_request or images <= budget.images_per_request:
        return None
    key = role_key(role, "images_per_request")
    return HordeError(
        RC.TooManyImages,
        f"messages: this request has {images} images; {key} allows at most "
        f"{budget.images_per_request} in one request.",
        param="messages",
        limit=key,
    )


def refusal(
    budget: Budget | None, role: Role, held: Holdings, cost: Cost, now: float
) -> HordeError | None:
    """Why the account may not queue a request of ``cost`` now, or None.

    A request larger than a budget on its own is 413 RequestTooLarge (no
    retry helps); one that does not fit beside what is held is 429 with
    ``retry_after``: for the rate, the seconds until the oldest request of
    the window leaves it.
    """
    if budget is None:
        return None
    return (
        too_many_images(budget, role, cost.images)
        or _too_large(budget, role, cost)
        or rate_refusal(budget, role, held, now)
        or _held(budget, role, held, cost)
    )


def _too_large(budget: Budget, role: Role, cost: Cost) -> HordeError | None:
    for name, limit, size in (
        ("stored_bytes", budget.stored_bytes, cost.stored_bytes),
        ("image_bytes", budget.image_bytes, cost.image_bytes),
    ):
        if limit and size > limit:
            key = role_key(role, name)
            return HordeError(
                RC.RequestTooLarge,
                f"This request stores {size} bytes ({name.replace('_', ' ')}); {key} "
                f"allows at most {limit} for one account.",
                limit=key,
            )
    return None


def _subject(role: Role) -> str:
    # The anonymous budgets are each client address's own (decision 0071).
    return "This address" if role == "anonymous" else "This account"


def rate_refusal(budget: Budget, role: Role, held: Holdings, now: float) -> HordeError | None:
    """429 RequestRateExceeded when ``held.recent`` (requests and budget
    refusals of the window) reaches requests_per_minute."""
    limit = budget.requests_per_minute
    if not limit or held.recent < limit:
        return None
    oldest = now if held.oldest_recent is None else held.oldest_recent
    retry = max(1, math.ceil(oldest + RATE_WINDOW_SECONDS - now))
    return _over(
        RC.RequestRateExceeded,
        role,
        "requests_per_minute",
        f"{_subject(role)} sent {held.recent} requests in the last minute (refused ones count)",
        f"{limit}. Retry in {retry} s",
        retry,
    )


def _over(rc: RC, role: Role, name: str, what: str, allowed: str, retry_after: int) -> HordeError:
    """A refusal of what ``role`` holds or sent (``what``) past its budget
    ``name``, naming the configuration key and what it allows."""
    key = role_key(role, name)
    return HordeError(rc, f"{what}; {key} allows {allowed}.", limit=key, retry_after=retry_after)


def _held(budget: Budget, role: Role, held: Holdings, cost: Cost) -> HordeError | None:
    if budget.requests_held and held.held + 1 > budget.requests_held:
        return _over(
            RC.TooManyPrompts,
            role,
            "requests_held",
            f"{_subject(role)} holds {held.held} requests (waiting, or with jobs still out)",
            str(budget.requests_held),
            HELD_RETRY_SECONDS,
        )
    for name, limit, holding, adding in (
        ("stored_bytes", budget.stored_bytes, held.held_bytes, cost.stored_bytes),
        ("image_bytes", budget.image_bytes, held.image_bytes, cost.image_bytes),
    ):
        if limit and holding + adding > limit:
            return _over(
                RC.StoredBytesExceeded,
                role,
                name,
                f"{_subject(role)}'s requests hold {holding} bytes "
                f"({name.replace('_', ' ')}) and this one adds {adding}",
                str(limit),
                HELD_RETRY_SECONDS,
            )
    return None


def intake_refusal(
    budget: Budget | None, role: Role, held: int, taking: int, adding: int
) -> HordeError | None:
    """Why an image of ``adding`` bytes may not be taken in now, or None
    (decision 0070): checked before it is fetched further, decoded or
    stored. ``held``: the image bytes the account's requests hold, as read
    before the intake; ``taking``: its images being taken in meanwhile (the
    bytes received, or once normalised the JPEG's). ``adding`` 1 asks
    whether any image fits. An image larger than the whole budget is 413
    RequestTooLarge, one that does not fit beside the rest 429
    StoredBytesExceeded: its bytes free up as the account's requests end."""
    if budget is None or not budget.image_bytes:
        return None
    limit = budget.image_bytes
    key = role_key(role, "image_bytes")
    if adding > limit:
        return HordeError(
            RC.RequestTooLarge,
            f"An image of {adding} bytes or more does not fit in {key}, which allows "
            f"{limit} bytes of images for one {'address' if role == 'anonymous' else 'account'}.",
            limit=key,
        )
    if held + taking + adding <= limit:
        return None
    arriving = f", {taking} more are being taken in" if taking else ""
    need = "another image" if adding <= 1 else f"an image of {adding} bytes or more"
    return HordeError(
        RC.StoredBytesExceeded,
        f"{_subject(role)}'s requests hold {held} bytes of images{arriving}; {key} allows "
        f"{limit}: no room for {need}. Nothing of this request is kept.",
        limit=key,
        retry_after=HELD_RETRY_SECONDS,
    )


def role_of(*, anonymous: bool, trusted: bool) -> Role:
    if anonymous:
        return "anonymous"
    return "trusted" if trusted else "user"


# What one key may register ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WorkerCap:
    """How many workers one user may have registered, and the
    configuration key that sets it (the refusal names it)."""

    limit: int  # 0: no limit
    key: str

    def refuses(self, registered: int) -> bool:
        """Whether a user with ``registered`` workers may not register one more."""
        return self.limit > 0 and registered >= self.limit


NO_WORKER_CAP = WorkerCap(0, "")


def worker_cap(
    *, admin: bool, trusted: bool, workers_per_user: int, trusted_workers_per_user: int
) -> WorkerCap:
    """The cap of a user of this role: an admin has none (whoever runs the
    horde registers as many workers as it likes), a trusted user its own."""
    if admin:
        return NO_WORKER_CAP
    if trusted:
        return WorkerCap(trusted_workers_per_user, "budgets.trusted_workers_per_user")
    return WorkerCap(workers_per_user, "budgets.workers_per_user")


def over_models_cap(declared: int, models_per_worker: int) -> bool:
    """Whether a pop declaring ``declared`` distinct models declares more
    than one worker may (0: no limit)."""
    return models_per_worker > 0 and declared > models_per_worker
