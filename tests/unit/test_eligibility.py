"""Which worker may take which request: skip_reason and can_serve.

Each test starts from a worker that can serve the request and changes one
thing, so the reason it reports is the one that thing causes.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from hordelite.contract.eligibility import RequestView, WorkerView, can_serve, skip_reason
from hordelite.contract.limits import ASSUMED_TOKENS_PER_SECOND, SLOW_WORKER_TOKENS_PER_SECOND
from tests.views import worker_view

WORKER_ID = str(uuid.uuid4())
OTHER_ID = str(uuid.uuid4())

WORKER = worker_view(
    id=WORKER_ID,
    models=("koboldcpp/m", "other"),
)

REQUEST = RequestView(
    models=(),
    max_length=80,
    max_context_length=2048,
    trusted_workers=False,
    slow_workers=True,
    nsfw=False,
    worker_ids=(),
    worker_blacklist=False,
)


def worker(**changes: object) -> WorkerView:
    return dataclasses.replace(WORKER, **changes)  # type: ignore[arg-type]


def request(**changes: object) -> RequestView:
    return dataclasses.replace(REQUEST, **changes)  # type: ignore[arg-type]


def slow_by_measure() -> WorkerView:
    # Measured just below the slow threshold: 10 seconds at (threshold - 0.5) t/s.
    seconds = 10.0
    return worker(
        tokens_generated=(SLOW_WORKER_TOKENS_PER_SECOND - 0.5) * seconds, seconds_generating=seconds
    )


def test_the_baseline_worker_can_serve_the_baseline_request() -> None:
    assert skip_reason(WORKER, REQUEST) is None
    assert can_serve(WORKER, REQUEST) is True


@pytest.mark.parametrize(
    ("w", "r", "reason"),
    [
        (WORKER, request(worker_ids=(OTHER_ID,)), "worker_id"),
        (WORKER, request(worker_ids=(WORKER_ID,), worker_blacklist=True), "blacklist"),
        (WORKER, request(models=("another-model",)), "models"),
        (WORKER, request(models=("m",)), "models"),
        (WORKER, request(max_context_length=4097), "max_context_length"),
        (WORKER, request(max_length=513), "max_length"),
        (WORKER, request(trusted_workers=True), "untrusted"),
        (WORKER, request(nsfw=True), "nsfw"),
        (worker(extra_slow=True), request(slow_workers=False), "performance"),
        (slow_by_measure(), request(slow_workers=False), "performance"),
    ],
    ids=[
        "not-in-whitelist",
        "in-blacklist",
        "no-common-model",
        "model-name-must-match-exactly",
        "context-too-long",
        "length-too-long",
        "untrusted-worker",
        "sfw-worker-nsfw-request",
        "extra-slow-worker",
        "measured-slow-worker",
    ],
)
def test_each_skip_reason_is_reported_and_the_worker_cannot_serve(
    w: WorkerView, r: RequestView, reason: str
) -> None:
    assert skip_reason(w, r) == reason
    assert can_serve(w, r) is False


@pytest.mark.parametrize(
    ("w", "r"),
    [
        (WORKER, request(worker_ids=(OTHER_ID, WORKER_ID))),
        (WORKER, request(worker_ids=(OTHER_ID,), worker_blacklist=True)),
        (WORKER, request(models=("nope", "koboldcpp/m"))),
        (WORKER, request(models=())),
        (WORKER, request(max_context_length=4096, max_length=512)),
        (worker(trusted=True), request(trusted_workers=True)),
        (worker(nsfw=True), request(nsfw=True)),
        (worker(nsfw=True), request(nsfw=False)),
        (worker(extra_slow=True), request(slow_workers=True)),
        (slow_by_measure(), request(slow_workers=True)),
    ],
    ids=[
        "in-whitelist",
        "not-in-blacklist",
        "one-common-model",
        "any-model",
        "limits-exactly-met",
        "trusted-worker",
        "nsfw-worker-nsfw-request",
        "nsfw-worker-sfw-request",
        "slow-worker-allowed",
        "measured-slow-worker-allowed",
    ],
)
def test_the_matching_counterpart_of_each_reason_is_served(w: WorkerView, r: RequestView) -> None:
    assert skip_reason(w, r) is None
    assert can_serve(w, r) is True


def test_a_worker_at_the_slow_threshold_is_not_slow() -> None:
    w = worker(tokens_generated=SLOW_WORKER_TOKENS_PER_SECOND * 10, seconds_generating=10.0)
    assert w.slow is False
    assert skip_reason(w, request(slow_workers=False)) is None


def test_a_worker_in_maintenance_cannot_serve_even_a_request_it_matches() -> None:
    w = worker(maintenance=True)
    assert skip_reason(w, REQUEST) is None
    assert can_serve(w, REQUEST) is False


def test_a_worker_without_measurements_has_the_assumed_speed() -> None:
    assert WORKER.speed == ASSUMED_TOKENS_PER_SECOND
    assert WORKER.slow is False


def test_a_worker_with_measurements_has_its_measured_speed() -> None:
    w = worker(tokens_generated=300.0, seconds_generating=20.0)
    assert w.speed == 15.0
