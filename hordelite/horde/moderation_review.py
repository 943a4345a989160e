"""The AI Horde's moderation review (``/api/v2/operations/moderation``),
served from what hordelite keeps: the paused workers, the requests its
prompt filters refused or flagged (the audit trail's entries), a
moderator's notes on them, and the workers paused for suspicion.

hordelite never stores a prompt: every event's text fields are null,
``text_state`` "none", ``text_redacted`` true. It has no automatic
promotion nor account suspicion: the overview's promotion sections are
empty and their thresholds null. Answers are the AI Horde's JSON.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from hordelite.contract import moderation_review as rules_of
from hordelite.contract.suspicion import THRESHOLD, Suspicion
from hordelite.horde._core import HordeCore
from hordelite.horde.keys import hash_key
from hordelite.storage.audit import AuditEntry
from hordelite.storage.moderation_review import Note, PausedWorker

# What each reason says, as the AI Horde describes its suspicions.
_DESCRIPTIONS = {
    Suspicion.WORKER_NAME_LONG: "Worker Name too long",
    Suspicion.WORKER_NAME_EXTREME: "Worker Name extremely long",
    Suspicion.WORKER_PROFANITY: "Discriminatory worker name",
    Suspicion.UNREASONABLY_FAST: "Generation unreasonably fast",
}


def iso(at: float) -> str:
    """A time as the AI Horde's review routes write it (+00:00)."""
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(timespec="seconds")


class ModerationReview:
    def __init__(self, core: HordeCore) -> None:
        self._core = core

    async def overview(self, api_key: str, pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
        query = rules_of.overview_query(pairs)
        now = self._core.clock.now()
        shown, total = await self._core.store.paused_workers(
            key_hash=hash_key(api_key), query=query, now=now
        )
        return {
            "promotion_threshold": None,
            "suspicion_threshold": None,
            "worker_suspicion_threshold": THRESHOLD,
            "promotion_blocked_users": [],
            "promotion_eligible_users": [],
            "paused_workers": [_paused(w, now) for w in shown],
            "paused_workers_total": total,
        }

    async def prompt_events(self, api_key: str, pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
        query = rules_of.prompt_query(pairs, self._core.clock.now())
        found, notes = await self._core.store.prompt_events(key_hash=hash_key(api_key), query=query)
        full = len(found) == query.limit
        days = self._core.store.rules.audit_retention / 86400
        return {
            "events": [_prompt_event(e, notes.get(e.id, [])) for e in found],
            "next_cursor": found[-1].id if full and found else None,
            # hordelite keeps no text nor address apart from the entry: the
            # whole entry goes at audit_retention.
            "retention": {"text_days": None, "ipaddr_days": None, "ceiling_days": round(days)},
        }

    async def add_note(
        self, api_key: str, event_id: str, body: Any, address: str
    ) -> dict[str, Any]:
        made = await self._core.store.add_prompt_note(
            key_hash=hash_key(api_key),
            event_id=rules_of.parse_event_id(event_id),
            note=rules_of.parse_note(body),
            address=address,
            now=self._core.clock.now(),
        )
        return note_json(made)

    async def suspicion_events(
        self, api_key: str, pairs: Sequence[tuple[str, str]]
    ) -> dict[str, Any]:
        query = rules_of.suspicion_query(pairs)
        found = await self._core.store.suspicion_events(key_hash=hash_key(api_key), query=query)
        full = len(found) == query.limit
        return {
            "events": [_suspicion_event(e, owner) for e, owner in found],
            "next_cursor": found[-1][0].id if full and found else None,
        }


def note_json(n: Note) -> dict[str, Any]:
    return {"id": n.id, "author_id": n.author_id, "note": n.note, "created": iso(n.created)}


def _reason(s: Suspicion, count: int) -> dict[str, Any]:
    return {"id": s.value, "name": s.name, "description": _DESCRIPTIONS[s], "count": count}


def _paused(w: PausedWorker, now: float) -> dict[str, Any]:
    r = w.row
    return {
        "type": "text",
        "name": r["name"],
        "id": r["id"],
        "online": r["online_until"] > now,
        "owner_id": r["user_id"],
        "owner": f"{r['owner_name']}#{r['user_id']}",
        "last_check_in": iso(r["last_check_in"]),
        "maintenance_mode": r["maintenance"],
        "maintenance_msg": None,
        "suspicious": r["suspicion"],
        "suspicion_reasons": [_reason(s, n) for s, n in w.reasons],
        # hordelite keeps no suspicion, flag nor contact of an account.
        "owner_suspicion": None,
        "owner_trusted": r["owner_trusted"],
        "owner_flagged": None,
        "requests_fulfilled": r["requests_fulfilled"],
        "aborted_jobs": r["uncompleted_jobs"],
        "bridge_agent": r["bridge_agent"],
        "models": list(r["models"]),
        "contact": None,
    }


def _prompt_event(e: AuditEntry, notes: list[Note]) -> dict[str, Any]:
    return {
        "id": e.id,
        "created": iso(e.at),
        "user_id": e.actor_id,
        "request_id": None,
        "worker_id": None,
        "proxied_account": None,
        "ipaddr": e.address or None,
        "ip_subject_key": None,
        "origin_text": None,
        "models": None,
        "reason": "filter_rejection",
        # A flagged request was served as asked; a refused one never queued.
        "outcome": "rejected" if e.action == "request.refused" else "censored",
        "submitted_prompt": None,
        "moderation_prompt": None,
        "effective_prompt": None,
        "text_state": "none",
        "text_url": None,
        "text_sha256": None,
        "text_chars": None,
        "text_truncated": False,
        "text_redacted": True,
        "ipaddr_redacted": False,
        "anonymized": False,
        "hold_source": "note" if notes else None,
        "notes": [note_json(n) for n in notes],
        # hordelite's: the filters that matched, and what was screened.
        "filters": list(e.detail.get("filters", [])),
        "kind": e.detail.get("kind"),
    }


def _suspicion_event(e: AuditEntry, owner: int | None) -> dict[str, Any]:
    names = [str(n) for n in e.detail.get("reasons", [])]
    first = Suspicion.__members__.get(names[0]) if names else None
    return {
        "id": e.id,
        "created": iso(e.at),
        "worker_id": e.target,
        "worker_name": e.detail.get("name"),
        "user_id": owner,
        "suspicion_id": None if first is None else first.value,
        "reason": names[0] if names else None,
        "detail": f"paused at suspicion {e.detail.get('suspicion')}: {', '.join(names)}",
    }
