"""What the horde keeps in memory between requests, each entry invalidated
by the change that makes it wrong (decision 0038): the online pool, the
statuses by request version, the sample an empty pop counts ``skipped``
over, the active messages to workers, and the compiled prompt filters."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import NamedTuple

import anyio

from hordelite.contract.chat_reply import output_estimate_chars
from hordelite.contract.eligibility import RequestView, WorkerView
from hordelite.contract.filters import FilterSet, Rule, compile_regex
from hordelite.contract.limits import (
    FILTERS_CHECK_SECONDS,
    MAX_ACTIVE_MESSAGES,
    MESSAGES_PER_POP,
    MESSAGES_SECONDS,
    POOL_SNAPSHOT_SECONDS,
    SKIPPED_SAMPLE_SECONDS,
    STATUS_CACHE_BYTES,
    STATUS_CACHE_ENTRIES,
    STATUS_POSITION_SECONDS,
)
from hordelite.errors import HordeError
from hordelite.horde.results import RequestStatus
from hordelite.signals import Signals
from hordelite.storage.filters import FilterRecord
from hordelite.storage.messages import MessageRecord
from hordelite.storage.pool import OnlineWorker
from hordelite.storage.store import Store


class PoolSnapshot:
    """The online workers, read at most POOL_SNAPSHOT_SECONDS ago and under
    the current pool version (decision 0038): a worker joining, coming back,
    declaring anew or changed by its owner bumps the version, so only what
    a worker's own jobs change (its measured speed) can be that old. A
    worker whose check-in ends leaves the snapshot at its ``until``."""

    def __init__(self, store: Store, signals: Signals) -> None:
        self._store = store
        self._signals = signals
        self._lock = anyio.Lock()
        self._workers: list[OnlineWorker] = []
        self._read_at = -math.inf
        self._version = -1

    def _current(self) -> bool:
        fresh = anyio.current_time() - self._read_at < POOL_SNAPSHOT_SECONDS
        return fresh and self._version == self._signals.pool_version()

    async def get(self, now: float) -> list[WorkerView]:
        """The workers online at ``now`` (a read only when the snapshot is not current)."""
        if not self._current():
            async with self._lock:  # one read for every caller that needs a fresh one
                if not self._current():
                    version = self._signals.pool_version()  # before the read, as for statuses
                    self._workers = await self._store.online_pool(now=now)
                    self._read_at = anyio.current_time()
                    self._version = version
        return [w.view for w in self._workers if w.until > now]


class StatusKey(NamedTuple):
    """What a status read asks for, and what its answer is cached under:
    the request's kind ("text" or "chat") and canonical id, whether the
    queue position is read (``with_position``) and whether the free
    eligible threads are counted (``with_free_threads``)."""

    kind: str
    request_id: str
    with_position: bool = True
    with_free_threads: bool = False


class StatusCache:
    """Statuses as last read, each under its request's version (decision 0038).

    An entry answers while the version is the one it was read under and, for
    a request still waiting for a worker (its position, wait time and
    is_possible move with the rest of the queue), for STATUS_POSITION_SECONDS
    at most. The least recently read entries go past STATUS_CACHE_ENTRIES,
    or past STATUS_CACHE_BYTES of generations; a status holding more than
    an eighth of those is not kept (decision 0069).
    """

    def __init__(self, max_bytes: int = STATUS_CACHE_BYTES) -> None:
        self._entries: OrderedDict[StatusKey, tuple[int, float, RequestStatus, int]] = OrderedDict()
        self._max_bytes = max_bytes
        self.bytes = 0  # of generations the entries hold

    def get(self, key: StatusKey, version: int, now: float) -> RequestStatus | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] != version or now >= entry[1]:
            return None
        self._entries.move_to_end(key)
        return entry[2]

    def put(self, key: StatusKey, version: int, now: float, status: RequestStatus) -> None:
        until = now + STATUS_POSITION_SECONDS if _moves_with_queue(status) else math.inf
        self._drop(key)
        size = _generation_chars(status)
        if size > self._max_bytes // 8:
            return
        self._entries[key] = (version, until, status, size)
        self.bytes += size
        while len(self._entries) > STATUS_CACHE_ENTRIES or self.bytes > self._max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: StatusKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry[3]


def _generation_chars(status: RequestStatus) -> int:
    """What a status's generations weigh: their characters (text, and a
    chat reply's content, reasoning and calls), a byte or more each."""
    size = 0
    for g in status.generations:
        size += len(g.text or "")
        if g.reply is not None:
            size += output_estimate_chars(g.reply)
    return size


def _moves_with_queue(status: RequestStatus) -> bool:
    """Whether parts of this status follow other requests and the pool, not
    only its own request: while it waits for a worker to take a job."""
    return not (status.done or status.faulted) and status.waiting > 0


class SkippedSample:
    """The waiting requests an empty pop counts ``skipped`` over, read at most
    SKIPPED_SAMPLE_SECONDS ago (the counts are advice to the worker's owner;
    reading and decoding them cost an empty pop most of its time)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = anyio.Lock()
        self._sample: list[RequestView] = []
        self._read_at = -math.inf

    def stale(self) -> None:
        self._read_at = -math.inf

    async def get(self) -> list[RequestView]:
        async with self._lock:  # one read for every pop that needs a fresh one
            if anyio.current_time() - self._read_at > SKIPPED_SAMPLE_SECONDS:
                self._sample = await self._store.skipped_sample()
                self._read_at = anyio.current_time()
            return self._sample


class MessageSnapshot:
    """The active messages to workers, by worker, read at most
    MESSAGES_SECONDS ago and under the current pool version: sending or
    deleting a message bumps the version (in every process sharing the
    signals), so a pop carries a new message from its next read. Only an
    expiry can be that old, and an expired message is never handed out."""

    def __init__(self, store: Store, signals: Signals) -> None:
        self._store = store
        self._signals = signals
        self._lock = anyio.Lock()
        self._by_worker: dict[str, list[MessageRecord]] = {}
        self._read_at = -math.inf
        self._version = -1

    def _current(self) -> bool:
        fresh = anyio.current_time() - self._read_at < MESSAGES_SECONDS
        return fresh and self._version == self._signals.pool_version()

    async def of(self, worker_id: str, now: float) -> list[MessageRecord]:
        """The worker's active messages, newest first, at most MESSAGES_PER_POP."""
        if not self._current():
            async with self._lock:
                if not self._current():
                    version = self._signals.pool_version()
                    found = await self._store.active_messages(now=now, limit=MAX_ACTIVE_MESSAGES)
                    by_worker: dict[str, list[MessageRecord]] = {}
                    for m in found:
                        by_worker.setdefault(m.worker_id, []).append(m)
                    self._by_worker = by_worker
                    self._read_at = anyio.current_time()
                    self._version = version
        mine = self._by_worker.get(worker_id, ())
        return [m for m in mine if m.expires > now][:MESSAGES_PER_POP]


class FilterSnapshot:
    """The prompt filters, compiled once per change (docs/reference/filters.md).

    Served while read at most FILTERS_CHECK_SECONDS ago; past that, the
    next screen reads the filters' revision (one row) and reads and
    compiles the filters again only when it moved: a filter changed in
    another process or replica applies here within FILTERS_CHECK_SECONDS,
    and a screen never reads the rules themselves. A change made in this
    process applies at once (``stale``). A stored rule RE2 no longer
    compiles (written by a newer release) is left out, not fatal.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = anyio.Lock()
        self._set = FilterSet(())
        self._revision = -1
        self._checked_at = -math.inf

    def stale(self) -> None:
        self._checked_at = -math.inf

    async def get(self) -> FilterSet:
        if anyio.current_time() - self._checked_at >= FILTERS_CHECK_SECONDS:
            async with self._lock:  # one check for every screen that needs one
                if anyio.current_time() - self._checked_at >= FILTERS_CHECK_SECONDS:
                    await self._refresh()
        return self._set

    async def _refresh(self) -> None:
        checked_at = anyio.current_time()
        if await self._store.filter_revision() != self._revision:
            found = await self._store.every_filter()
            self._set = FilterSet(compiled_rules(found.records))
            self._revision = found.revision
        self._checked_at = checked_at


def compiled_rules(records: tuple[FilterRecord, ...]) -> list[Rule]:
    """The stored rules compiled, less any RE2 no longer compiles."""
    rules = []
    for r in records:
        try:
            program = compile_regex(r.regex)
        except HordeError:
            continue
        rules.append(Rule(r.id, r.filter_type, r.action, r.replacement, program))
    return rules
