"""Which worker may take which request: the rule the pop query encodes in SQL.

The pop applies it as an indexed query (hordelite.storage.queries); this pure
form serves the status route's ``is_possible`` and the pop's ``skipped``
counts, and the tests hold the two to the same answers.
"""

from __future__ import annotations

import dataclasses

from hordelite.contract.limits import ASSUMED_TOKENS_PER_SECOND, SLOW_WORKER_TOKENS_PER_SECOND


@dataclasses.dataclass(frozen=True)
class WorkerView:
    id: str
    models: tuple[str, ...]
    max_length: int
    max_context_length: int
    nsfw: bool
    trusted: bool
    threads: int
    extra_slow: bool
    maintenance: bool
    tokens_generated: float
    seconds_generating: float

    @property
    def speed(self) -> float:
        """Measured tokens a second, or the assumed speed before any job."""
        if self.seconds_generating <= 0:
            return ASSUMED_TOKENS_PER_SECOND
        return self.tokens_generated / self.seconds_generating

    @property
    def slow(self) -> bool:
        return self.extra_slow or self.speed < SLOW_WORKER_TOKENS_PER_SECOND


@dataclasses.dataclass(frozen=True)
class RequestView:
    models: tuple[str, ...]
    max_length: int
    max_context_length: int
    trusted_workers: bool
    slow_workers: bool
    nsfw: bool
    worker_ids: tuple[str, ...]
    worker_blacklist: bool


def skip_reason(worker: WorkerView, request: RequestView) -> str | None:
    """Why this worker cannot take this request (a ``skipped`` key), or None."""
    if request.worker_ids:
        listed = worker.id in request.worker_ids
        if request.worker_blacklist and listed:
            return "blacklist"
        if not request.worker_blacklist and not listed:
            return "worker_id"
    if request.models and not set(request.models) & set(worker.models):
        return "models"
    if request.max_context_length > worker.max_context_length:
        return "max_context_length"
    if request.max_length > worker.max_length:
        return "max_length"
    if request.trusted_workers and not worker.trusted:
        return "untrusted"
    if request.nsfw and not worker.nsfw:
        return "nsfw"
    if not request.slow_workers and worker.slow:
        return "performance"
    return None


def can_serve(worker: WorkerView, request: RequestView) -> bool:
    return not worker.maintenance and skip_reason(worker, request) is None
