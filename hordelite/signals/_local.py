from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import anyio

from hordelite.contract.eligibility import RequestView, WorkerView, can_serve


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

    def notify_all_requests(self) -> None:
        """Wake every waiter of every request (the process is stopping)."""
        events, self._requests = self._requests, {}
        for event in events.values():
            event.set()
