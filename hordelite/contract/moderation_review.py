"""The queries of the moderation review routes (the AI Horde's
``/operations/moderation``, docs/reference/native_api.md): the overview of
paused workers, the prompt events (hordelite's refused and flagged
requests, from the audit trail), a note on one, and the worker suspicion
events. Pure: each value is refused naming its parameter.

hordelite never keeps a prompt: an event says which filters matched, by
whom and from where, not what was asked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from hordelite.contract.addresses import parse_target
from hordelite.contract.audit_query import (
    DEFAULT_PAGE,
    Paging,
    parse_count,
    parse_since,
    parse_text,
)
from hordelite.contract.limits import (
    MAX_NAME,
    MAX_PROMPT_NOTE,
    OVERVIEW_SECTION,
    PROMPT_EVENTS_PAGE,
    SUSPICION_EVENTS_PAGE,
)
from hordelite.contract.suspicion import REPEATED, Suspicion
from hordelite.errors import bad_request

# The AI Horde's reasons a prompt event is kept; hordelite's are all the first.
PROMPT_REASONS = ("filter_rejection", "model_rejection", "worker_csam")
WORKER_TYPES = ("image", "text", "interrogation")
OVERVIEW_SORTS = ("suspicion", "last_check_in", "name", "owner")
_BOOLS = {"true": True, "1": True, "false": False, "0": False}


@dataclasses.dataclass(frozen=True)
class OverviewQuery:
    limit: int = DEFAULT_PAGE
    # Whether text workers are asked for (hordelite has no others).
    text: bool = True
    suspicion_ids: tuple[int, ...] = ()
    online: bool | None = None
    sort: str = "suspicion"


@dataclasses.dataclass(frozen=True)
class PromptQuery(Paging):
    """A page of prompt events: the audit trail's ``request.refused`` and
    ``request.flagged`` entries, paged as the trail's own reads are."""

    event_id: int | None = None
    user_id: int | None = None
    ipaddr: str | None = None
    since: float | None = None
    until: float | None = None
    # A filter no hordelite event can match (a proxied account, an address
    # pseudonym, a reporting worker, only reasons other than filters'):
    # the answer is an empty page, not a refusal.
    none: bool = False


@dataclasses.dataclass(frozen=True)
class SuspicionQuery(Paging):
    """A page of worker suspicion events: the audit trail's
    ``worker.suspicion`` entries, paged as the trail's own reads are."""

    worker_id: str | None = None
    user_id: int | None = None


def _first(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    return {key: value for key, value in reversed(pairs)}


def _all(pairs: Sequence[tuple[str, str]], name: str) -> list[str]:
    """Every value of a repeatable parameter (each may be a comma list)."""
    return [v.strip() for k, value in pairs if k == name for v in value.split(",") if v.strip()]


def _count(one: dict[str, str], name: str, most: int | None = None) -> int | None:
    value = one.get(name)
    return None if value is None else parse_count(value, name, most)


def _choice(value: str, name: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise bad_request(name, f"expected one of {', '.join(allowed)}; got {value[:64]!r}")
    return value


def overview_query(pairs: Sequence[tuple[str, str]]) -> OverviewQuery:
    one = _first(pairs)
    types = [_choice(t, "worker_type", WORKER_TYPES) for t in _all(pairs, "worker_type")]
    codes = {s.value for s in Suspicion}
    ids = []
    for text in _all(pairs, "suspicion_id"):
        if not (text.isascii() and text.isdigit()) or int(text) not in codes:
            raise bad_request(
                "suspicion_id", f"not a suspicion code hordelite raises: {text[:64]!r}"
            )
        ids.append(int(text))
    online = one.get("online")
    if online is not None and online.strip().lower() not in _BOOLS:
        raise bad_request("online", f"expected true or false; got {online[:64]!r}")
    return OverviewQuery(
        limit=_count(one, "limit", OVERVIEW_SECTION) or DEFAULT_PAGE,
        text=not types or "text" in types,
        suspicion_ids=tuple(ids),
        online=None if online is None else _BOOLS[online.strip().lower()],
        sort=_choice(one.get("sort", "suspicion"), "sort", OVERVIEW_SORTS),
    )


def prompt_query(pairs: Sequence[tuple[str, str]], now: float) -> PromptQuery:
    one = _first(pairs)
    reasons = [_choice(r, "reason", PROMPT_REASONS) for r in _all(pairs, "reason")]
    for name in ("proxied_account", "ip_subject_key", "worker_id"):
        if name in one:
            parse_text(one[name], name, MAX_NAME)
    since, until, ipaddr = one.get("since"), one.get("until"), one.get("ipaddr")
    return PromptQuery(
        limit=_count(one, "limit", PROMPT_EVENTS_PAGE) or DEFAULT_PAGE,
        before_id=_count(one, "before_id"),
        event_id=_count(one, "event_id"),
        user_id=_count(one, "user_id"),
        ipaddr=None if ipaddr is None else parse_target(ipaddr, "ipaddr"),
        since=None if since is None else parse_since(since, now, "since"),
        until=None if until is None else parse_since(until, now, "until"),
        none=any(n in one for n in ("proxied_account", "ip_subject_key", "worker_id"))
        or bool(reasons and "filter_rejection" not in reasons),
    )


def suspicion_query(pairs: Sequence[tuple[str, str]]) -> SuspicionQuery:
    one = _first(pairs)
    worker_id = one.get("worker_id")
    return SuspicionQuery(
        limit=_count(one, "limit", SUSPICION_EVENTS_PAGE) or DEFAULT_PAGE,
        before_id=_count(one, "before_id"),
        worker_id=None if worker_id is None else parse_text(worker_id, "worker_id", 36),
        user_id=_count(one, "user_id"),
    )


def parse_event_id(text: str) -> int:
    return parse_count(text, "event_id")


def parse_note(body: Any) -> str:
    """The note of ``{"note": ...}``: 1 to MAX_PROMPT_NOTE characters, no NUL."""
    note = body.get("note") if isinstance(body, dict) else None
    if not isinstance(note, str) or not note.strip():
        raise bad_request("note", "expected the note's text")
    if len(note) > MAX_PROMPT_NOTE:
        raise bad_request("note", f"at most {MAX_PROMPT_NOTE} characters")
    if "\x00" in note:
        raise bad_request("note", "must not hold a NUL character")
    return note


def suspicion_reasons(count: int, mask: int) -> list[tuple[Suspicion, int]]:
    """A worker's reasons and how many times each counted: those that count
    once are the bits of ``mask``; the rest of ``count`` is its jobs done
    too fast (the one reason that counts again)."""
    once = [s for s in Suspicion if s not in REPEATED and mask & (1 << s.value)]
    found = [(s, 1) for s in once]
    if count > len(once):
        found.append((Suspicion.UNREASONABLY_FAST, count - len(once)))
    return found
