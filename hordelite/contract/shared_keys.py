"""Shared keys (``/sharedkeys``, decision 0058): the bodies that create and
change one, and the rules a request through one must keep. Pure: storage
applies them under the key's row lock.

A shared key is a credential its owner lends: a request sent with it is
queued and paid for as the owner's, and spends the key's own kudos too,
until they run out (``SharedKeyEmpty``) or the key expires
(``SharedKeyExpired``). ``max_text_tokens`` caps a request's max_length.
A request's price is reserved on the key while it is in flight
(``check_request``, ``job_price``), and a key's Idempotency-Keys are its
own (``operation_key_of``).
The image limits are kept and shown, as the AI Horde keeps them; this horde
serves no images.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import uuid
from typing import Any

from hordelite.contract import _fields as f
from hordelite.contract.limits import (
    DEFAULT_SHARED_KEY_KUDOS,
    MAX_NAME,
    MAX_SHARED_KEY_DAYS,
    MAX_SHARED_KEY_KUDOS,
    MAX_SHARED_KEY_LIMIT,
)
from hordelite.errors import RC, HordeError, bad_request

UNLIMITED = -1
_DAY = 86400.0
_LIMITS = ("max_text_tokens", "max_image_pixels", "max_image_steps")


@dataclasses.dataclass(frozen=True)
class SharedKeyTerms:
    """What a key allows: kudos left (-1 unlimited), expiry in days from
    now (-1 never), a name, and per-job limits (-1 unlimited)."""

    kudos: int
    expiry_days: int
    name: str
    max_text_tokens: int
    max_image_pixels: int
    max_image_steps: int

    def expires_at(self, now: float) -> float | None:
        return expires_at(self.expiry_days, now)


@dataclasses.dataclass(frozen=True)
class SharedKeyEdit:
    """The fields a PATCH sets (None: left as they are)."""

    kudos: int | None = None
    expiry_days: int | None = None
    name: str | None = None
    max_text_tokens: int | None = None
    max_image_pixels: int | None = None
    max_image_steps: int | None = None


def expires_at(days: int, now: float) -> float | None:
    """The expiry of a key lasting ``days`` from ``now``; -1 and 0 never (0
    is never on the AI Horde too)."""
    return None if days in (UNLIMITED, 0) else now + days * _DAY


def _kudos(body: Any, default: Any) -> Any:
    return f.get_int(body, "kudos", "kudos", UNLIMITED, MAX_SHARED_KEY_KUDOS, default)


def _days(body: Any, default: Any) -> Any:
    return f.get_int(body, "expiry", "expiry", UNLIMITED, MAX_SHARED_KEY_DAYS, default)


def _limit(body: Any, key: str, default: Any) -> Any:
    return f.get_int(body, key, key, UNLIMITED, MAX_SHARED_KEY_LIMIT, default)


def parse_new_shared_key(body: Any) -> SharedKeyTerms:
    """``PUT /sharedkeys``: every field optional, at the AI Horde's defaults."""
    body = f.expect_object({} if body is None else body, "body")
    return SharedKeyTerms(
        kudos=_kudos(body, DEFAULT_SHARED_KEY_KUDOS),
        expiry_days=_days(body, UNLIMITED),
        name=f.get_str(body, "name", "name", MAX_NAME, ""),
        **{key: _limit(body, key, UNLIMITED) for key in _LIMITS},
    )


def parse_shared_key_edit(body: Any) -> SharedKeyEdit:
    """``PATCH /sharedkeys/{id}``: at least one field, else 400
    NoSharedKeyModSelected."""
    body = f.expect_object(body, "body")
    edit = SharedKeyEdit(
        kudos=_kudos(body, None),
        expiry_days=_days(body, None),
        name=f.get_str(body, "name", "name", MAX_NAME, None),
        **{key: _limit(body, key, None) for key in _LIMITS},
    )
    if edit == SharedKeyEdit():
        raise HordeError(RC.NoSharedKeyModSelected, "No shared key modification selected.")
    return edit


def check_usable(kudos: float, expiry: float | None, now: float) -> None:
    """A key with no kudos left is 403 SharedKeyEmpty; one past its expiry
    403 SharedKeyExpired (the AI Horde's order)."""
    if kudos == 0:
        raise HordeError(RC.SharedKeyEmpty, "This shared key has run out of kudos.")
    if expiry is not None and expiry < now:
        raise HordeError(RC.SharedKeyExpired, "This shared key has expired.")


def check_request(
    kudos: float, reserved: float, max_text_tokens: int, max_length: int, quote: float
) -> None:
    """A request through a key: its max_length within the key's
    max_text_tokens (400 BadRequest naming params.max_length, the AI
    Horde's refusal), its price within the kudos the key has left once the
    requests in flight through it have their prices reserved (``reserved``,
    ``reservation``): 403 SharedKeyInsufficientKudos."""
    if max_text_tokens != UNLIMITED and max_length > max_text_tokens:
        raise bad_request(
            "params.max_length",
            f"This shared key is limited to {max_text_tokens} tokens per job. "
            f"You requested {max_length} tokens.",
        )
    if kudos == UNLIMITED:
        return
    free = available(kudos, reserved)
    if quote > free:
        held = f" ({reserved:.2f} held by its requests in flight)" if reserved > 0 else ""
        raise HordeError(
            RC.SharedKeyInsufficientKudos,
            f"This request may cost up to {quote:.2f} kudos; "
            f"this shared key has {free:.2f} left{held}.",
        )


# The reservation (decision 0058, amended): a request queued through a key
# holds its price on the key until each of its jobs settles, at its true
# cost, or can no longer be charged (the request ended, its jobs aborted).
# What a key holds is never a counter: storage sums it over the requests in
# flight (storage.shared_keys.reserved), each holding ``job_price`` for each
# job not yet settled, so no ending of a request can leave a reservation
# behind. The true cost of a job is at most its price (both are the job's
# cost at full max_length, the price on the largest model the request
# names), so the key never pays more than it had when the request came in.


def job_price(quote: float, n: int) -> float:
    """What each job of a request quoted ``quote`` for ``n`` jobs holds
    reserved on its key (``kudos.request_quote`` is n times a job's cost)."""
    return round(quote / n, 2)


def available(kudos: float, reserved: float) -> float:
    """What a key of ``kudos`` left (not unlimited) can still admit while
    ``reserved`` is held by its requests in flight."""
    return max(round(kudos - reserved, 2), 0.0)


def spent(kudos: float, cost: float) -> float:
    """The kudos a key has left after a job it paid ``cost`` for settled
    (never below 0; unlimited stays unlimited)."""
    if kudos == UNLIMITED:
        return kudos
    return max(round(kudos - cost, 2), 0.0)


# Each key's Idempotency-Keys are its own: a request sent through a shared key
# is stored under the key's own operation key, not its lender's, so that
# its holder cannot claim (or read back) the lender's. The stored key starts
# with a control character, which no header value can hold
# (contract.headers), so it never meets one the lender sent.
_SCOPED = "\x1f"


def operation_key_of(key_hash: str, operation_key: str) -> str:
    """The operation key a request sent through the shared key ``key_hash``
    is stored under: unique to the key, at most 65 characters."""
    digest = hashlib.sha256(f"{key_hash}{_SCOPED}{operation_key}".encode()).hexdigest()
    return _SCOPED + digest


# A key's id is derived from its lender's API key and a random nonce (the
# only part stored, with the id's hash): the database holds no credential
# (decision 0009), yet the lender, sending its own key, can be shown every
# key it lent (``sharedkey_ids``, as the AI Horde lists them). A key made
# with an API key can be listed only with that key, so a rotated or revoked
# key takes the shared keys made with it along (decision 0058, amended).


def key_id_of(lender_key: str, nonce: str) -> str:
    """The id (a UUID, as the AI Horde's) of the key lent with ``lender_key``
    and ``nonce``: 122 bits of HMAC-SHA256, not to be guessed without the
    lender's key."""
    digest = hmac.new(lender_key.encode("utf-8"), nonce.encode("ascii"), hashlib.sha256).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))
