"""The words of the refusals the horde decides inside a storage transaction.

Pure: storage reads the rows, then raises what these build from the values it
read; the texts live here, next to the other user-facing words of contract/,
not among the SQL.
"""

from __future__ import annotations

from hordelite.errors import RC, HordeError

# Users and requests --------------------------------------------------------


def unknown_user(user_id: int) -> HordeError:
    return HordeError(RC.UserNotFound, f"No user with id {user_id}.")


def username_exists(name: str) -> HordeError:
    return _name_held(RC.UsernameAlreadyExists, "username", "user", name)


def _name_held(rc: RC, field: str, holder: str, name: str) -> HordeError:
    """A new name (a user's, a worker's) that another ``holder`` has,
    compared by key (decision 0073)."""
    return HordeError(
        rc,
        f"{field}: another {holder} is already named {name[:64]!r} (or a look-alike of it).",
        errors={field: f"another {holder} has this name"},
    )


def operation_key_reused() -> HordeError:
    """An Idempotency-Key sent again with a different request."""
    return HordeError(
        RC.OperationKeyReused,
        "This Idempotency-Key was used for a different request; use a new key.",
    )


def unknown_listed_worker(worker_id: str) -> HordeError:
    """A request's ``workers`` names a worker the horde does not know."""
    return HordeError(RC.WorkerNotFound, f"workers: no worker with id {worker_id}.")


def kudos_upfront(
    field: str, max_length: int, upfront_max_length: int, quote: float, kudos: float, kind: str
) -> HordeError:
    """A request over the free max_length whose account cannot pay up front;
    a text request could instead have asked to be downgraded."""
    return HordeError(
        RC.KudosUpfront,
        f"{field} {max_length} is over {upfront_max_length} and needs {quote} "
        f"kudos up front; this account has {round(kudos, 2)}. Lower it"
        + (" or set allow_downgrade." if kind == "text" else "."),
    )


def too_many_in_flight(in_flight: int, limit: int, *, anonymous: bool = False) -> HordeError:
    # The anonymous user's limit is each client address's (decision 0071).
    subject = "This address" if anonymous else "This account"
    return HordeError(
        RC.TooManyPrompts,
        f"{subject} has {in_flight} generations in flight and may have at most {limit}.",
    )


def unknown_request(kind: str, request_id: str) -> HordeError:
    return HordeError(RC.RequestNotFound, f"No {kind} request with id {request_id}.")


# Workers -------------------------------------------------------------------


def worker_name_taken(name: str, stored_name: str) -> HordeError:
    """A pop under a worker name (or a look-alike of it, ``stored_name``)
    that another user's worker first popped with."""
    return HordeError(
        RC.WrongCredentials,
        f"The worker name {name!r} belongs to another user"
        + (f" (as {stored_name!r})." if stored_name != name else "."),
    )


def worker_in_maintenance(name: str, worker_id: str) -> HordeError:
    return HordeError(
        RC.WorkerMaintenance,
        f"Worker {name!r} is in maintenance mode; its owner can clear it with "
        f"PUT /api/v2/workers/{worker_id} and maintenance: false.",
    )


def too_many_workers(name: str, registered: int, limit: int, key: str) -> HordeError:
    """A first pop under ``name`` by a user who has ``registered`` workers
    and may have ``limit`` (the configuration ``key`` that sets it)."""
    workers = "1 worker" if registered == 1 else f"{registered} workers"
    return HordeError(
        RC.TooManyWorkers,
        f"This account has {workers} registered and may have at most {limit} ({key}); "
        f"worker {name!r} was not registered. Pop under the name of one of its "
        "workers, or ask the horde's operator for a higher limit.",
    )


def unknown_worker(worker_id: str) -> HordeError:
    return HordeError(RC.WorkerNotFound, f"No worker with id {worker_id}.")


def worker_name_exists(name: str) -> HordeError:
    return _name_held(RC.NameAlreadyExists, "name", "worker", name)


def not_the_workers_owner() -> HordeError:
    return HordeError(RC.WrongCredentials, "Only the worker's owner can change it.")


# Jobs ----------------------------------------------------------------------


def unknown_job(job_id: str) -> HordeError:
    return HordeError(RC.InvalidJobID, f"No job with id {job_id}.")


def job_of_another_user() -> HordeError:
    return HordeError(RC.WrongCredentials, "This job was given to another user's worker.")


def job_lease_expired() -> HordeError:
    return HordeError(RC.AbortedGen, "This job was aborted: its lease expired.")


def job_request_ended() -> HordeError:
    return HordeError(RC.AbortedGen, "This job was aborted: its request ended.")


def wrong_answer_kind(job_kind: str) -> HordeError:
    """A text answer to a chat job, or a chat answer to a text job."""
    if job_kind == "chat":
        return HordeError(
            RC.ChatSubmitInvalid,
            "This is a chat job: answer it with message, finish_reason and model_id, not generation.",
        )
    return HordeError(
        RC.ChatSubmitInvalid, "This is a text job: answer it with generation, not message."
    )


def submit_refusal(
    job_state: str,
    job_kind: str,
    owned: bool,
    lease_end: float,
    now: float,
    answer_kind: str,
    faulted: bool,
) -> HordeError | None:
    """Why a worker's answer to a stored job cannot be taken, or None.

    ``owned``: the job was given to the answering user's worker;
    ``lease_end``: the later of the stored lease and the one progress posts
    extended; ``answer_kind``: "chat" for a structured reply, else "text";
    ``faulted``: the answer is a fault, which either kind of job takes.
    """
    if not owned:
        return job_of_another_user()
    if job_state == "done":
        return HordeError(RC.DuplicateGen)
    # Before the lease: an answer of the other kind is refused whatever the
    # lease says, so a generation's submit need not read the progress lease
    # (answers_only_a_text_job).
    if not faulted and answer_kind != job_kind:
        return wrong_answer_kind(job_kind)
    if job_state == "expired" or (job_state == "processing" and lease_end < now):
        # A lease past its end is refused at once; the sweep requeues it.
        return job_lease_expired()
    if job_state != "processing":
        return job_request_ended()
    return None


def answers_only_a_text_job(answer_kind: str, faulted: bool) -> bool:
    """Whether an answer can be taken only for a text job: a generation that
    is not a fault (submit_refusal refuses it for a chat job before it looks
    at the lease). A text job streams no progress, so the submit of such an
    answer has no progress lease to read or end and no stream to close: two
    Redis round trips a text cycle does without."""
    return answer_kind == "text" and not faulted
