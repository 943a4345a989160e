"""A message to a worker (``POST /workers/messages``) and the listing's
filter, checked. Pure: storage keeps them, the pop carries them."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from hordelite.contract._fields import expect_object, get_int, get_str, parse_uuid
from hordelite.contract.limits import (
    MAX_MESSAGE_HOURS,
    MAX_NAME,
    MAX_WORKER_MESSAGE,
    MESSAGES_PAGE,
)
from hordelite.errors import bad_request

Validity = Literal["active", "expired", "all"]
VALIDITIES: tuple[Validity, ...] = ("active", "expired", "all")


# A message's expiry goes both ways in hours, as the AI Horde's does.
_HOUR = 3600.0


@dataclasses.dataclass(frozen=True)
class NewMessage:
    worker_id: str
    message: str
    origin: str | None
    hours: int

    def expires_at(self, now: float) -> float:
        return now + self.hours * _HOUR


def hours_left(expires: float, now: float) -> int:
    """A message's expiry as the AI Horde gives it: the hours left, rounded up."""
    return max(0, math.ceil((expires - now) / _HOUR))


def parse_message(body: Any) -> NewMessage:
    """The AI Horde's body: ``worker_id``, ``message``, ``origin``, and
    ``expiry`` in hours. hordelite's messages go to one worker each: a
    message without ``worker_id`` is refused by name."""
    body = expect_object(body, "body")
    worker_id = parse_uuid(body.get("worker_id"))
    if worker_id is None:
        raise bad_request("worker_id", "expected the id of the worker the message is for")
    message = get_str(body, "message", "message", MAX_WORKER_MESSAGE)
    if not message.strip():
        raise bad_request("message", "must hold a visible character")
    origin = get_str(body, "origin", "origin", MAX_NAME, None)
    hours = get_int(body, "expiry", "expiry", 1, MAX_MESSAGE_HOURS)
    return NewMessage(worker_id, message, origin or None, hours)


def parse_validity(value: str | None) -> Validity:
    if value is None or value == "":
        return "active"
    for validity in VALIDITIES:
        if value == validity:
            return validity
    raise bad_request("validity", "must be active, expired or all")


@dataclasses.dataclass(frozen=True)
class MessageQuery:
    """Which messages a listing asks for: those to one worker (None: every
    one its reader may read), by validity, one page of MESSAGES_PAGE."""

    worker_id: str | None
    validity: Validity
    page: int = 1

    @property
    def limit(self) -> int:
        return MESSAGES_PAGE

    @property
    def offset(self) -> int:
        return (self.page - 1) * MESSAGES_PAGE


def parse_message_query(worker_id: str | None, validity: str | None, page: int) -> MessageQuery:
    """The listing's filter from its query parameters; 400 naming the one
    that is not a worker id or a validity."""
    canonical = None
    if worker_id:
        canonical = parse_uuid(worker_id)
        if canonical is None:
            raise bad_request("worker_id", "expected a worker id")
    return MessageQuery(canonical, parse_validity(validity), page)
