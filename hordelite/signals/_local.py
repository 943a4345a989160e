from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import anyio

from hordelite.contract.eligibility import RequestView, WorkerView, can_serve
from hordelite.contract.limits import (
    ENDED_MARKER_SECONDS,
    REQUEST_VERSIONS,
    STREAM_RETENTION_SECONDS,
)
from hordelite.contract.progress import Lease


class ProgressEntry(dict[str, Any]):
    """One accepted post: gen, seq, content, reasoning_content, worker, model."""


class QueueWaiter:
    """A pop waiting for work: woken by a queue change it may be able to take."""

    def __init__(self, worker: WorkerView | None) -> None:
        # None: the worker's declaration is not known yet; any change wakes it.
        self.worker = worker
        self.event = anyio.Event()


class _Shared:
    """One event for every waiter of a key, and how many hold it."""

    __slots__ = ("event", "holders")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.holders = 0


class _Wakeups:
    """Events by key, shared by the waiters of that key.

    An event is forgotten when it is set or when its last holder leaves: a
    waiter that stops waiting without being woken (its answer came from a
    status read, its client left) leaves nothing behind.
    """

    def __init__(self) -> None:
        self._events: dict[str, _Shared] = {}

    @contextmanager
    def hold(self, key: str) -> Iterator[anyio.Event]:
        shared = self._events.get(key)
        if shared is None:
            shared = self._events[key] = _Shared()
        shared.holders += 1
        try:
            yield shared.event
        finally:
            shared.holders -= 1
            if shared.holders == 0 and self._events.get(key) is shared:
                del self._events[key]

    def wake(self, key: str) -> None:
        shared = self._events.pop(key, None)
        if shared is not None:
            shared.event.set()

    def wake_all(self) -> None:
        events, self._events = self._events, {}
        for shared in events.values():
            shared.event.set()

    def __len__(self) -> int:
        return len(self._events)


class Signals(Protocol):
    @property
    def degraded(self) -> bool:
        """Signals may be lost now (Redis is down): waiters poll, every
        DEGRADED_POLL_SECONDS, instead of waiting for a signal."""
        ...

    def queue_waiter(self, worker: WorkerView | None) -> AbstractContextManager[QueueWaiter]:
        """Register a waiting pop for the duration of the block."""
        ...

    async def notify_queue(self, request: RequestView | None = None) -> None:
        """A job became available: for ``request``, or (None) for anyone."""
        ...

    def request_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        """An event set when the request gets a generation or ends, held for
        the duration of the block (take it before reading the status)."""
        ...

    async def notify_request(self, request_id: str) -> None:
        """The request got a generation or ended: wake its waiters and
        streams, and bump its version (``touch_request``)."""
        ...

    async def touch_request(self, request_id: str) -> None:
        """The request's status changed (a job handed out or given back, a
        generation, an end): bump its version and wake its status
        long-polls. Call it after the change is committed."""
        ...

    async def request_version(self, request_id: str) -> int:
        """A number that changes whenever the request's status may have: a
        status cached under one version is current while the version is."""
        ...

    def status_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        """An event set at the request's next change (``touch_request``),
        held for the duration of the block (take it before reading)."""
        ...

    def notify_all_requests(self) -> None: ...

    async def notify_pool(self) -> None:
        """A worker came online, changed its declaration, or left: bump the
        pool version (call it after the change is committed)."""
        ...

    def pool_version(self) -> int:
        """A number that changes whenever the pool of online workers changes
        other than by time passing (a snapshot read under it is current)."""
        ...

    # Progress leases and streams (streamed jobs) ---------------------------

    async def put_lease(self, lease: Lease) -> None: ...

    async def save_lease(self, lease: Lease) -> None:
        """Write back a lease changed after ``lease`` read it (a post
        accepted, a cancel)."""
        ...

    async def lease(self, job_id: str) -> Lease | None: ...

    async def ended(self, job_id: str) -> bool:
        """Whether the job had a lease that has ended (404 ChatJobAborted)."""
        ...

    async def end_lease(self, job_id: str, now: float) -> Lease | None: ...

    async def request_leases(self, request_id: str) -> list[Lease]: ...

    async def lease_ends(self) -> dict[str, float]:
        """Every live lease's end, by job id (the sweep honours them)."""
        ...

    async def append_progress(self, request_id: str, entry: ProgressEntry) -> None: ...

    async def read_progress(self, request_id: str, position: int) -> list[ProgressEntry]: ...

    def progress_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        """Set at the next progress entry of the request, or when it gets a
        generation or ends; held for the duration of the block."""
        ...

    async def end_stream(self, request_id: str, now: float) -> None:
        """The request ended: its progress stream goes after the retention."""
        ...

    async def sweep_progress(self, now: float, ended_requests: list[str]) -> None: ...

    def statistics(self) -> dict[str, int]:
        """How much the backend holds, by kind (for tests and monitoring)."""
        ...


class LocalSignals:
    """Signals within one process.

    A new job wakes only the longest-waiting pop whose worker can serve it,
    not every waiting pop: with many long-polling workers, one submit costs
    one pop transaction, not one per worker. Register the waiter before
    reading the queue, so that a job queued between the read and the wait is
    not missed.
    """

    def __init__(self) -> None:
        self._waiters: list[QueueWaiter] = []
        self._requests = _Wakeups()
        self._leases: dict[str, Lease] = {}
        self._request_jobs: dict[str, set[str]] = {}  # request id -> its leased jobs
        self._ended: dict[str, float] = {}  # job id -> when its marker goes
        self._streams: dict[str, list[ProgressEntry]] = {}
        self._stream_events = _Wakeups()
        self._stream_ends: dict[str, float] = {}  # request id -> when its stream goes
        self._status_events = _Wakeups()
        # Versions come from one counter, so no two changes share one. Of the
        # requests changed last, REQUEST_VERSIONS keep theirs; any other reads
        # the highest version dropped, which differs from every version a
        # status was cached under since that request's last change: a dropped
        # version can cost a read, never serve a stale status.
        self._versions: OrderedDict[str, int] = OrderedDict()
        self._counter = itertools.count(1)
        self._floor = 0
        self._pool_version = 0

    @property
    def degraded(self) -> bool:
        return False  # in-process signals are never lost

    @contextmanager
    def queue_waiter(self, worker: WorkerView | None) -> Iterator[QueueWaiter]:
        waiter = QueueWaiter(worker)
        self._waiters.append(waiter)
        try:
            yield waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    async def notify_queue(self, request: RequestView | None = None) -> None:
        self.wake_pops(request)

    def wake_pops(self, request: RequestView | None) -> None:
        """notify_queue within this process."""
        for waiter in list(self._waiters):
            if request is None or waiter.worker is None or can_serve(waiter.worker, request):
                self._waiters.remove(waiter)
                waiter.event.set()
                if request is not None and waiter.worker is not None:
                    return

    def request_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        return self._requests.hold(request_id)

    async def notify_request(self, request_id: str) -> None:
        self.wake_request(request_id)

    def wake_request(self, request_id: str) -> None:
        """notify_request within this process (the Redis backend calls it
        for a change made by any process)."""
        self.touch_locally(request_id)
        self._requests.wake(request_id)
        self._stream_events.wake(request_id)

    async def touch_request(self, request_id: str) -> None:
        self.touch_locally(request_id)

    def touch_locally(self, request_id: str) -> None:
        """touch_request within this process."""
        versions = self._versions
        versions[request_id] = next(self._counter)
        versions.move_to_end(request_id)
        if len(versions) > REQUEST_VERSIONS:
            _, dropped = versions.popitem(last=False)
            self._floor = max(self._floor, dropped)
        self._status_events.wake(request_id)

    async def request_version(self, request_id: str) -> int:
        return self._versions.get(request_id, self._floor)

    def forget_versions(self) -> None:
        """Every request's version changes: changes may have gone unheard
        (the Redis backend, after signals were lost)."""
        self._versions.clear()
        self._floor = next(self._counter)

    def status_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        return self._status_events.hold(request_id)

    async def notify_pool(self) -> None:
        self.pool_changed_locally()

    def pool_changed_locally(self) -> None:
        self._pool_version += 1

    def pool_version(self) -> int:
        return self._pool_version

    def notify_all_requests(self) -> None:
        """Wake every waiter of this process: each waiting pop, call,
        stream and status read (the process is stopping)."""
        self.wake_pops(None)
        self._requests.wake_all()
        self._stream_events.wake_all()
        self._status_events.wake_all()

    # Progress ------------------------------------------------------------

    async def save_lease(self, lease: Lease) -> None:
        pass  # the lease is this process's own object: nothing to write back

    async def put_lease(self, lease: Lease) -> None:
        self._leases[lease.job_id] = lease
        self._request_jobs.setdefault(lease.request_id, set()).add(lease.job_id)
        # A new attempt of a request that is still waiting: its stream lives on.
        self._stream_ends.pop(lease.request_id, None)

    async def lease(self, job_id: str) -> Lease | None:
        return self._leases.get(job_id)

    async def ended(self, job_id: str) -> bool:
        return job_id in self._ended

    async def end_lease(self, job_id: str, now: float) -> Lease | None:
        """End a job's lease (submit, fault, expiry). When it was the last
        lease of its request, nothing more is appended to the request's
        stream: the stream goes after the retention, unless the request is
        popped again (``put_lease``)."""
        lease = self._leases.pop(job_id, None)
        if lease is None:
            return None
        self._ended[job_id] = now + ENDED_MARKER_SECONDS
        jobs = self._request_jobs.get(lease.request_id)
        if jobs is not None:
            jobs.discard(job_id)
            if not jobs:
                del self._request_jobs[lease.request_id]
                await self.end_stream(lease.request_id, now)
        return lease

    async def request_leases(self, request_id: str) -> list[Lease]:
        return [self._leases[job_id] for job_id in self._request_jobs.get(request_id, ())]

    async def lease_ends(self) -> dict[str, float]:
        return {job_id: lease.expires for job_id, lease in self._leases.items()}

    async def append_progress(self, request_id: str, entry: ProgressEntry) -> None:
        self._streams.setdefault(request_id, []).append(entry)
        self.wake_stream(request_id)

    def wake_stream(self, request_id: str) -> None:
        """Wake this process's readers of the request's progress stream."""
        self._stream_events.wake(request_id)

    async def read_progress(self, request_id: str, position: int) -> list[ProgressEntry]:
        return self._streams.get(request_id, [])[position:]

    def progress_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        return self._stream_events.hold(request_id)

    async def end_stream(self, request_id: str, now: float) -> None:
        # Kept a while, not dropped at once: a reader a little behind (the
        # front's relay between two reads) still gets the last entries
        # before it reconciles with the reply.
        if request_id in self._streams:
            self._stream_ends.setdefault(request_id, now + STREAM_RETENTION_SECONDS)

    async def sweep_progress(self, now: float, ended_requests: list[str]) -> None:
        """Forget what ended: leases past their end, old markers, the streams
        of requests ended a while ago (so memory stays bounded)."""
        for request_id in ended_requests:
            await self.end_stream(request_id, now)
        for job_id, lease in list(self._leases.items()):
            if lease.expires < now:
                await self.end_lease(job_id, now)
        for job_id, until in list(self._ended.items()):
            if until < now:
                del self._ended[job_id]
        for request_id, until in list(self._stream_ends.items()):
            if until < now:
                del self._stream_ends[request_id]
                self._streams.pop(request_id, None)

    def statistics(self) -> dict[str, int]:
        return {
            "queue_waiters": len(self._waiters),
            "request_waiters": len(self._requests),
            "status_waiters": len(self._status_events),
            "leases": len(self._leases),
            "leased_requests": len(self._request_jobs),
            "ended_markers": len(self._ended),
            "streams": len(self._streams),
            "stream_entries": sum(len(entries) for entries in self._streams.values()),
            "stream_waiters": len(self._stream_events),
            "ending_streams": len(self._stream_ends),
        }
