"""What every blob store offers the horde."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Blob:
    data: bytes
    content_type: str


class BlobStore(Protocol):
    """Keys are chosen by the caller and checked by the store
    (hordelite.contract.signing.check_key): a bad key raises BlobKeyError."""

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        """Store ``data`` under ``key``, replacing what was there."""
        ...

    async def get(self, key: str) -> Blob | None:
        """The blob, or None when there is none under ``key``."""
        ...

    async def exists(self, key: str) -> bool:
        """Whether a blob is under ``key`` (its data not read)."""
        ...

    async def delete(self, keys: Iterable[str]) -> None:
        """Remove these blobs; a key with no blob is skipped."""
        ...

    async def delete_prefixed(self, prefixes: Iterable[str]) -> None:
        """Remove every blob whose key starts with one of ``prefixes`` and
        ``-`` (the blobs of a request, keyed ``<request id>-<n>``)."""
        ...

    def signed_url(self, key: str, expires_at: float, base_url: str) -> str:
        """A URL a worker can fetch the blob from until ``expires_at``."""
        ...
