"""Chat admission: what an online pool can take of a chat request, and what
to queue for it. Pure: the horde works admission out before its write
transaction against the capacity it last saw; the transaction reads the
online workers and applies the plan only when their capacity is the same
(``AdmissionPlan.under``), so admission holds under the write lock without
running inside it."""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Callable, Sequence
from typing import Any

from hordelite.contract import kudos as kudos_rules
from hordelite.contract.admission import NewRequest, text_bytes
from hordelite.contract.chat_request import (
    ChatRequest,
    conversation_chars,
    estimate_tokens,
    flatten_messages,
    image_count,
    required_mask,
    tools_temperature,
    truncate_oldest,
)
from hordelite.contract.eligibility import RequestView, WorkerView
from hordelite.contract.limits import UPFRONT_MAX_LENGTH
from hordelite.errors import RC, HordeError


def serving(online: Sequence[WorkerView], models: Sequence[str]) -> list[WorkerView]:
    """Online chat workers (not in maintenance) whose chat model is one of ``models``."""
    return [w for w in online if not w.maintenance and w.chat_model in models]


# A conversation over either is admitted in a worker thread (heavy_to_admit).
HEAVY_CONVERSATION_MESSAGES = 128
HEAVY_CONVERSATION_CHARS = 32_768


@dataclasses.dataclass(frozen=True)
class Capacity:
    """All that admission reads from the online workers, for one request:
    two reads that give the same Capacity admit the request the same way."""

    serving: bool  # an online chat worker serves one of the models
    longest: int  # the largest chat max_length among them (0: none)
    widest: int  # the largest chat max_context_length among them (0: none)
    close: tuple[str, ...] = ()  # served models close to the ones asked for (none serving)


# Close names a refusal suggests, at most this many.
CLOSE_NAMES = 3


def capacity(req: ChatRequest, online: Sequence[WorkerView]) -> Capacity:
    pool = serving(online, req.models)
    if not pool:
        return Capacity(serving=False, longest=0, widest=0, close=close_names(req.models, online))
    return Capacity(
        serving=True,
        longest=max(w.chat_max_length for w in pool),
        widest=max(w.chat_max_context_length for w in pool),
    )


def close_names(models: Sequence[str], online: Sequence[WorkerView]) -> tuple[str, ...]:
    """The chat models online workers serve whose names are close to one of
    ``models`` (a typo, another quantisation), best first."""
    served = sorted({w.chat_model for w in online if w.chat_model and not w.maintenance})
    close: list[str] = []
    for model in models:
        for name in difflib.get_close_matches(model, served, n=CLOSE_NAMES, cutoff=0.6):
            if name not in close:
                close.append(name)
    return tuple(close[:CLOSE_NAMES])


def heavy_to_admit(req: ChatRequest) -> bool:
    """Whether admission may take long enough to hold up the event loop: it
    reads, and may truncate and copy, the whole conversation."""
    return (
        len(req.messages) > HEAVY_CONVERSATION_MESSAGES
        or conversation_chars(req.messages) > HEAVY_CONVERSATION_CHARS
    )


def admit_within(
    req: ChatRequest,
    cap: Capacity,
    billions: Callable[[str], float],
    operation_key: str | None,
    fingerprint: str | None,
) -> NewRequest:
    """What to queue for a chat request, or a refusal before anything is queued.

    Refuses a model without an online chat worker (503 no_eligible_worker,
    known to the horde or not, suggesting close names), a conversation over
    every serving worker's context (400 no_worker_supports_limit, unless
    context_fit truncate_oldest makes it fit) and a quote over
    horde.max_kudos. Lowers a max_tokens over every serving worker's
    max_length to the largest, and says so in context_adjustments.
    ``fingerprint`` is the parsed request's, taken before its images were
    stored (a resubmit is compared with it). Pure: no I/O, so it runs
    outside the write transaction (and, for a long conversation, in a
    worker thread).
    """
    if not cap.serving:
        raise _unserved(req, cap)
    max_length, lowered = _fit_reply(req, cap.longest)
    fit = _fit_context(req, max_length, cap.widest)
    adjustments = [a for a in (lowered, fit.adjustment) if a is not None]
    queued = dataclasses.replace(req, messages=fit.messages, max_length=max_length)
    quote = _quote(req, max_length, billions)
    chat = queued.to_json()
    images, image_bytes = image_count(req.messages)
    return NewRequest(
        eligibility=_eligibility(queued, max_length, fit.context),
        prompt=fit.prompt,
        params={},
        n=1,
        quote=quote,
        chat=chat,
        submitted_prompt=fit.submitted,
        context_adjustments=adjustments or None,
        operation_key=operation_key,
        fingerprint=fingerprint,
        downgrade_field="max_tokens",
        stored_bytes=text_bytes(
            fit.prompt, fit.submitted, json.dumps(chat, ensure_ascii=False, separators=(",", ":"))
        ),
        image_bytes=image_bytes,
        images=images,
    )


def _quote(req: ChatRequest, max_length: int, billions: Callable[[str], float]) -> float:
    """The request's kudos quote (its largest model's, max_length in full);
    refused (MaxKudosExceeded) over horde.max_kudos."""
    quote = kudos_rules.request_quote(max_length, 1, max(billions(m) for m in req.models))
    if req.horde.max_kudos is not None and quote > req.horde.max_kudos:
        raise HordeError(
            RC.MaxKudosExceeded,
            f"This request may cost up to {quote} kudos (max_tokens {max_length} in full), "
            f"over its horde.max_kudos of {req.horde.max_kudos}; nothing was queued.",
            param="horde.max_kudos",
        )
    return quote


def _eligibility(queued: ChatRequest, max_length: int, context: int) -> RequestView:
    """What a worker must offer to take the queued request (its reply at
    most ``max_length``, its conversation estimated at ``context`` tokens)."""
    return RequestView(
        models=queued.models,
        max_length=max_length,
        max_context_length=context + max_length,
        trusted_workers=queued.horde.trusted_workers,
        slow_workers=queued.horde.slow_workers,
        nsfw=False,
        worker_ids=queued.horde.workers,
        worker_blacklist=queued.horde.worker_blacklist,
        kind="chat",
        features=required_mask(queued),
        context_tokens=context,
        tools_temperature=tools_temperature(queued),
    )


def _unserved(req: ChatRequest, cap: Capacity) -> HordeError:
    close = f" Served now: {', '.join(repr(m) for m in cap.close)}." if cap.close else ""
    return HordeError(
        RC.no_eligible_worker,
        f"No online chat worker serves {' or '.join(repr(m) for m in req.models)}; "
        f"nothing was queued.{close}",
        param="model",
    )


def _fit_reply(req: ChatRequest, longest: int) -> tuple[int, dict[str, Any] | None]:
    """The reply's max_length, and the adjustment when max_tokens was lowered.

    Without max_tokens a reply may be as long as a serving worker allows,
    up to the length that needs no kudos up front, so that a plain OpenAI
    call from an account without kudos is not refused for a field it never
    sent."""
    if not req.max_length:
        return min(longest, UPFRONT_MAX_LENGTH), None
    if req.max_length <= longest:
        return req.max_length, None
    return longest, {
        "field": "max_tokens",
        "requested": req.max_length,
        "applied": longest,
        "reason": "the largest max_length the online workers serving this model declare",
    }


@dataclasses.dataclass(frozen=True)
class _Fit:
    messages: list[dict[str, Any]]  # what the worker gets
    submitted: str  # the conversation as submitted, flattened
    prompt: str  # the kept conversation, flattened
    context: int  # its estimated tokens
    adjustment: dict[str, Any] | None  # when turns were dropped


def _fit_context(req: ChatRequest, max_length: int, widest: int) -> _Fit:
    """The conversation within the widest serving context with its reply:
    as sent, or truncated under context_fit truncate_oldest; refused (400
    no_worker_supports_limit) when it cannot fit. Flattened once, and again
    only when truncated."""
    submitted = flatten_messages(req.messages, req.tools)
    context = estimate_tokens(submitted)
    if context + max_length <= widest:
        return _Fit(req.messages, submitted, submitted, context, None)
    kept = None
    if req.horde.context_fit == "truncate_oldest":
        kept = truncate_oldest(req.messages, widest - max_length, req.tools)
    if kept is None:
        raise HordeError(
            RC.no_worker_supports_limit,
            f"The conversation (about {context} tokens) plus max_tokens ({max_length}) is over "
            f"the largest context an online worker serving this model declares ({widest}).",
            param="messages",
        )
    adjustment = {
        "field": "messages",
        "requested": len(req.messages),
        "applied": len(kept),
        "reason": "context_fit truncate_oldest dropped the oldest turns to fit "
        f"a context of {widest} tokens",
    }
    prompt = flatten_messages(kept, req.tools)
    return _Fit(kept, submitted, prompt, estimate_tokens(prompt), adjustment)


@dataclasses.dataclass(frozen=True)
class AdmissionPlan:
    """Admission worked out before the write transaction.

    ``seen`` is the capacity it was worked out against (None: no capacity
    known yet for these models), ``outcome`` what it gave: the request to
    queue, or its refusal, raised only inside the transaction, after the
    resubmit check. ``final``: the last try, which admits against whatever
    the transaction reads instead of planning again.
    """

    req: ChatRequest
    seen: Capacity | None
    outcome: NewRequest | HordeError | None
    final: bool
    billions: Callable[[str], float]
    operation_key: str | None
    fingerprint: str | None

    def under(self, online: Sequence[WorkerView]) -> NewRequest | Capacity:
        """What to queue, given the online chat workers the transaction read;
        raises the planned refusal. A Capacity instead: the pool is not the
        one planned for, so plan again against it (nothing is written)."""
        cap = capacity(self.req, online)
        if self.outcome is None or cap != self.seen:
            if not self.final:
                return cap
            return admit_within(self.req, cap, self.billions, self.operation_key, self.fingerprint)
        if isinstance(self.outcome, HordeError):
            raise self.outcome
        return self.outcome


def plan_admission(
    req: ChatRequest,
    seen: Capacity | None,
    final: bool,
    billions: Callable[[str], float],
    operation_key: str | None,
    fingerprint: str | None,
) -> AdmissionPlan:
    """``admit_within`` the capacity last seen (when one is known), its
    refusal kept in the plan rather than raised."""
    outcome: NewRequest | HordeError | None = None
    if seen is not None:
        try:
            outcome = admit_within(req, seen, billions, operation_key, fingerprint)
        except HordeError as refusal:
            outcome = refusal
    return AdmissionPlan(req, seen, outcome, final, billions, operation_key, fingerprint)
