"""What every room of the horde shares: the configuration, storage, signals,
clock, model reference, blob store, metrics and caches of one horde, and
the few steps each room takes the same way."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread

from hordelite.blobs import BlobStore
from hordelite.clock import Clock
from hordelite.config import Config
from hordelite.contract.eligibility import RequestView
from hordelite.contract.models import ModelReference
from hordelite.horde.addresses import AddressRules
from hordelite.horde.caches import (
    FilterSnapshot,
    MessageSnapshot,
    PoolSnapshot,
    SkippedSample,
    StatusCache,
)
from hordelite.horde.metrics import HordeMetrics
from hordelite.horde.modes import ModeSnapshot
from hordelite.signals import Signals
from hordelite.storage.store import Store

P = ParamSpec("P")
T = TypeVar("T")


class Nudge:
    """A wake-up for one task that also looks on its own from time to time:
    ``arm`` before it looks, then wait on the event armed; a ``set`` since
    the arming wakes it, and one before it is not lost (it looked after)."""

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def arm(self) -> anyio.Event:
        self._event = anyio.Event()
        return self._event

    def set(self) -> None:
        if self._event is not None:
            self._event.set()


@dataclasses.dataclass
class HordeCore:
    """The state of one horde, shared by its rooms: what
    hordelite.horde.service opens it with, and the caches over its store
    and signals, built here. ``stopping`` is set once, by
    ``Upkeep.begin_shutdown``."""

    config: Config
    store: Store
    signals: Signals
    clock: Clock
    models: ModelReference
    # Where images taken in at submit are kept; without one, a request with
    # an image is refused.
    blobs: BlobStore | None
    # Counters only on the hot paths; /metrics reads the rest (decision 0043).
    metrics: HordeMetrics = dataclasses.field(default_factory=HordeMetrics)
    pool: PoolSnapshot = dataclasses.field(init=False)
    statuses: StatusCache = dataclasses.field(init=False)
    skipped: SkippedSample = dataclasses.field(init=False)
    messages: MessageSnapshot = dataclasses.field(init=False)
    # The horde's modes (hordelite.horde.modes): what requests and pops check.
    modes: ModeSnapshot = dataclasses.field(init=False)
    # The timeouts and blocks by address in force: every submit and pop
    # checks its client against them.
    addresses: AddressRules = dataclasses.field(init=False)
    filters: FilterSnapshot = dataclasses.field(init=False)
    stopping: bool = False
    # A request ended in this process: its webhook may be owed now.
    webhooks_due: Nudge = dataclasses.field(default_factory=Nudge)
    # When the drain's answers are due (anyio's clock), once stopping: the
    # server cancels what is still open at its grace period's end.
    drain_deadline: float = float("inf")

    def __post_init__(self) -> None:
        store, signals = self.store, self.signals
        self.pool = PoolSnapshot(store, signals)
        self.statuses = StatusCache()
        self.skipped = SkippedSample(store)
        self.messages = MessageSnapshot(store, signals)
        self.modes = ModeSnapshot(store, signals, self.config)
        self.addresses = AddressRules(store, self.clock)
        self.filters = FilterSnapshot(store)
        self.metrics.watch_signals(signals)

    @property
    def shared(self) -> bool:
        """Other processes serve this horde (Redis signals): a worker's
        submit may still reach one of them while this one drains."""
        return bool(self.config.signals.url)

    async def queue_changed(self, request: RequestView | None = None) -> None:
        """Wake the pops that may take ``request`` (any pop: None), and let
        the next empty pop count ``skipped`` over the queue as it is now."""
        self.skipped.stale()
        await self.signals.notify_queue(request)


async def run_pure(heavy: bool, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Pure CPU work (no I/O, no shared state): on the event loop when light,
    in a worker thread when ``heavy``, so that the loop keeps serving while
    it runs. Never inside a transaction: the caller holds no lock."""
    if not heavy:
        return fn(*args, **kwargs)
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
