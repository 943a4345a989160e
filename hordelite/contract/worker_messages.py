"""A message to a worker (``POST /workers/messages``) and the listing's
filter, checked. Pure: storage keeps them, the pop carries them."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from hordelite.contract._fields import expect_object, get_int, get_str, parse_uuid
from hordelite.contract.limits import MAX_MESSAGE_HOURS, MAX_NAME, MAX_WORKER_MESSAGE
from hordelite.errors import bad_request

Validity = Literal["active", "expired", "all"]
VALIDITIES: tuple[Validity, ...] = ("active", "expired", "all")


@dataclasses.dataclass(frozen=True)
class NewMessage:
    worker_id: str
    message: str
    origin: str | None
    hours: int


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
