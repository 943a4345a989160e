"""Admission in the horde: what to queue for a text request, and the chat
admission loop around the write transaction.

The rules are pure (``hordelite.contract.admission`` and
``hordelite.contract.chat_admission``); this module runs them where they
cost the event loop least and the write lock nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence

from hordelite.contract import kudos as kudos_rules
from hordelite.contract.admission import NewRequest, text_bytes
from hordelite.contract.chat_admission import Capacity, heavy_to_admit, plan_admission
from hordelite.contract.chat_request import ChatRequest
from hordelite.contract.eligibility import WorkerView
from hordelite.contract.limits import UPFRONT_MAX_LENGTH
from hordelite.contract.models import ModelReference
from hordelite.contract.text import TextRequest
from hordelite.horde._core import HordeCore, run_pure
from hordelite.storage.requests import FirstRequest, Intake, Submitted

# Chat admission outside the write transaction: tries before admitting
# inside it, and how many sets of models keep their last capacity.
ADMISSION_TRIES = 3
CAPACITY_CACHE = 256


def text_quote(models: ModelReference, req: TextRequest) -> float:
    """The dry-run price: every job at full max_length on the largest model asked for."""
    sizes = [models.billions(m) for m in req.models] or [models.billions("")]
    return kudos_rules.request_quote(req.max_length, req.n, max(sizes))


def text_ceiling(
    models: ModelReference, req: TextRequest, online: Sequence[WorkerView]
) -> float | None:
    """The most a text request naming no model may cost: every job at full
    max_length on the largest model online (any worker may take it; its
    dry-run quote prices an unknown model). What a shared key holds for it
    (contract.shared_keys). None for a request naming its models: its quote
    already prices the largest."""
    if req.models:
        return None
    served = {m for w in online for m in w.models}  # each model priced once
    sizes = [models.billions(m) for m in served] + [models.billions("")]
    return kudos_rules.request_quote(req.max_length, req.n, max(sizes))


def text_fingerprint(req: TextRequest) -> str:
    """A digest of what was asked, which a resubmit under the same operation key must match."""
    raw = json.dumps(dataclasses.asdict(req), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


def new_text_request(
    req: TextRequest,
    quote: Callable[[TextRequest], float],
    operation_key: str | None = None,
    ceiling: Callable[[TextRequest], float | None] | None = None,
) -> NewRequest:
    """What storage queues for a validated text request (and its
    allow_downgrade alternative at the up-front threshold), each priced by
    ``quote`` (and ``ceiling``, ``text_ceiling``). The fingerprint is the
    request's as asked, on both: a resubmit of a downgraded request is the
    same request."""
    fingerprint = text_fingerprint(req) if operation_key else None

    def build(r: TextRequest) -> NewRequest:
        return NewRequest(
            eligibility=r.eligibility(),
            prompt=r.prompt,
            params=r.params,
            n=r.n,
            quote=quote(r),
            ceiling=None if ceiling is None else ceiling(r),
            softprompt=r.softprompt,
            proxied_account=r.proxied_account,
            webhook=r.webhook,
            operation_key=operation_key,
            fingerprint=fingerprint,
            stored_bytes=text_bytes(r.prompt),
        )

    new = build(req)
    if req.allow_downgrade and req.max_length > UPFRONT_MAX_LENGTH:
        lowered = {**req.params, "max_length": UPFRONT_MAX_LENGTH}
        low = dataclasses.replace(req, max_length=UPFRONT_MAX_LENGTH, params=lowered)
        new = dataclasses.replace(new, downgrade=build(low))
    return new


class ChatAdmission:
    """Queues a chat request, admitted outside the write transaction.

    Admission is pure work over the whole conversation: it runs before the
    write transaction, against the capacity the last transaction for these
    models saw. The transaction reads the workers anyway and uses the
    outcome when their capacity is the same (nearly always); otherwise it
    gives up before writing anything, and admission runs again outside it
    against what it saw. The last try admits inside.
    """

    def __init__(self, core: HordeCore) -> None:
        self._core = core
        # The capacity each set of chat models last had.
        self._capacities: dict[tuple[str, ...], Capacity] = {}

    async def queue(
        self,
        *,
        key_hash: str,
        req: ChatRequest,
        operation_key: str | None,
        fingerprint: str | None,
        intake: Intake,
    ) -> Submitted | FirstRequest:
        """The request queued under ``intake.request_id`` (its images already
        stored under it), or the first request of this operation key; raises
        the refusals of admission and of storing."""
        core = self._core
        billions = core.models.billions
        for attempt in range(ADMISSION_TRIES):
            seen = self._capacities.get(req.models)
            heavy = seen is not None and heavy_to_admit(req)
            plan = await run_pure(
                heavy,
                plan_admission,
                req,
                seen,
                attempt == ADMISSION_TRIES - 1,
                billions,
                operation_key,
                fingerprint,
            )
            outcome = await core.store.submit_chat_request(
                key_hash=key_hash,
                plan=plan,
                intake=intake,
                now=core.clock.now(),
                upfront_max_length=UPFRONT_MAX_LENGTH,
            )
            if not isinstance(outcome, Capacity):
                return outcome
            self._remember(req.models, outcome)
        raise AssertionError("the last try admits inside the transaction")

    def _remember(self, models: tuple[str, ...], cap: Capacity) -> None:
        self._capacities.pop(models, None)
        self._capacities[models] = cap
        if len(self._capacities) > CAPACITY_CACHE:
            # Model names are the clients': keep only the latest sets.
            del self._capacities[next(iter(self._capacities))]
