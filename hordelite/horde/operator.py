"""The operator's actions the horde itself takes: bring the schema up to date,
create a user. (``hordelite keys``, ``kudos`` and ``workers`` act on storage
directly: hordelite.cli._admin.)"""

from __future__ import annotations

from hordelite.contract.limits import ANONYMOUS_API_KEY
from hordelite.contract.user_edit import username_problem
from hordelite.errors import bad_request
from hordelite.horde._core import HordeCore
from hordelite.horde.keys import hash_key, new_api_key


class Operator:
    def __init__(self, core: HordeCore) -> None:
        self._core = core

    def migrate(self) -> tuple[int, int]:
        """Bring the schema up to date and make sure the anonymous user
        exists; the versions before and after. Blocking: run it in a thread
        from a loop."""
        return self._core.store.migrate(
            anonymous_key_hash=hash_key(ANONYMOUS_API_KEY), now=self._core.clock.now()
        )

    async def create_user(
        self, username: str, *, kudos: float = 0.0, admin: bool = False, trusted: bool = False
    ) -> tuple[int, str]:
        """A new user and its API key (shown once: only its hash is stored).
        Refused naming ``username`` when the name cannot be a user's or is
        another user's (compared by key, decision 0073)."""
        username = username.strip()
        problem = username_problem(username)
        if problem:
            raise bad_request("username", problem)
        key = new_api_key()
        user_id = await self._core.store.create_user(
            username=username,
            key_hash=hash_key(key),
            kudos=kudos,
            admin=admin,
            trusted=trusted,
            now=self._core.clock.now(),
        )
        return user_id, key
