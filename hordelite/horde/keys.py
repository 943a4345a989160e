"""API keys and operation keys: how a key is stored and scoped."""

from __future__ import annotations

import hashlib
import secrets

from hordelite.contract.limits import ANONYMOUS_API_KEY


def hash_key(api_key: str) -> str:
    """What storage keeps of an API key (decision 0009): its sha256."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def new_api_key() -> str:
    """16 random bytes, url-safe; never starting with "-", which command
    lines would read as a flag (``--key -abc``)."""
    while True:
        key = secrets.token_urlsafe(16)
        if not key.startswith("-"):
            return key


def scoped_operation_key(api_key: str, operation_key: str | None) -> str | None:
    """The operation key a submit is stored under: None for the anonymous user.

    Keys are scoped to the user, and every anonymous caller is the same
    user: a key would let one anonymous caller get another's request (or
    its 409) back by guessing or reusing the key, so it is ignored there.
    """
    return None if api_key == ANONYMOUS_API_KEY else operation_key
