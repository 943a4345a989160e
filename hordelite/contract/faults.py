"""What a requester reads about a fault: the request's last fault, as
``{"rc", "message"}`` in its status (decision 0022).

Pure: storage calls these inside the transaction that records a fault, with
what it read from the job; the words are the horde's, never the worker's.
"""

from __future__ import annotations

import dataclasses

from hordelite.contract.chat_reply import FAULT_REASONS
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
    if reason == "reply_refused" and refusal_message:
        return Fault(RC.ChatWorkerFault.name, refusal_message)
    if reason is not None and reason in FAULT_REASONS:
        return Fault(RC.ChatWorkerFault.name, FAULT_REASONS[reason])
    return GENERIC


def counts_as_nonconformant(refusal_rc: str | None) -> bool:
    """A fault right after a nonconformant reply counts in the worker's
    nonconformant_replies, not its aborted jobs: the refusal was the horde's,
    and such faults must not lead to maintenance."""
    return refusal_rc == RC.ChatSubmitNonconformant.name
