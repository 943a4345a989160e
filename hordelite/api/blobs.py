"""``GET /blobs/<key>``: a blob fetched by its signed, expiring URL.

Outside /api/v2: a worker follows the URL a pop handed it, with no API key;
the signature (hordelite.contract.signing) is the authorisation.
"""

from __future__ import annotations

import gzip

import anyio.to_thread
from quart import Blueprint, Response, current_app, request

from hordelite._request import horde
from hordelite.blobs import DirectoryStore
from hordelite.contract.signing import BLOB_ROUTE
from hordelite.errors import RC, HordeError

blobs = Blueprint("blobs", __name__)

# Compression level of a gzip answer: most of level 9's gain on JSON at a
# fraction of its time (a 36 MiB offloaded request is compressed per fetch).
_GZIP_LEVEL = 6


def _store() -> DirectoryStore:
    return current_app.config["BLOBS"]  # type: ignore[no-any-return]


def _is_json(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


@blobs.get(f"{BLOB_ROUTE}/<key>")
async def blob(key: str) -> Response:
    now = horde().clock.now()
    expires = request.args.get("expires", "")
    why = _store().refusal(key, expires, request.args.get("sig", ""), now)
    if why is not None:
        raise HordeError(RC.BlobURLInvalid, why)
    found = await _store().get(key)
    if found is None:
        raise HordeError(RC.BlobNotFound)
    headers = {
        # Private: the URL is a credential. A cache may keep the blob for
        # as long as the URL stays valid, no longer.
        "Cache-Control": f"private, max-age={max(0, int(expires) - int(now))}",
    }
    data = found.data
    if _is_json(found.content_type):
        # An offloaded chat request is JSON: gzip shrinks it several times
        # for a worker that accepts it.
        headers["Vary"] = "Accept-Encoding"
        if request.accept_encodings["gzip"] > 0:
            data = await anyio.to_thread.run_sync(_gzip, data)
            headers["Content-Encoding"] = "gzip"
    return Response(data, status=200, content_type=found.content_type, headers=headers)


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=_GZIP_LEVEL, mtime=0)
