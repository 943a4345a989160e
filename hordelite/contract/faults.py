"""What a requester reads about a fault: the request's last fault, as
``{"rc", "message"}`` in its status (decision 0022); and what a fault or an
expired lease does: requeue the job or end the request, count an abort or a
nonconformant reply, put the worker in maintenance.

Pure: storage calls these inside the transaction that records a fault, with
what it read from the job, its request and its worker, and writes what they
decide; the words are the horde's, never the worker's.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from hordelite.contract.chat_reply import FAULT_REASONS, FaultReason
from hordelite.contract.limits import ABORT_WINDOW_SECONDS
from hordelite.errors import RC


@dataclasses.dataclass(frozen=True)
class Fault:
    """A request's last fault: a return code's name and its message."""

    rc: str
    message: str


# A fault without a reason the horde knows: the generic fault, the same words
# as the front's 502 (worker guide, step 7: any other value is ignored and the fault is
# accepted as without it).
GENERIC = Fault(RC.ChatRequestFaulted.name, RC.ChatRequestFaulted.default_message)
LEASE_EXPIRED = Fault(
    RC.ChatWorkerFault.name,
    "A worker took this request and did not answer before its job's lease ran out.",
)
UNSENDABLE = Fault(
    RC.ChatWorkerFault.name,
    "This request holds text that is not valid Unicode (a lone surrogate) or a number "
    "JSON cannot carry, which no worker can send to its backend.",
)


def worker_fault(reason: str | None, refusal_message: str | None) -> Fault:
    """The fault a worker's faulted submit leaves on its request.

    ``reply_refused`` after a recorded refusal of the job reports that
    refusal's message; a known reason its fixed sentence; no reason, or one
    the horde does not know, the generic fault.
    """
    if reason == FaultReason.REPLY_REFUSED and refusal_message:
        return Fault(RC.ChatWorkerFault.name, refusal_message)
    if reason is not None and reason in FAULT_REASONS:
        return Fault(RC.ChatWorkerFault.name, FAULT_REASONS[reason])
    return GENERIC


def counts_as_nonconformant(refusal_rc: str | None) -> bool:
    """A fault right after a nonconformant reply counts in the worker's
    nonconformant_replies, not its aborted jobs: the refusal was the horde's,
    and such faults must not lead to maintenance."""
    return refusal_rc == RC.ChatSubmitNonconformant.name


# What a job given back counts against its worker.
Charge = Literal["abort", "nonconformant", "none"]


@dataclasses.dataclass(frozen=True)
class JobFault:
    """What a job given back does.

    ``end_request``: its request ends faulted at once, whatever its fault
    count (else the count grows by one). ``charge``: the worker counter it
    adds to.
    """

    fault: Fault
    end_request: bool
    charge: Charge


def job_fault(
    reason: str | None,
    refusal_rc: str | None,
    refusal_message: str | None,
    holds_unsendable: bool,
) -> JobFault:
    """A worker's faulted submit.

    A request holding text no worker can send to its backend ends faulted at
    its first fault, and the fault is not the worker's abort: the horde finds
    the cause in the request itself, without trusting the worker's reason,
    which never changes how a fault counts. A fault right after a
    nonconformant reply counts as nonconformant, not as an abort.
    """
    if holds_unsendable:
        return JobFault(UNSENDABLE, end_request=True, charge="none")
    charge: Charge = "nonconformant" if counts_as_nonconformant(refusal_rc) else "abort"
    return JobFault(worker_fault(reason, refusal_message), end_request=False, charge=charge)


# A lease that ran out: the job goes back, counted against its request like a
# fault (a request that no worker can finish, say one that crashes its
# backend, ends faulted after max_faults lapses instead of looping every
# lease), and counts as the worker's abort. Decision 0022.
LEASE_EXPIRY = JobFault(LEASE_EXPIRED, end_request=False, charge="abort")


@dataclasses.dataclass(frozen=True)
class GiveBack:
    """A job's slot returned to its waiting request.

    ``requeue``: the slot goes back to the queue (else the request ends
    faulted); ``enqueue``: the request was out of the queue (no job left to
    hand out) and goes back in. ``faults`` is the request's new fault count.
    """

    faults: int
    requeue: bool
    enqueue: bool


def give_back(faults: int, remaining: int, max_faults: int) -> GiveBack:
    """A waiting request gets a job's slot back with one more fault: past
    ``max_faults`` faults it ends faulted, else the job is requeued."""
    count = faults + 1
    if count > max_faults:
        return GiveBack(count, requeue=False, enqueue=False)
    return GiveBack(count, requeue=True, enqueue=remaining == 0)


@dataclasses.dataclass(frozen=True)
class Aborts:
    """A worker's abort count after one more abort: the count within the
    current window, the window's start, and whether it is in maintenance."""

    in_window: int
    window_start: float
    maintenance: bool


def count_abort(
    in_window: int, window_start: float, maintenance: bool, now: float, maintenance_aborts: int
) -> Aborts:
    """One more abort: counted in the hour's window (a new window starts when
    the last ran out); more than ``maintenance_aborts`` in a window puts the
    worker in maintenance, which only its owner clears."""
    still = now - window_start < ABORT_WINDOW_SECONDS
    aborts = in_window + 1 if still else 1
    return Aborts(
        aborts, window_start if still else now, maintenance or aborts > maintenance_aborts
    )
