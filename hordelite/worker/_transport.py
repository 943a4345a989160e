"""An httpx transport whose request bodies a cancellation can interrupt cleanly.

httpx iterates a request body with an async generator. A request cancelled
while its body is being written (the worker cancels its pops at shutdown)
leaves that generator half iterated for the garbage collector, which trio
reports as a ResourceWarning. This transport sends the same bytes through
a plain iterator instead; everything else is httpx's own transport.
"""

from __future__ import annotations

import httpx


class _Once:
    """An async iterator over one chunk (a class, not a generator)."""

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    def __aiter__(self) -> _Once:
        return self

    async def __anext__(self) -> bytes:
        if self._data is None:
            raise StopAsyncIteration
        data, self._data = self._data, None
        return data


class _Body(httpx.AsyncByteStream):
    def __init__(self, data: bytes) -> None:
        self._data = data

    def __aiter__(self) -> _Once:
        return _Once(self._data)


class Transport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport``, with in-memory bodies sent without a generator."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if isinstance(request.stream, httpx.ByteStream):
            request.stream = _Body(request.content)
        return await super().handle_async_request(request)
