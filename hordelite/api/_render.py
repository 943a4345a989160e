"""The native AI Horde envelope of the service's typed results."""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from typing import Any

from hordelite.contract.modes import FIELDS as MODE_FIELDS
from hordelite.contract.modes import Modes
from hordelite.horde.results import (
    DeletedWorkerAnswer,
    Document,
    Generation,
    ModelStats,
    NewsPiece,
    Performance,
    PopAnswer,
    ProgressAnswer,
    Queued,
    Quote,
    RequestStatus,
    SharedKeyAnswer,
    SubmitAnswer,
    SubmittedRequest,
    UserAnswer,
    UserModified,
    WorkerAnswer,
    WorkerMessage,
    WorkerUpdate,
)


def status(s: RequestStatus) -> dict[str, Any]:
    """A status answer (text or chat): the AI Horde's fields, then the chat
    fields and ``fault`` (decision 0022) where they apply."""
    answer: dict[str, Any] = {
        "finished": s.finished,
        "processing": s.processing,
        "restarted": s.restarted,
        "waiting": s.waiting,
        "done": s.done,
        "faulted": s.faulted,
        "wait_time": s.wait_time,
        "queue_position": s.queue_position,
        "kudos": s.kudos,
        "is_possible": s.is_possible,
        # horde_sdk 0.33 reads these (its defaults are 0 and false):
        # the online workers that can serve the request while it is queued,
        # and whether it might wait for ever (none can).
        "eligible_workers": s.eligible_workers,
        "eligible_worker_threads": s.eligible_threads,
        "might_stall": not s.is_possible,
        "generations": [generation(g) for g in s.generations],
    }
    if s.impossible is not None:
        answer["impossible_reason"] = {"rc": s.impossible.rc.name, "message": s.impossible.message}
    if s.context_adjustments:
        answer["context_adjustments"] = s.context_adjustments
    if s.fault is not None:
        answer["fault"] = {"rc": s.fault.rc, "message": s.fault.message}
    return answer


def generation(g: Generation) -> dict[str, Any]:
    """A finished job: the AI Horde's text generation, or a chat reply with
    its message, finish reasons, reported counts and cost (chat guide)."""
    if g.reply is None:
        return {
            "text": g.text,
            "seed": g.seed,
            "gen_metadata": list(g.gen_metadata),
            "worker_id": g.worker_id,
            "worker_name": g.worker_name,
            "model": g.model,
            "state": g.state,
        }
    reply = g.reply
    return {
        "message": reply.message(),
        "finish_reason": reply.finish_reason,
        "native_finish_reason": reply.native_finish_reason,
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "reasoning_tokens": reply.reasoning_tokens,
        "worker_id": g.worker_id,
        "worker_name": g.worker_name,
        "model": g.model,
        "state": g.state,
        "kudos": g.kudos,
        "charge_basis": g.charge_basis,
    }


def shared_key(k: SharedKeyAnswer) -> dict[str, Any]:
    """A shared key's details, as the AI Horde shows them: kudos and utilized
    as whole kudos (the AI Horde keeps them as integers), the expiry as an
    ISO 8601 time in UTC, or null for never."""
    expiry = None
    if k.expiry is not None:
        expiry = datetime.datetime.fromtimestamp(k.expiry, datetime.UTC).isoformat()
    return {
        "id": k.id,
        "username": k.owner,
        "name": k.name,
        "kudos": int(k.kudos) if k.kudos < 0 else math.floor(k.kudos),
        "expiry": expiry,
        "utilized": math.ceil(k.utilized),
        "max_text_tokens": k.max_text_tokens,
        "max_image_pixels": k.max_image_pixels,
        "max_image_steps": k.max_image_steps,
    }


# A request's end as its webhook's body says it (``ended``): an expired
# request reads as faulted, as its status does (decision 0007).
_ENDED_AS = {"done": "done", "faulted": "faulted", "expired": "faulted", "cancelled": "cancelled"}


def webhook(request_id: str, state: str, s: RequestStatus) -> dict[str, Any]:
    """The body of a text request's webhook call (decision 0056): the AI
    Horde's body for a generation (``text``, ``seed``, ``worker_id``,
    ``worker_name``, ``model``, ``state``, ``gen_metadata``, ``id``,
    ``request``, ``kudos``), of the request's first generation when it has
    one, with how the request ended (``ended``), its status flags and every
    generation as its status lists them. ``state`` is the AI Horde's, the
    generation's (``ok``, ``censored``); a request that ended with no
    generation, which the AI Horde never calls for, says how it ended
    (``faulted``, ``cancelled``)."""
    ended = _ENDED_AS.get(state, state)
    body: dict[str, Any] = {"state": ended}
    if s.generations:
        first = s.generations[0]
        body.update(generation(first), id=first.id)
        body["state"] = first.state or "ok"
    body.update(
        request=request_id,
        ended=ended,
        kudos=s.kudos,
        done=s.done,
        faulted=s.faulted,
        finished=s.finished,
        generations=[generation(g) for g in s.generations],
    )
    return body


def pop(answer: PopAnswer) -> dict[str, Any]:
    messages = [worker_message(m) for m in answer.messages]
    if answer.job is None:
        return {
            "id": None,
            "ids": [],
            "payload": {},
            "skipped": answer.skipped,
            "softprompt": None,
            "messages": messages,
        }
    job = answer.job
    return {
        "payload": job.payload,
        "id": job.id,
        "ids": [job.id],
        "model": job.model,
        "ttl": int(job.ttl),
        "skipped": {},
        "softprompt": job.softprompt,
        "messages": messages,
        "extra_source_images": None,
        # Only chat jobs carry the key: a text job's answer is unchanged.
        **({"chat": True} if job.chat else {}),
    }


def user(u: UserAnswer, *, private: bool = True) -> dict[str, Any]:
    """A user (find_user, users/<id>, the user list): what hordelite counts
    of the AI Horde's fields; the kinds of kudos it has no use for are 0.
    Not ``private`` (anyone's view of another user): without its workers'
    ids, as the AI Horde hides them from all but the owner and moderators.
    Found by a shared key: named as the AI Horde names it then."""
    username = f"{u.username}#{u.id}"
    if u.via_shared_key is not None:
        username += f" (Shared Key: {u.via_shared_key})" if u.via_shared_key else " (Shared Key)"
    body: dict[str, Any] = {
        "username": username,
        "id": u.id,
        "kudos": u.kudos,
        "concurrency": u.concurrency,
        "worker_count": len(u.worker_ids),
        "trusted": u.trusted,
        "moderator": u.moderator,
        "kudos_details": {
            "accumulated": u.kudos_earned,
            "gifted": u.kudos_gifted,
            "admin": 0,
            "received": u.kudos_received,
            "recurring": 0,
        },
        "usage": {},
        "contributions": {},
        "account_age": u.account_age,
        # hordelite has no accounts awaiting verification (the AI Horde's
        # pseudonymous ones), and keeps no suspicion, evaluation or invites.
        "pseudonymous": False,
        "suspicious": 0,
        "evaluating_kudos": 0,
        "worker_invited": 0,
    }
    if private:
        body["worker_ids"] = list(u.worker_ids)
        if u.sharedkey_ids is not None:
            body["sharedkey_ids"] = list(u.sharedkey_ids)
    return body


def user_modified(m: UserModified) -> dict[str, Any]:
    """The AI Horde's answer to ``PUT /users/{id}``: each field changed, at
    its new value (``new_kudos`` for kudos)."""
    return {
        _USER_MODIFIED_KEYS.get(field, field): getattr(m.user, field)
        for field in ("username", "kudos", "concurrency", "trusted", "moderator")
        if getattr(m.edit, field) is not None
    }


# Where the answer's key is not the field's name.
_USER_MODIFIED_KEYS = {"kudos": "new_kudos"}


def worker(w: WorkerAnswer) -> dict[str, Any]:
    """A text worker in the AI Horde's shape, with hordelite's chat fields."""
    return {
        "type": "text",
        "name": w.name,
        "id": w.id,
        "online": w.online,
        "requests_fulfilled": w.requests_fulfilled,
        "kudos_rewards": w.kudos_rewards,
        "kudos_details": {"generated": w.kudos_rewards, "uptime": 0},
        "performance": f"{w.speed:.1f} tokens per second",
        "threads": w.threads,
        "uptime": int(w.uptime),
        "uncompleted_jobs": w.uncompleted_jobs,
        "tokens_generated": w.tokens_generated,
        "maintenance_mode": w.maintenance,
        "nsfw": w.nsfw,
        "trusted": w.trusted,
        "flagged": False,
        "bridge_agent": w.bridge_agent,
        "models": list(w.models),
        "max_length": w.max_length,
        "max_context_length": w.max_context_length,
        "info": w.info,
        "paused": w.paused,
        "suspicious": w.suspicious,
        "owner": w.owner,
        "accepts_chat_jobs": w.chat is not None,
        "accepts_prompt_jobs": w.prompt_jobs,
        "nonconformant_replies": w.nonconformant_replies,
        **({"chat": w.chat} if w.chat is not None else {}),
    }


def worker_update(u: WorkerUpdate) -> dict[str, Any]:
    """What a worker update changed, and only that."""
    fields = (
        "maintenance",
        "aborts_in_window",
        "online",
        "info",
        "name",
        "paused",
        "team",
        "new_suspicion",
    )
    return {key: getattr(u, key) for key in fields if getattr(u, key) is not None}


def deleted_worker(d: DeletedWorkerAnswer) -> dict[str, Any]:
    return {"deleted_id": d.id, "deleted_name": d.name}


def model(m: ModelStats) -> dict[str, Any]:
    """An entry of status/models; ``chat`` only where it was asked for and applies."""
    return {
        "name": m.name,
        "count": m.count,
        "performance": m.performance,
        "queued": m.queued,
        "jobs": m.jobs,
        "eta": m.eta,
        "type": "text",
        **({"chat": m.chat} if m.chat is not None else {}),
    }


def queued(answer: Queued | Quote) -> dict[str, Any]:
    """A text or chat submit's answer: the queued request, or a dry run's quote."""
    if isinstance(answer, Quote):
        return {"kudos": answer.kudos}
    body: dict[str, Any] = {"id": answer.id, "kudos": answer.kudos}
    if answer.context_adjustments:
        body["context_adjustments"] = answer.context_adjustments
    if answer.message is not None:
        body["message"] = answer.message
    if answer.warnings:
        body["warnings"] = [{"code": w.code, "message": w.message} for w in answer.warnings]
    return body


def progress(answer: ProgressAnswer) -> dict[str, Any]:
    return {"accepted_seq": answer.accepted_seq, "cancelled": answer.cancelled}


def submitted(answer: SubmitAnswer) -> dict[str, Any]:
    return {"reward": answer.reward}


def performance(p: Performance) -> dict[str, Any]:
    """/status/performance: the AI Horde's fields, its image and
    interrogation ones 0 (hordelite serves text only)."""
    return {
        "queued_requests": 0,
        "queued_text_requests": p.queued_requests,
        "worker_count": 0,
        "text_worker_count": p.workers,
        "thread_count": 0,
        "text_thread_count": p.threads,
        "queued_megapixelsteps": 0,
        "past_minute_megapixelsteps": 0,
        "queued_forms": 0,
        "interrogator_count": 0,
        "interrogator_thread_count": 0,
        "queued_tokens": p.queued_tokens,
        "past_minute_tokens": p.past_minute_tokens,
    }


def modes(m: Modes, raid_shown: bool) -> dict[str, Any]:
    """GET /status/modes: raid_mode only for an admin (the AI Horde's
    moderators'), so that raid mode does not show to those it is against."""
    shown = {"maintenance_mode": m.maintenance, "invite_only_mode": m.invite_only}
    return {**shown, "raid_mode": m.raid} if raid_shown else shown


def modes_set(changes: Mapping[str, bool], m: Modes) -> dict[str, Any]:
    """PUT /status/modes: the modes the body set, as they are now (the AI
    Horde answers only those)."""
    after = modes(m, raid_shown=True)
    return {field: after[field] for field, mode in MODE_FIELDS.items() if mode in changes}


def news_piece(n: NewsPiece) -> dict[str, Any]:
    return {
        "date_published": n.published or None,
        "newspiece": n.text,
        "importance": n.importance,
        "tags": [],
        "title": n.title or None,
        "more_info_urls": [],
    }


def document(d: Document) -> dict[str, Any]:
    return {d.format: d.text}


def worker_message(m: WorkerMessage) -> dict[str, Any]:
    return {
        "id": m.id,
        "worker_id": m.worker_id,
        "message": m.message,
        "origin": m.origin,
        "expiry": m.expiry,
    }


def submitted_text(r: SubmittedRequest) -> dict[str, Any]:
    """A text request as queued, in the AI Horde's request body shape."""
    return {
        "prompt": r.prompt,
        "params": r.params,
        "softprompt": r.softprompt,
        "trusted_workers": r.trusted_workers,
        "slow_workers": r.slow_workers,
        "workers": r.worker_ids,
        "worker_blacklist": r.worker_blacklist,
        "models": r.models,
        "proxied_account": r.proxied_account,
        "webhook": r.webhook,
    }
