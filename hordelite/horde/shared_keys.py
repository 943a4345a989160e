"""Shared keys (``/sharedkeys``, decision 0058): a user lends a key whose
requests it pays for, within the key's kudos and limits. The key's id is
the credential the owner hands out; a request sent with it as ``apikey``
is the owner's (hordelite.storage.shared_keys)."""

from __future__ import annotations

import secrets
from typing import Any

from hordelite.contract._fields import parse_uuid
from hordelite.contract.shared_keys import (
    key_id_of,
    parse_new_shared_key,
    parse_shared_key_edit,
)
from hordelite.errors import RC, HordeError
from hordelite.horde._core import HordeCore
from hordelite.horde.keys import hash_key
from hordelite.horde.results import SharedKeyAnswer
from hordelite.storage.shared_keys import SharedKeyRecord


class SharedKeys:
    def __init__(self, core: HordeCore) -> None:
        self._core = core

    async def create(self, api_key: str, body: Any) -> SharedKeyAnswer:
        """A new key of the caller's (``PUT /sharedkeys``)."""
        terms = parse_new_shared_key(body)
        nonce = secrets.token_hex(16)
        key_id = key_id_of(api_key, nonce)
        core = self._core
        made = await core.store.create_shared_key(
            owner_hash=hash_key(api_key),
            key_hash=hash_key(key_id),
            nonce=nonce,
            terms=terms,
            now=core.clock.now(),
        )
        return _answer(key_id, made)

    async def details(self, key_id: str) -> SharedKeyAnswer:
        """Anyone holding the id may read the key's details."""
        canonical = _canonical(key_id)
        return _answer(canonical, await self._core.store.shared_key(key_hash=hash_key(canonical)))

    async def edit(self, api_key: str, key_id: str, body: Any) -> SharedKeyAnswer:
        edit = parse_shared_key_edit(body)
        canonical = _canonical(key_id)
        core = self._core
        changed = await core.store.edit_shared_key(
            owner_hash=hash_key(api_key),
            key_hash=hash_key(canonical),
            edit=edit,
            now=core.clock.now(),
        )
        return _answer(canonical, changed)

    async def delete(self, api_key: str, key_id: str) -> None:
        canonical = _canonical(key_id)
        await self._core.store.delete_shared_key(
            owner_hash=hash_key(api_key), key_hash=hash_key(canonical)
        )


async def lent_key_ids(core: HordeCore, api_key: str, user_id: int) -> tuple[str, ...]:
    """The ids of the keys ``user_id`` lent with ``api_key``, its own key
    (``sharedkey_ids``): derived again, each checked by its hash."""
    lent = await core.store.lent_keys(user_id=user_id)
    derived = ((key_hash, key_id_of(api_key, nonce)) for key_hash, nonce in lent)
    return tuple(key_id for key_hash, key_id in derived if hash_key(key_id) == key_hash)


def _canonical(key_id: str) -> str:
    """The id as issued (lower-case UUID); any other is no key: 401
    InvalidAPIKey, the AI Horde's answer."""
    canonical = parse_uuid(key_id)
    if canonical is None:
        raise HordeError(RC.InvalidAPIKey, "No shared key with this id.")
    return canonical


def _answer(key_id: str, record: SharedKeyRecord) -> SharedKeyAnswer:
    return SharedKeyAnswer(id=key_id, **vars(record))
