"""The horde's modes in the service (hordelite.contract.modes): the
snapshot every request and pop checks, and the admin's GET and PUT.

Each process reads the modes at most every MODES_SECONDS, and at once when
the pool version moves (a change made through any process sharing the
Redis signals bumps it); the process that made a change sees it at once.
So a replica on the same database without shared signals sees a change
within MODES_SECONDS, and no request pays a read of its own.

Raid mode's throttle of anonymous requests counts per client address in
each process (a fixed window of a minute): a replica of N processes lets
an address through at most N times the rate. Throttling is for a raid's
duration, so it is kept in memory rather than written per request; at
most RAID_THROTTLED_CLIENTS addresses are counted at once, and a new
address past them is throttled until the window turns.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import anyio

from hordelite.config import Config
from hordelite.contract.budgets import RATE_WINDOW_SECONDS
from hordelite.contract.limits import ANONYMOUS_API_KEY, MODES_SECONDS, RAID_THROTTLED_CLIENTS
from hordelite.contract.modes import Modes, new_worker_refusal, parse_modes_edit
from hordelite.contract.unicode_rules import worker_name_key
from hordelite.errors import RC, HordeError
from hordelite.signals import Signals
from hordelite.storage.store import Store


class ModeSnapshot:
    """The modes as this process last read them, and the checks they make."""

    def __init__(self, store: Store, signals: Signals, config: Config) -> None:
        self._store = store
        self._signals = signals
        self._config = config.moderation
        self._lock = anyio.Lock()
        self._modes = Modes()
        self._read_at = -math.inf
        self._version = -1
        self._window = -math.inf
        self._counts: dict[str, int] = {}

    def _current(self) -> bool:
        fresh = anyio.current_time() - self._read_at < MODES_SECONDS
        return fresh and self._version == self._signals.pool_version()

    async def get(self) -> Modes:
        """The modes, read anew only when the snapshot is not current."""
        if not self._current():
            async with self._lock:  # one read for every caller that needs one
                if not self._current():
                    version = self._signals.pool_version()  # before the read
                    self._modes = await self._store.read_modes()
                    self._read_at = anyio.current_time()
                    self._version = version
        return self._modes

    def last(self) -> Modes:
        """The modes as last read, without reading (at most MODES_SECONDS
        old in a process serving requests)."""
        return self._modes

    @property
    def silent(self) -> bool:
        """Whether countermeasures are silent now (raid mode): a refusal
        they make then goes through ``contract.modes.silenced``."""
        return self._modes.silent

    def changed(self, modes: Modes) -> None:
        """This process changed the modes: seen at once here."""
        self._modes = modes
        self._read_at = anyio.current_time()
        self._version = self._signals.pool_version()

    async def admit_request(self, api_key: str, client: str | None) -> None:
        """A new request's check against the modes: 400 MaintenanceMode in
        maintenance; in raid mode, an anonymous one refused (403
        AnonymousDisabled) or throttled (429 RequestRateExceeded), as
        ``[moderation] raid_anonymous`` says, silently."""
        modes = await self.get()
        if modes.maintenance:
            raise HordeError(RC.MaintenanceMode)
        if not modes.raid or api_key != ANONYMOUS_API_KEY:
            return
        # Each with its code's general message and no time to wait: silent.
        if self._config.raid_anonymous == "refuse":
            raise HordeError(RC.AnonymousDisabled)
        if not self._take_turn(client or ""):
            raise HordeError(RC.RequestRateExceeded)

    def _take_turn(self, client: str) -> bool:
        """Whether the client may queue one more anonymous request in this
        minute's window (counted here, in this process)."""
        now = anyio.current_time()
        if now - self._window >= RATE_WINDOW_SECONDS:
            self._window, self._counts = now, {}
        count = self._counts.get(client)
        if count is None and len(self._counts) >= RAID_THROTTLED_CLIENTS:
            return False
        if (count or 0) >= self._config.raid_anonymous_per_minute:
            return False
        self._counts[client] = (count or 0) + 1
        return True

    async def admit_pop(self, key_hash: str, name: str) -> None:
        """A pop's check against the modes: while the horde is closed to new
        workers (invite-only or raid mode), a pop that would register a new
        worker name is refused (403 WorkerInviteOnly) unless its owner is
        trusted or an admin; a known worker keeps popping. One read, only
        while the door is closed."""
        modes = await self.get()
        if not modes.closed_to_new_workers:
            return
        if not await self._store.may_register(key_hash=key_hash, name_key=worker_name_key(name)):
            raise new_worker_refusal()


class ModesRoom:
    """GET and PUT /status/modes."""

    def __init__(
        self,
        store: Store,
        signals: Signals,
        snapshot: ModeSnapshot,
        draining: Callable[[], bool],
    ) -> None:
        self._store = store
        self._signals = signals
        self._snapshot = snapshot
        self._draining = draining

    async def show(self, key_hash: str | None) -> tuple[Modes, bool]:
        """The modes and whether raid mode is shown: only to an admin's key
        (the AI Horde's); any other key sent is refused (401 InvalidAPIKey,
        403 NotModerator). A process draining for shutdown takes no new
        connections: shown as maintenance, the nearest AI Horde mode."""
        if key_hash is None:
            modes, shown = await self._snapshot.get(), False
        else:
            modes, shown = await self._store.modes_for(key_hash=key_hash), True
        if self._draining():
            modes = dataclasses.replace(modes, maintenance=True)
        return modes, shown

    async def set(
        self, key_hash: str, body: object, address: str, now: float
    ) -> tuple[dict[str, bool], Modes]:
        """An admin's change: the modes it set (by mode name) and the modes
        after it. Every process sees it within MODES_SECONDS; those sharing
        Redis signals at once."""
        changes = parse_modes_edit(body)
        _, after = await self._store.set_modes(
            key_hash=key_hash, changes=changes, address=address, now=now
        )
        await self._signals.notify_pool()
        self._snapshot.changed(after)
        return changes, after
