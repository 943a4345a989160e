"""Which worker may take which request: the rule the pop query encodes in SQL.

The pop applies it as an indexed query (hordelite.storage.pop); this pure
form serves the status route's ``is_possible`` and the pop's ``skipped``
counts, and the tests hold the two to the same answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from hordelite.contract.chat_features import MESSAGES_URL_BIT
from hordelite.contract.limits import (
    ASSUMED_TOKENS_PER_SECOND,
    PREFERRED_SECONDS,
    SLOW_WORKER_TOKENS_PER_SECOND,
)


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
    # The chat declaration (chat_model None: the worker takes no chat jobs).
    prompt_jobs: bool = True
    chat_model: str | None = None
    chat_features: tuple[str, ...] = ()
    chat_mask: int = 0
    chat_max_context_length: int = 0
    chat_max_length: int = 0
    tools_max_temperature: float | None = None

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
    kind: str = "text"
    features: int = 0  # required chat features (a mask)
    context_tokens: int = 0  # the conversation's estimate, for chat
    tools_temperature: float | None = None  # set when tools reach the worker

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> RequestView:
        """The view of a stored request (or any mapping with REQUEST_FIELDS)."""
        view = {name: row[name] for name in REQUEST_FIELDS}
        return cls(
            **{**view, "models": tuple(view["models"]), "worker_ids": tuple(view["worker_ids"])}
        )


# The fields eligibility reads from a request, declared once: the requests
# table has a column of each name, and storage reads exactly these.
REQUEST_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RequestView))


# Reasons a chat request passes over a worker that serves its model; the
# status reports the first two kinds as its impossible_reason.
DECLARATION_GAPS = ("chat_features", "tools_max_temperature")
LIMIT_GAPS = ("max_context_length", "max_length")


def skip_reason(worker: WorkerView, request: RequestView) -> str | None:
    """Why this worker cannot take this request (a ``skipped`` key), or None."""
    reason = _restriction(worker, request)
    if reason is not None:
        return reason
    if request.kind == "chat":
        return chat_gap(worker, request)
    if not worker.prompt_jobs:
        return "prompt_jobs"
    if request.models and not set(request.models) & set(worker.models):
        return "models"
    if request.max_context_length > worker.max_context_length:
        return "max_context_length"
    if request.max_length > worker.max_length:
        return "max_length"
    return None


def chat_gap(worker: WorkerView, request: RequestView) -> str | None:
    """Why a chat request cannot go to this worker, or None.

    "models": the worker does not serve a model of the request as a chat
    model; then a declaration gap (DECLARATION_GAPS) before a limit gap
    (LIMIT_GAPS), as the status reports them.
    """
    if worker.chat_model is None or worker.chat_model not in request.models:
        return "models"
    if request.features & ~worker.chat_mask:
        return "chat_features"
    if (
        request.tools_temperature is not None
        and worker.tools_max_temperature is not None
        and request.tools_temperature > worker.tools_max_temperature
    ):
        return "tools_max_temperature"
    if request.max_length > worker.chat_max_length:
        return "max_length"
    if request.context_tokens + request.max_length > worker.chat_max_context_length:
        return "max_context_length"
    return None


def _restriction(worker: WorkerView, request: RequestView) -> str | None:
    if request.worker_ids:
        listed = worker.id in request.worker_ids
        if request.worker_blacklist and listed:
            return "blacklist"
        if not request.worker_blacklist and not listed:
            return "worker_id"
    if request.trusted_workers and not worker.trusted:
        return "untrusted"
    if request.nsfw and not worker.nsfw:
        return "nsfw"
    if not request.slow_workers and worker.slow:
        return "performance"
    return None


def skipped_counts(worker: WorkerView, sample: Sequence[RequestView]) -> dict[str, int]:
    """Why each request of ``sample`` was passed over by ``worker``, counted by reason."""
    counts: dict[str, int] = {}
    for request in sample:
        reason = skip_reason(worker, request)
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def can_serve(worker: WorkerView, request: RequestView) -> bool:
    if worker.maintenance:
        return False
    # The usual answer, found first and cheaply: a chat request and a worker
    # without a chat model of it (every wake-up of the queue asks this of
    # every waiting pop).
    if request.kind == "chat" and worker.chat_model not in request.models:
        return False
    return skip_reason(worker, request) is None


# The lease preference (worker guide, "Streaming progress"): a chat worker
# that cannot generate its own max_length within PREFERRED_SECONDS takes only
# the chat jobs it can finish in that time while a faster peer covers it.


def preferred_tokens(worker: WorkerView) -> int:
    """The most tokens this worker generates within PREFERRED_SECONDS: the
    cap on a passed-over worker's chat jobs."""
    return int(worker.speed * PREFERRED_SECONDS)


def may_be_passed_over(worker: WorkerView) -> bool:
    """Whether this worker is slow enough for the preference to matter: a chat
    worker whose own max_length takes longer than PREFERRED_SECONDS. Fast
    workers (the usual case) need no look at their peers."""
    return (
        worker.chat_model is not None and worker.speed * PREFERRED_SECONDS < worker.chat_max_length
    )


def covers(other: WorkerView, worker: WorkerView) -> bool:
    """Whether ``other`` is faster and can take every chat job ``worker``
    can: so passing ``worker`` over never strands a request."""
    return (
        other.id != worker.id
        and other.chat_model == worker.chat_model
        and not other.maintenance
        and other.speed > worker.speed
        # messages_url is how a job is handed, not which jobs a worker takes.
        and other.chat_mask & worker.chat_mask & ~MESSAGES_URL_BIT
        == worker.chat_mask & ~MESSAGES_URL_BIT
        and other.chat_max_length >= worker.chat_max_length
        and other.chat_max_context_length >= worker.chat_max_context_length
        and (
            other.tools_max_temperature is None
            or (
                worker.tools_max_temperature is not None
                and other.tools_max_temperature >= worker.tools_max_temperature
            )
        )
        and (other.trusted or not worker.trusted)
        and (other.nsfw or not worker.nsfw)
    )


def passed_over(worker: WorkerView, peers: Sequence[WorkerView]) -> bool:
    """Whether this worker's chat jobs are capped at preferred_tokens: it may
    be passed over and one of its online chat peers covers it."""
    return may_be_passed_over(worker) and any(covers(other, worker) for other in peers)
