"""A query of the audit trail, as ``hordelite audit`` and
``GET /api/v2/operations/audit`` take it: which actions, by whom, on what,
since when, and which page. Pure: the caller names the field each value
came from (``--since`` at the shell, ``since`` on the route), and a bad
value is refused naming it (``bad_request``).

The names of the actions are storage's (``storage.audit.ACTIONS``): the
caller passes them, so that the one list stays where entries are written.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Iterable, Sequence

from hordelite.contract.limits import AUDIT_PAGE, MAX_COUNT_DIGITS, MAX_NAME
from hordelite.errors import bad_request

# A duration back from now: a whole number and its unit.
_DURATION = re.compile(r"^(\d{1,9})([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# A page's length when none is asked for.
DEFAULT_PAGE = 50


@dataclasses.dataclass(frozen=True)
class Paging:
    """Which page of the audit trail a read answers, newest first: at most
    ``limit`` entries, older than the entry ``before_id`` (the next page's
    cursor: the last id shown). The trail's own reads and the moderation
    review's event reads (``contract.moderation_review``) page alike."""

    limit: int = DEFAULT_PAGE
    before_id: int | None = None


@dataclasses.dataclass(frozen=True)
class AuditQuery(Paging):
    """A read of the trail (``storage.audit.entries``): the entries of
    ``actions`` (any when empty), by ``actor``, on ``target``, at or after
    ``since``."""

    actions: tuple[str, ...] = ()
    actor: str | None = None
    target: str | None = None
    since: float | None = None


@dataclasses.dataclass(frozen=True)
class AuditText:
    """An audit query's values as given, text not yet checked: ``hordelite
    audit``'s flags, or the admin route's parameters (``parse_query``
    checks them)."""

    # Each value one action or a comma list of actions.
    actions: Sequence[str] = ()
    actor: str | None = None
    target: str | None = None
    # A duration back from now or an ISO time (``parse_since``).
    since: str | None = None
    before: str | None = None
    limit: str | None = None


def parse_query(given: AuditText, known: Sequence[str], now: float, prefix: str = "") -> AuditQuery:
    """The query of the values ``given``, each bad one refused naming its
    field: ``prefix`` and the value's name, the actions' as ``action``
    (``--since`` at the shell, ``since`` on the route). ``known``: the
    actions the trail records."""
    actor, target, since, before = given.actor, given.target, given.since, given.before
    return AuditQuery(
        actions=parse_actions(given.actions, known, f"{prefix}action"),
        actor=None if actor is None else parse_text(actor, f"{prefix}actor", MAX_NAME),
        target=None if target is None else parse_text(target, f"{prefix}target", MAX_NAME),
        since=None if since is None else parse_since(since, now, f"{prefix}since"),
        before_id=None if before is None else parse_count(before, f"{prefix}before"),
        limit=(
            DEFAULT_PAGE
            if given.limit is None
            else parse_count(given.limit, f"{prefix}limit", AUDIT_PAGE)
        ),
    )


def parse_actions(values: Iterable[str], known: Sequence[str], field: str) -> tuple[str, ...]:
    """The actions of ``values``, each one name or a comma list of them, in
    the order first given; refused naming ``field`` for a name not in
    ``known``."""
    found: list[str] = []
    for value in values:
        for name in value.split(","):
            name = name.strip()
            if not name:
                continue
            if name not in known:
                raise bad_request(
                    field, f"no action {name[:64]!r}; the actions: {', '.join(known)}"
                )
            if name not in found:
                found.append(name)
    return tuple(found)


def parse_since(text: str, now: float, field: str) -> float:
    """The time ``text`` names: a duration back from ``now`` (``90s``,
    ``30m``, ``2h``, ``7d``, ``1w``) or an ISO 8601 time (UTC unless it
    says its offset), as seconds since the epoch."""
    text = text.strip()
    duration = _DURATION.match(text)
    if duration:
        return now - int(duration.group(1)) * _UNIT_SECONDS[duration.group(2)]
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise bad_request(
            field, f"expected a duration such as 2h or 7d, or an ISO time; got {text[:64]!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def parse_count(text: str, field: str, most: int | None = None) -> int:
    """A whole number from 1 (to ``most``), refused naming ``field``."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_COUNT_DIGITS or int(text) < 1:
        raise bad_request(field, f"expected a whole number from 1; got {text[:64]!r}")
    value = int(text)
    if most is not None and value > most:
        raise bad_request(field, f"at most {most}; got {value}")
    return value


def parse_text(text: str, field: str, longest: int) -> str:
    """A name to match exactly (an actor, a target), not empty."""
    text = text.strip()
    if not text or len(text) > longest:
        raise bad_request(field, f"expected 1 to {longest} characters")
    return text
