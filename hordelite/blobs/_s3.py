"""Blobs as objects of one bucket of an S3-compatible object store.

Requests are path-style (``{endpoint}/{bucket}/{key}``), so any S3-compatible
server works without wildcard DNS, and signed with AWS Signature Version 4
(hordelite.blobs._sigv4). A worker fetches a blob from the object store
itself, by a presigned URL: the horde serves no blob bytes.
"""

from __future__ import annotations

import datetime
import math
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from urllib.parse import quote

import httpx

from hordelite.blobs import _sigv4 as sigv4
from hordelite.blobs._store import Blob
from hordelite.contract import signing
from hordelite.errors import StorageUnavailable

# Keys a ListObjectsV2 page holds at most (S3's own cap).
_LIST_PAGE = 1000
_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
# An object store that does not answer within this is taken as down.
_TIMEOUT = 30.0


class S3Error(StorageUnavailable):
    """The object store refused a request or could not be reached: answered
    503, like the database being down (the client may try again)."""


def _text(element: ET.Element, name: str) -> str | None:
    # S3 answers in its namespace; some compatible servers answer without.
    found = element.find(f"{_S3_NS}{name}")
    if found is None:
        found = element.find(name)
    return None if found is None else (found.text or "")


class S3Store:
    """A BlobStore of objects in ``bucket`` at ``endpoint`` (see the module)."""

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        region: str,
        access_key: str,
        secret_key: str,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        url = httpx.URL(endpoint.rstrip("/"))
        self.endpoint = str(url)
        self.bucket = bucket
        self.region = region
        self._host = url.netloc.decode("ascii")
        self._origin = f"{url.scheme}://{self._host}"
        self._base_path = url.path.rstrip("/")
        self._access_key = access_key
        self._secret_key = secret_key
        self._client = client or httpx.AsyncClient(timeout=_TIMEOUT)

    @classmethod
    async def open(
        cls, endpoint: str, bucket: str, region: str, access_key: str, secret_key: str
    ) -> S3Store:
        """The store of ``bucket``, created if missing."""
        store = cls(endpoint, bucket, region, access_key, secret_key)
        try:
            await store.create_bucket()
        except BaseException:
            await store.aclose()
            raise
        return store

    async def aclose(self) -> None:
        await self._client.aclose()

    def _path(self, key: str | None) -> str:
        bucket = f"{self._base_path}/{self.bucket}"
        return bucket if key is None else f"{bucket}/{signing.check_key(key)}"

    async def _send(
        self,
        method: str,
        key: str | None,
        *,
        query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
        ok: tuple[int, ...] = (200,),
    ) -> httpx.Response:
        path = self._path(key)
        query = dict(query or {})
        signed = sigv4.sign_headers(
            method=method,
            host=self._host,
            path=path,
            query=query,
            headers=dict(headers or {}),
            payload=body,
            access_key=self._access_key,
            secret_key=self._secret_key,
            region=self.region,
            now=datetime.datetime.now(datetime.UTC),
        )
        # The query as signed: encoded here, not re-encoded by httpx.
        url = f"{self._origin}{quote(path, safe='/-_.~')}"
        if query:
            url += "?" + sigv4.canonical_query(query)
        try:
            response = await self._client.request(method, url, headers=signed, content=body)
        except httpx.HTTPError as exc:
            raise S3Error(f"{method} {path}: the object store did not answer: {exc}") from exc
        if response.status_code not in ok:
            raise S3Error(
                f"{method} {path}: the object store answered {response.status_code}: "
                f"{response.text[:300]}"
            )
        return response

    async def create_bucket(self) -> None:
        """Create the bucket unless it exists."""
        response = await self._send("HEAD", None, ok=(200, 404))
        if response.status_code == 200:
            return
        body = b""
        if self.region != "us-east-1":
            # S3 places a bucket in us-east-1 unless told otherwise.
            body = (
                '<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                f"<LocationConstraint>{self.region}</LocationConstraint>"
                "</CreateBucketConfiguration>"
            ).encode()
        # 409: another process created it in the meantime.
        await self._send("PUT", None, body=body, ok=(200, 409))

    async def put(self, key: str, data: bytes, content_type: str) -> None:
        signing.check_content_type(content_type)
        await self._send("PUT", key, headers={"content-type": content_type}, body=data)

    async def get(self, key: str) -> Blob | None:
        response = await self._send("GET", key, ok=(200, 404))
        if response.status_code == 404:
            return None
        return Blob(response.content, response.headers.get("content-type", ""))

    async def exists(self, key: str) -> bool:
        response = await self._send("HEAD", key, ok=(200, 404))
        return response.status_code == 200

    async def delete(self, keys: Iterable[str]) -> None:
        checked = [signing.check_key(key) for key in keys]
        for key in checked:
            # S3 answers 204 also for a key with no object.
            await self._send("DELETE", key, ok=(200, 204, 404))

    async def _list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": prefix, "max-keys": str(_LIST_PAGE)}
            if token is not None:
                query["continuation-token"] = token
            response = await self._send("GET", None, query=query)
            root = ET.fromstring(response.content)
            for contents in [*root.iter(f"{_S3_NS}Contents"), *root.iter("Contents")]:
                key = _text(contents, "Key")
                if key is not None:
                    keys.append(key)
            token = _text(root, "NextContinuationToken")
            if _text(root, "IsTruncated") != "true" or not token:
                return keys

    async def delete_prefixed(self, prefixes: Iterable[str]) -> None:
        checked = [signing.check_key(prefix) for prefix in prefixes]
        for prefix in checked:
            # A key no store of hordelite makes was not put by the horde: kept.
            listed = await self._list(f"{prefix}-")
            await self.delete([key for key in listed if signing.is_key(key)])

    def signed_url(self, key: str, expires_at: float, base_url: str) -> str:
        """A presigned GET of the object until ``expires_at`` (``base_url``,
        the horde's, is not used: the URL is the object store's).

        Signed now, for the seconds left; an ``expires_at`` already past is
        signed as of a second before it, so the URL is refused as expired.
        At most sigv4.MAX_PRESIGN_SECONDS, the longest S3 accepts.
        """
        path = self._path(key)
        expires = int(expires_at)
        signed_at = min(math.floor(time.time()), expires - 1)
        expires_in = min(expires - signed_at, sigv4.MAX_PRESIGN_SECONDS)
        query = sigv4.presign_query(
            method="GET",
            host=self._host,
            path=path,
            access_key=self._access_key,
            secret_key=self._secret_key,
            region=self.region,
            now=datetime.datetime.fromtimestamp(signed_at, datetime.UTC),
            expires_in=expires_in,
        )
        return f"{self._origin}{path}?{query}"
