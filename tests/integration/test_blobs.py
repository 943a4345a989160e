"""GET /blobs/<key>: blobs served by their signed, expiring URLs."""

from __future__ import annotations

import gzip
import json
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from hordelite.testing import open_horde

pytestmark = pytest.mark.anyio

IMAGE = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 40


def with_query(url: str, query: str) -> str:
    return urlunsplit(urlsplit(url)._replace(query=query))


async def test_a_signed_url_serves_the_blob_with_its_content_type() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        await horde.blobs.put("img1", IMAGE, "image/jpeg")
        url = horde.blobs.signed_url("img1", horde.horde.clock.now() + 120, horde.url)
        response = await client.get(url)
        assert response.status_code == 200
        assert response.content == IMAGE
        assert response.headers["content-type"] == "image/jpeg"
        cache = response.headers["cache-control"]
        assert cache.startswith("private, max-age=")
        assert 0 < int(cache.rsplit("=", 1)[1]) <= 120
        assert "content-encoding" not in response.headers


async def test_an_expired_url_is_403() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        await horde.blobs.put("img1", IMAGE, "image/jpeg")
        url = horde.blobs.signed_url("img1", horde.horde.clock.now() - 1, horde.url)
        response = await client.get(url)
        assert response.status_code == 403
        assert response.json() == {"message": "This blob URL has expired.", "rc": "BlobURLInvalid"}


async def test_an_altered_url_is_403() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        await horde.blobs.put("img1", IMAGE, "image/jpeg")
        await horde.blobs.put("img2", b"other", "image/jpeg")
        expires_at = horde.horde.clock.now() + 120
        url = horde.blobs.signed_url("img1", expires_at, horde.url)
        parts = urlsplit(url)
        query = dict(p.split("=", 1) for p in parts.query.split("&"))
        altered = [
            url.replace("/img1?", "/img2?"),
            with_query(url, f"expires={int(query['expires']) + 3600}&sig={query['sig']}"),
            with_query(url, f"expires={query['expires']}&sig={query['sig'][::-1]}"),
            with_query(url, f"expires={query['expires']}&sig={query['sig'][:-2]}"),
            with_query(url, f"expires={query['expires']}"),
            with_query(url, ""),
        ]
        for bad in altered:
            response = await client.get(bad)
            assert response.status_code == 403, bad
            body = response.json()
            assert body["rc"] == "BlobURLInvalid"
            assert set(body) == {"message", "rc"}


async def test_a_valid_url_of_a_blob_no_longer_stored_is_404() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        await horde.blobs.put("img1", IMAGE, "image/jpeg")
        url = horde.blobs.signed_url("img1", horde.horde.clock.now() + 120, horde.url)
        await horde.blobs.delete(["img1"])
        response = await client.get(url)
        assert response.status_code == 404
        assert response.json() == {"message": "No blob with this key.", "rc": "BlobNotFound"}


async def test_a_json_blob_is_gzipped_for_a_client_that_accepts_gzip_only() -> None:
    messages = json.dumps([{"role": "user", "content": "hello " * 2000}]).encode()
    async with open_horde() as horde:
        await horde.blobs.put("req1", messages, "application/json")
        url = horde.blobs.signed_url("req1", horde.horde.clock.now() + 120, horde.url)
        # httpx would decode a gzip answer itself: read the raw bytes.
        async with httpx.AsyncClient() as client:
            request = client.build_request("GET", url, headers={"Accept-Encoding": "gzip"})
            response = await client.send(request, stream=True)
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
            await response.aclose()
            assert response.status_code == 200
            assert response.headers["content-encoding"] == "gzip"
            assert response.headers["content-type"] == "application/json"
            assert len(raw) < len(messages)
            assert gzip.decompress(raw) == messages

            request = client.build_request("GET", url, headers={"Accept-Encoding": "identity"})
            response = await client.send(request, stream=True)
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
            await response.aclose()
            assert response.status_code == 200
            assert "content-encoding" not in response.headers
            assert raw == messages


async def test_a_non_json_blob_is_never_gzipped() -> None:
    async with open_horde() as horde, httpx.AsyncClient() as client:
        await horde.blobs.put("img1", IMAGE, "image/jpeg")
        url = horde.blobs.signed_url("img1", horde.horde.clock.now() + 120, horde.url)
        response = await client.get(url, headers={"Accept-Encoding": "gzip"})
        assert response.status_code == 200
        assert "content-encoding" not in response.headers
        assert response.content == IMAGE
