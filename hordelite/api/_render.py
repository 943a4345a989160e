"""The native AI Horde envelope of the service's typed results."""

from __future__ import annotations

from typing import Any

from hordelite.horde.results import PopAnswer, RequestStatus, UserAnswer


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
        "generations": list(s.generations),
    }
    if s.impossible is not None:
        answer["impossible_reason"] = {"rc": s.impossible.rc.name, "message": s.impossible.message}
    if s.context_adjustments:
        answer["context_adjustments"] = s.context_adjustments
    if s.fault is not None:
        answer["fault"] = {"rc": s.fault.rc, "message": s.fault.message}
    return answer


def pop(answer: PopAnswer) -> dict[str, Any]:
    if answer.job is None:
        return {"id": None, "ids": [], "payload": {}, "skipped": answer.skipped, "softprompt": None}
    job = answer.job
    return {
        "payload": job.payload,
        "id": job.id,
        "ids": [job.id],
        "model": job.model,
        "ttl": int(job.ttl),
        "skipped": {},
        "softprompt": job.softprompt,
        "messages": [],
        "extra_source_images": None,
        # Only chat jobs carry the key: a text job's answer is unchanged.
        **({"chat": True} if job.chat else {}),
    }


def user(u: UserAnswer) -> dict[str, Any]:
    """A user (find_user, users/<id>): what hordelite counts of the AI
    Horde's fields; the kinds of kudos it has no use for are 0."""
    return {
        "username": f"{u.username}#{u.id}",
        "id": u.id,
        "kudos": u.kudos,
        "concurrency": u.concurrency,
        "worker_count": len(u.worker_ids),
        "worker_ids": list(u.worker_ids),
        "trusted": u.trusted,
        "moderator": u.moderator,
        "kudos_details": {
            "accumulated": u.kudos_earned,
            "gifted": 0,
            "admin": 0,
            "received": 0,
            "recurring": 0,
        },
        "usage": {},
        "contributions": {},
    }
