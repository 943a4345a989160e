"""S3Store against a real S3-compatible server: moto's server mode, started
here as a subprocess on a free port (``moto_server`` of the test extra)."""

from __future__ import annotations

import calendar
import datetime
import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from hordelite.blobs import S3Store, _s3
from hordelite.blobs import _sigv4 as sigv4
from hordelite.config import Config
from hordelite.contract.signing import BlobKeyError
from hordelite.testing import FakeChatWorker, open_horde
from tests.integration.test_images import (
    MODEL,
    VISION,
    assert_jpeg,
    image_body,
    image_url_of,
    png_data_url,
)

pytestmark = pytest.mark.anyio

IMAGE = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 40
ACCESS_KEY = "hordelite-test"
SECRET_KEY = "hordelite-test-secret"
_buckets = itertools.count()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    binary = Path(sys.executable).parent / "moto_server"
    # Part of the test extra: missing, the suite fails rather than skip the store.
    assert binary.exists(), "moto_server is missing: pip install -e '.[test]'"
    port = _free_port()
    process = subprocess.Popen(
        [str(binary), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        # Ready when it answers: a start takes a second or two.
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(endpoint + "/moto-api/", timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        process.terminate()
        process.wait(timeout=10)


def _bucket() -> str:
    # A bucket per test: no test sees another's objects.
    return f"hordelite-{os.getpid()}-{next(_buckets)}"


@pytest.fixture
async def store(s3_endpoint: str) -> AsyncIterator[S3Store]:
    opened = await S3Store.open(s3_endpoint, _bucket(), "us-east-1", ACCESS_KEY, SECRET_KEY)
    try:
        yield opened
    finally:
        await opened.aclose()


def s3_config(endpoint: str) -> Config:
    return Config().replace(
        signals={"url": os.environ.get("HORDELITE_SIGNALS_URL", "")},
        blobs={
            "s3_endpoint": endpoint,
            "s3_bucket": _bucket(),
            "s3_access_key": ACCESS_KEY,
            "s3_secret_key": SECRET_KEY,
        },
    )


async def test_a_put_blob_comes_back_with_its_content_type(store: S3Store) -> None:
    await store.put("img1", IMAGE, "image/jpeg")
    await store.put("req1-messages", b'{"a": 1}', "application/json")
    found = await store.get("img1")
    assert found is not None
    assert (found.data, found.content_type) == (IMAGE, "image/jpeg")
    found = await store.get("req1-messages")
    assert found is not None
    assert (found.data, found.content_type) == (b'{"a": 1}', "application/json")
    assert await store.get("img2") is None


async def test_a_put_replaces_the_blob(store: S3Store) -> None:
    await store.put("img1", IMAGE, "image/jpeg")
    await store.put("img1", b"other", "image/png")
    found = await store.get("img1")
    assert found is not None
    assert (found.data, found.content_type) == (b"other", "image/png")


async def test_exists_says_whether_a_blob_is_stored(store: S3Store) -> None:
    assert not await store.exists("img1")
    await store.put("img1", IMAGE, "image/jpeg")
    assert await store.exists("img1")


async def test_delete_removes_the_blobs_and_skips_a_missing_key(store: S3Store) -> None:
    await store.put("img1", IMAGE, "image/jpeg")
    await store.put("img2", IMAGE, "image/jpeg")
    await store.delete(["img1", "never-stored"])
    assert await store.get("img1") is None
    assert await store.get("img2") is not None


async def test_delete_prefixed_removes_a_requests_blobs_only(store: S3Store) -> None:
    for key in ["req1-0", "req1-1", "req1-messages", "req10-0", "req2-0", "req1"]:
        await store.put(key, IMAGE, "image/jpeg")
    await store.delete_prefixed(["req1"])
    for gone in ["req1-0", "req1-1", "req1-messages"]:
        assert await store.get(gone) is None, gone
    # "req10-0" starts with "req1" but is not "req1-...": another request's.
    for kept in ["req10-0", "req2-0", "req1"]:
        assert await store.get(kept) is not None, kept


async def test_delete_prefixed_keeps_an_object_the_horde_did_not_put(
    store: S3Store, s3_endpoint: str
) -> None:
    await store.put("req1-0", IMAGE, "image/jpeg")
    # Put by someone else (moto checks no signature): a key no store makes.
    async with httpx.AsyncClient() as client:
        put = await client.put(f"{s3_endpoint}/{store.bucket}/req1-notes.txt", content=b"x")
    assert put.status_code == 200
    await store.delete_prefixed(["req1"])
    assert await store.get("req1-0") is None
    path = f"/{store.bucket}/req1-notes.txt"
    headers = sigv4.sign_headers(
        method="GET",
        host=httpx.URL(s3_endpoint).netloc.decode(),
        path=path,
        query={},
        headers={},
        payload=b"",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        region="us-east-1",
        now=datetime.datetime.now(datetime.UTC),
    )
    async with httpx.AsyncClient() as client:
        kept = await client.get(s3_endpoint + path, headers=headers)
    assert (kept.status_code, kept.content) == (200, b"x")


async def test_delete_prefixed_lists_past_one_page(
    store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pages of 3 keys: 7 keys of the request take three ListObjectsV2 pages.
    monkeypatch.setattr(_s3, "_LIST_PAGE", 3)
    keys = [f"req1-{n}" for n in range(7)]
    for key in keys:
        await store.put(key, b"x", "image/jpeg")
    await store.delete_prefixed(["req1"])
    for key in keys:
        assert await store.get(key) is None, key


async def test_a_bad_key_is_refused_before_any_request(store: S3Store) -> None:
    for bad in ["../img", "a/b", "a.b", ""]:
        with pytest.raises(BlobKeyError):
            await store.put(bad, IMAGE, "image/jpeg")
        with pytest.raises(BlobKeyError):
            await store.get(bad)
        with pytest.raises(BlobKeyError):
            store.signed_url(bad, time.time() + 60, "http://horde.example")


async def test_a_presigned_url_serves_the_blob_from_the_object_store(
    store: S3Store, s3_endpoint: str
) -> None:
    await store.put("img1", IMAGE, "image/jpeg")
    expires_at = time.time() + 120
    url = store.signed_url("img1", expires_at, "http://horde.example")
    # The object store's URL, path-style; the horde's base URL is not in it.
    assert url.startswith(f"{s3_endpoint}/{store.bucket}/img1?"), url
    params = httpx.URL(url).params
    signed_at = calendar.timegm(time.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    assert signed_at + int(params["X-Amz-Expires"]) == int(expires_at)
    async with httpx.AsyncClient() as client:
        response = await client.get(url)
    assert response.status_code == 200
    assert response.content == IMAGE
    assert response.headers["content-type"] == "image/jpeg"


async def test_an_expired_presigned_url_states_a_past_expiry(store: S3Store) -> None:
    await store.put("img1", IMAGE, "image/jpeg")
    expires_at = time.time() - 1
    params = httpx.URL(store.signed_url("img1", expires_at, "http://horde.example")).params
    signed_at = calendar.timegm(time.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    # Signed a second before its expiry, which has passed: S3 refuses it.
    assert signed_at + int(params["X-Amz-Expires"]) == int(expires_at) < time.time()
    # moto's server does not check a presigned URL's expiry (nor its
    # signature): it serves this URL, so the refusal itself is not asserted.


async def test_a_presigned_url_lives_seven_days_at_most(store: S3Store) -> None:
    url = store.signed_url("img1", time.time() + 30 * 24 * 3600, "http://horde.example")
    assert httpx.URL(url).params["X-Amz-Expires"] == str(7 * 24 * 3600)


async def test_a_worker_fetches_a_submitted_image_from_the_object_store(s3_endpoint: str) -> None:
    config = s3_config(s3_endpoint)
    async with open_horde(config=config) as horde, httpx.AsyncClient(timeout=30) as http:
        assert isinstance(horde.blobs, S3Store)
        key = await horde.create_key("alice", kudos=100)
        owner = await horde.create_key("bob")
        async with FakeChatWorker(
            horde.url, owner, model_id=MODEL, chat_features=VISION, image_transports=("url",)
        ) as worker:
            assert (await worker.pop())["id"] is None  # online, declared
            submitted = await http.post(
                horde.url + "/api/v2/generate/chat/async",
                headers={"apikey": key},
                json=image_body(png_data_url()),
            )
            assert submitted.status_code == 202, submitted.text
            with anyio.fail_after(10):
                job = await worker.pop(wait=10)
            url = image_url_of(job)
            prefix = f"{s3_endpoint}/{config.blobs.s3_bucket}/{submitted.json()['id']}-"
            assert url.startswith(prefix), url
            fetched = await http.get(url)
            assert fetched.status_code == 200, fetched.text
            assert fetched.headers["content-type"] == "image/jpeg"
            assert_jpeg(fetched.content, (64, 48))
            # The horde serves no blob route of its own with an object store.
            own = await http.get(horde.url + "/blobs/" + url.split("/")[-1].split("?")[0])
            assert own.status_code == 404
