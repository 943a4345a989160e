"""The configuration values the storage operations need."""

from __future__ import annotations

import dataclasses

from hordelite.contract.addresses import Policy
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
    # budgets.workers_per_user and trusted_workers_per_user: the workers one
    # user may register (0: no limit), counted by the pop that registers one.
    workers_per_user: int
    trusted_workers_per_user: int
    # The per-user budgets of requests (contract/budgets.py).
    budgets: Budgets = UNLIMITED
    # Seconds an audit entry is kept ([moderation] audit_retention).
    audit_retention: float = 90 * 86400.0
    # [moderation]: the speed past which a job's worker is suspected (0:
    # never) and the words a worker's name is suspected for
    # (contract.suspicion).
    suspicious_tokens_per_second: float = 0.0
    suspicious_name_words: frozenset[str] = frozenset()
    # How offences time an address out ([moderation] offence_* keys).
    offences: Policy = dataclasses.field(default_factory=Policy)
