"""A request's status as a client sees it, from what storage read of it.

Pure: no I/O. ``status_of`` turns a StatusSnapshot (the request, its jobs,
its queue position and the online pool) into the RequestStatus both
envelopes render.
"""

from __future__ import annotations

import math

from hordelite.contract.chat_reply import ChatReply
from hordelite.contract.eligibility import WorkerView, can_serve
from hordelite.contract.faults import Fault
from hordelite.errors import RC
from hordelite.horde import chat
from hordelite.horde.results import Generation, RequestStatus
from hordelite.storage.requests import StatusSnapshot, StoredJob, StoredRequest


def status_of(parts: StatusSnapshot, request_expiry: float) -> RequestStatus:
    """The status of the request ``parts`` holds; ``request_expiry`` is
    what an expired request's fault message names."""
    req = parts.request
    done_jobs = [j for j in parts.jobs if j.state == "done"]
    processing = len(parts.jobs) - len(done_jobs)
    queued = req.queued
    eligible = [w for w in parts.online if can_serve(w, req.view)]
    wait_time = _wait_time(req, parts.position, processing, eligible) if queued else 0
    impossible = None
    if req.kind == "chat" and queued and not eligible:
        impossible = chat.impossible_reason(req.view, parts.online)
    faulted = req.state in ("faulted", "expired")
    free_threads = None
    if queued and parts.busy is not None:
        busy = parts.busy
        free_threads = sum(max(w.threads - busy.get(w.id, 0), 0) for w in eligible)
    return RequestStatus(
        kind=req.kind,
        finished=len(done_jobs),
        processing=processing,
        restarted=req.restarts,
        waiting=req.remaining if req.state == "waiting" else 0,
        done=req.state in ("done", "cancelled"),
        faulted=faulted,
        wait_time=wait_time,
        queue_position=parts.position,
        kudos=round(req.kudos, 2),
        is_possible=bool(eligible) if queued else True,
        generations=tuple(generation(j) for j in done_jobs),
        impossible=impossible,
        context_adjustments=req.context_adjustments if req.kind == "chat" else None,
        fault=_fault_of(req, request_expiry) if faulted else None,
        free_threads=free_threads,
    )


def _fault_of(req: StoredRequest, request_expiry: float) -> Fault:
    """The last fault a faulted or expired request shows (decision 0022)."""
    if req.fault_rc:
        return Fault(req.fault_rc, req.fault_message or "")
    return Fault(
        RC.RequestExpired.name,
        f"The request expired: no worker took it within {int(request_expiry)} s.",
    )


def generation(job: StoredJob) -> Generation:
    """A finished job as a status shows it."""
    return Generation(
        worker_id=job.worker_id,
        worker_name=job.worker_name,
        model=job.model,
        state=job.gen_state,
        text=job.text,
        seed=job.seed if job.seed is not None else 0,
        gen_metadata=tuple(job.gen_metadata or ()),
        reply=None if job.reply is None else ChatReply.from_json(job.reply),
        kudos=job.cost if job.kind == "chat" else None,
        charge_basis=job.charge_basis,
    )


def _wait_time(
    req: StoredRequest, position: int, processing: int, eligible: list[WorkerView]
) -> int:
    """Seconds until the request is done, from the throughput of the workers that can serve it."""
    if not eligible:
        return 0
    throughput = sum(w.speed * w.threads for w in eligible)
    tokens = (position + req.remaining + processing) * req.view.max_length
    return math.ceil(tokens / throughput)
