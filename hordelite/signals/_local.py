from __future__ import annotations

from typing import Protocol

import anyio


class Signals(Protocol):
    def queue_waiter(self) -> anyio.Event:
        """An event set at the next change of the queue.

        Take it before reading the queue, then wait on it: a change between
        the read and the wait is not missed.
        """
        ...

    def notify_queue(self) -> None: ...

    def request_waiter(self, request_id: str) -> anyio.Event:
        """An event set when the request gets a generation or ends."""
        ...

    def notify_request(self, request_id: str) -> None: ...


class LocalSignals:
    """Signals within one process: one broadcast event per generation."""

    def __init__(self) -> None:
        self._queue: anyio.Event | None = None
        self._requests: dict[str, anyio.Event] = {}

    def queue_waiter(self) -> anyio.Event:
        if self._queue is None:
            self._queue = anyio.Event()
        return self._queue

    def notify_queue(self) -> None:
        event, self._queue = self._queue, None
        if event is not None:
            event.set()

    def request_waiter(self, request_id: str) -> anyio.Event:
        event = self._requests.get(request_id)
        if event is None:
            event = self._requests[request_id] = anyio.Event()
        return event

    def notify_request(self, request_id: str) -> None:
        event = self._requests.pop(request_id, None)
        if event is not None:
            event.set()
