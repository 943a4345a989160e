"""The storage's domain operations, in one namespace: ``queries.pop_job``.

They are the implementation of ``store.Store``, storage's one interface,
which names each operation, types its parameters and holds the rules; the
rest of the horde calls the Store.

Each operation takes a ``Tx`` already inside a transaction (see
``Database`` and ``transaction``) and does one thing: create a user,
submit a request, pop a job, submit a job, read a status, cancel, sweep.
Refusals are raised as HordeError inside the transaction, which rolls it
back: nothing stored, nothing charged. Each returns frozen dataclasses,
never rows.

The SQL lives in the modules beside this one, by what it stores:
``accounts`` (users), ``pool`` (workers), ``requests`` (submit, status,
cancel), ``queueing`` (queue rows), ``pop``, ``jobs`` (a worker's submit),
``ledger`` (settlement, faults, kudos), ``timers`` (the sweep) and
``readers`` (the OpenAI calls' reader leases).

Row locks on PostgreSQL are always taken in the same order (job, request,
users by id, worker) and the pop skips locked requests, so concurrent pops
never wait on each other and never hand one job to two workers.
"""

from __future__ import annotations

# What admission decided to queue (a record of the contract; submit_request stores it).
from hordelite.contract.admission import NewRequest
from hordelite.storage.accounts import (
    UserRecord,
    create_user,
    ensure_anonymous,
    user_by_id,
    user_by_key,
)
from hordelite.storage.jobs import (
    chat_job_to_judge,
    record_refusal,
    submit_job,
)
from hordelite.storage.pool import (
    DeletedWorker,
    OnlineWorker,
    ServedModel,
    ServedModels,
    WorkerChanges,
    WorkerPage,
    WorkerRecord,
    delete_worker,
    list_workers,
    model_queue_stats,
    online_pool,
    online_workers,
    served_models,
    update_worker,
    worker_details,
    worker_page,
)
from hordelite.storage.pop import (
    PoppedJob,
    PopResult,
    pop_job,
    skipped_sample,
)
from hordelite.storage.readers import (
    hold_reader,
    lapsed_requests,
    take_over,
)
from hordelite.storage.requests import (
    FirstRequest,
    Intake,
    StatusSnapshot,
    StoredJob,
    StoredRequest,
    Submitted,
    cancel_request,
    count_refusal,
    first_request,
    forget_response,
    request_status,
    stored_response,
    submit_chat_request,
    submit_request,
)
from hordelite.storage.rules import (
    Rules,
)
from hordelite.storage.timers import (
    QueueDepth,
    SweepResult,
    queue_depth,
    sweep,
)

__all__ = [
    "DeletedWorker",
    "FirstRequest",
    "Intake",
    "NewRequest",
    "OnlineWorker",
    "PopResult",
    "PoppedJob",
    "QueueDepth",
    "Rules",
    "ServedModel",
    "ServedModels",
    "StatusSnapshot",
    "StoredJob",
    "StoredRequest",
    "Submitted",
    "SweepResult",
    "UserRecord",
    "WorkerChanges",
    "WorkerPage",
    "WorkerRecord",
    "cancel_request",
    "chat_job_to_judge",
    "count_refusal",
    "create_user",
    "delete_worker",
    "ensure_anonymous",
    "first_request",
    "forget_response",
    "hold_reader",
    "lapsed_requests",
    "list_workers",
    "model_queue_stats",
    "online_pool",
    "online_workers",
    "pop_job",
    "queue_depth",
    "record_refusal",
    "request_status",
    "served_models",
    "skipped_sample",
    "stored_response",
    "submit_chat_request",
    "submit_job",
    "submit_request",
    "sweep",
    "take_over",
    "update_worker",
    "user_by_id",
    "user_by_key",
    "worker_details",
    "worker_page",
]
