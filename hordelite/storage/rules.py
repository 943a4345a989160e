"""The configuration values the storage operations need."""

from __future__ import annotations

import dataclasses

from hordelite.contract.budgets import UNLIMITED, Budgets


@dataclasses.dataclass(frozen=True)
class Rules:
    """The configuration values the queries need."""

    job_ttl: float
    request_expiry: float
    retention: float
    worker_online: float
    max_faults: int
    maintenance_aborts: int
    concurrency: int
    anonymous_concurrency: int
    allow_anonymous: bool
    # The per-user budgets of requests (contract/budgets.py).
    budgets: Budgets = UNLIMITED
