"""A request's status as a client sees it, from what storage read of it.

Pure: no I/O. ``status_of`` turns a StatusSnapshot (the request, its jobs,
its queue position and the online pool) into the RequestStatus both
envelopes render.
"""

from __future__ import annotations

import math
from typing import Any

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
    faulted = req.state in ("faulted", "expired")
    queue = _queue_fields(parts, processing)
    return RequestStatus(
        kind=req.kind,
        finished=len(done_jobs),
        processing=processing,
        restarted=req.restarts,
        waiting=req.remaining if req.state == "waiting" else 0,
        done=req.state in ("done", "cancelled"),
        faulted=faulted,
        queue_position=parts.position,
        kudos=round(req.kudos, 2),
        generations=tuple(generation(j) for j in done_jobs),
        context_adjustments=req.context_adjustments if req.kind == "chat" else None,
        fault=_fault_of(req, request_expiry) if faulted else None,
        **queue,
    )


def _queue_fields(parts: StatusSnapshot, processing: int) -> dict[str, Any]:
    """What a status says of the pool: the wait, whether an online worker
    can serve the request (and, for a chat request none can, why not) and
    its free eligible threads. A request no longer queued waits for nothing."""
    req = parts.request
    if not req.queued:
        return {"wait_time": 0, "is_possible": True, "impossible": None, "free_threads": None}
    # (eligible_workers and eligible_threads keep their 0 then.)
    eligible = [w for w in parts.online if can_serve(w, req.view)]
    impossible = None
    if req.kind == "chat" and not eligible:
        impossible = chat.impossible_reason(req.view, parts.online)
    free_threads = None
    if parts.busy is not None:
        busy = parts.busy
        free_threads = sum(max(w.threads - busy.get(w.id, 0), 0) for w in eligible)
    return {
        "wait_time": _wait_time(req, parts.position, processing, eligible),
        "is_possible": bool(eligible),
        "impossible": impossible,
        "free_threads": free_threads,
        "eligible_workers": len(eligible),
        "eligible_threads": sum(w.threads for w in eligible),
    }


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
        id=job.id,
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
