"""``GET /blobs/<key>``: a blob fetched by its signed, expiring URL.

Outside /api/v2: a worker follows the URL a pop handed it, with no API key;
the signature (hordelite.contract.signing) is the authorisation.
"""

from __future__ import annotations

import gzip

import anyio.to_thread

from hordelite.blobs import DirectoryStore
from hordelite.clock import Clock
from hordelite.errors import RC, HordeError
from hordelite.http.answer import Answer
from hordelite.http.request import Request

# Compression level of a gzip answer: most of level 9's gain on JSON at a
# fraction of its time (a 36 MiB offloaded request is compressed per fetch).
_GZIP_LEVEL = 6


class BlobRoutes:
    def __init__(self, store: DirectoryStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    async def blob(self, request: Request) -> Answer:
        key = request.params["key"]
        now = self.clock.now()
        expires = request.arg("expires") or ""
        why = self.store.refusal(key, expires, request.arg("sig") or "", now)
        if why is not None:
            raise HordeError(RC.BlobURLInvalid, why)
        found = await self.store.get(key)
        if found is None:
            raise HordeError(RC.BlobNotFound)
        headers = [
            ("content-type", found.content_type),
            # Private: the URL is a credential. A cache may keep the blob
            # for as long as the URL stays valid, no longer.
            ("Cache-Control", f"private, max-age={max(0, int(expires) - int(now))}"),
        ]
        data = found.data
        if _is_json(found.content_type):
            # An offloaded chat request is JSON: gzip shrinks it several
            # times for a worker that accepts it.
            headers.append(("Vary", "Accept-Encoding"))
            if request.accepts("gzip"):
                data = await anyio.to_thread.run_sync(_gzip, data)
                headers.append(("Content-Encoding", "gzip"))
        return Answer(200, headers, data)


def _is_json(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=_GZIP_LEVEL, mtime=0)
