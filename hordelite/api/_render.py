"""The native AI Horde envelope of the service's typed results."""

from __future__ import annotations

from typing import Any

from hordelite.horde.results import Generation, PopAnswer, RequestStatus


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
