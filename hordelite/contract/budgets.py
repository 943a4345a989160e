"""What one key may register ([budgets]): pure rules, no I/O.

Storage counts a user's workers inside the pop's transaction and asks
``WorkerCap.refuses`` whether one more may be registered; the models cap
is applied by ``text.parse_pop_request``, before any transaction, since it
needs nothing stored. 0 means no limit, and admins are exempt.
"""

from __future__ import annotations

import dataclasses


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
