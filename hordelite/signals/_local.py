from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

import anyio

from hordelite.contract.eligibility import RequestView, WorkerView, can_serve
from hordelite.contract.progress import Lease

# How long an ended job's marker (404 ChatJobAborted) and an ended request's
# progress stream are kept, in seconds of the horde's clock.
ENDED_MARKER_SECONDS = 600.0
STREAM_RETENTION_SECONDS = 120.0


class ProgressEntry(dict[str, Any]):
    """One accepted post: gen, seq, content, reasoning_content, worker, model."""


class QueueWaiter:
    """A pop waiting for work: woken by a queue change it may be able to take."""

    def __init__(self, worker: WorkerView | None) -> None:
        # None: the worker's declaration is not known yet; any change wakes it.
        self.worker = worker
        self.event = anyio.Event()


class Signals(Protocol):
    def queue_waiter(self, worker: WorkerView | None) -> AbstractContextManager[QueueWaiter]:
        """Register a waiting pop for the duration of the block."""
        ...

    def notify_queue(self, request: RequestView | None = None) -> None:
        """A job became available: for ``request``, or (None) for anyone."""
        ...

    def request_waiter(self, request_id: str) -> anyio.Event:
        """An event set when the request gets a generation or ends."""
        ...

    def notify_request(self, request_id: str) -> None: ...

    def notify_all_requests(self) -> None: ...

    # Progress leases and streams (streamed jobs) ---------------------------

    def put_lease(self, lease: Lease) -> None: ...

    def lease(self, job_id: str) -> Lease | None: ...

    def ended(self, job_id: str) -> bool:
        """Whether the job had a lease that has ended (404 ChatJobAborted)."""
        ...

    def end_lease(self, job_id: str, now: float) -> Lease | None: ...

    def request_leases(self, request_id: str) -> list[Lease]: ...

    def lease_ends(self) -> dict[str, float]:
        """Every live lease's end, by job id (the sweep honours them)."""
        ...

    def append_progress(self, request_id: str, entry: ProgressEntry) -> None: ...

    def read_progress(self, request_id: str, position: int) -> list[ProgressEntry]: ...

    def progress_waiter(self, request_id: str) -> anyio.Event:
        """Set at the next progress entry of the request, or when it gets a
        generation or ends."""
        ...

    def sweep_progress(self, now: float, ended_requests: list[str]) -> None: ...


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
        self._requests: dict[str, anyio.Event] = {}
        self._leases: dict[str, Lease] = {}
        self._ended: dict[str, float] = {}  # job id -> when its marker goes
        self._streams: dict[str, list[ProgressEntry]] = {}
        self._stream_events: dict[str, anyio.Event] = {}
        self._stream_ends: dict[str, float] = {}  # request id -> when it goes

    @contextmanager
    def queue_waiter(self, worker: WorkerView | None) -> Iterator[QueueWaiter]:
        waiter = QueueWaiter(worker)
        self._waiters.append(waiter)
        try:
            yield waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def notify_queue(self, request: RequestView | None = None) -> None:
        for waiter in list(self._waiters):
            if request is None or waiter.worker is None or can_serve(waiter.worker, request):
                self._waiters.remove(waiter)
                waiter.event.set()
                if request is not None and waiter.worker is not None:
                    return

    def request_waiter(self, request_id: str) -> anyio.Event:
        event = self._requests.get(request_id)
        if event is None:
            event = self._requests[request_id] = anyio.Event()
        return event

    def notify_request(self, request_id: str) -> None:
        event = self._requests.pop(request_id, None)
        if event is not None:
            event.set()
        self._wake_stream(request_id)

    def notify_all_requests(self) -> None:
        """Wake every waiter of every request (the process is stopping)."""
        events, self._requests = self._requests, {}
        for event in events.values():
            event.set()

    # Progress ------------------------------------------------------------

    def put_lease(self, lease: Lease) -> None:
        self._leases[lease.job_id] = lease

    def lease(self, job_id: str) -> Lease | None:
        return self._leases.get(job_id)

    def ended(self, job_id: str) -> bool:
        return job_id in self._ended

    def end_lease(self, job_id: str, now: float) -> Lease | None:
        lease = self._leases.pop(job_id, None)
        if lease is not None:
            self._ended[job_id] = now + ENDED_MARKER_SECONDS
        return lease

    def request_leases(self, request_id: str) -> list[Lease]:
        return [lease for lease in self._leases.values() if lease.request_id == request_id]

    def lease_ends(self) -> dict[str, float]:
        return {job_id: lease.expires for job_id, lease in self._leases.items()}

    def append_progress(self, request_id: str, entry: ProgressEntry) -> None:
        self._streams.setdefault(request_id, []).append(entry)
        self._wake_stream(request_id)

    def read_progress(self, request_id: str, position: int) -> list[ProgressEntry]:
        return self._streams.get(request_id, [])[position:]

    def progress_waiter(self, request_id: str) -> anyio.Event:
        event = self._stream_events.get(request_id)
        if event is None:
            event = self._stream_events[request_id] = anyio.Event()
        return event

    def _wake_stream(self, request_id: str) -> None:
        event = self._stream_events.pop(request_id, None)
        if event is not None:
            event.set()

    def sweep_progress(self, now: float, ended_requests: list[str]) -> None:
        """Forget what ended: leases past their end, old markers, the streams
        of requests ended a while ago (so memory stays bounded)."""
        for request_id in ended_requests:
            self._stream_ends.setdefault(request_id, now + STREAM_RETENTION_SECONDS)
        for job_id, lease in list(self._leases.items()):
            if lease.expires < now:
                self.end_lease(job_id, now)
        for job_id, until in list(self._ended.items()):
            if until < now:
                del self._ended[job_id]
        for request_id, until in list(self._stream_ends.items()):
            if until < now:
                del self._stream_ends[request_id]
                self._streams.pop(request_id, None)
