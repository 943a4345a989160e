"""The signed URLs a vision worker pops start where the worker can reach the
horde: ``server.public_url``, or what a trusted proxy forwarded, never what
an untrusted client claims.

A real horde, a real url-transport vision worker and real image requests;
the worker's pop carries the headers a proxy (or a client posing as one)
would send.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest

from hordelite.config import Config
from hordelite.testing import FakeChatWorker, TestHorde
from tests.integration._env import open_env
from tests.integration.test_images import (
    LOW_OFFLOAD_BYTES,
    OFFLOADING,
    client_for,
    image_url_of,
    online_vision_worker,
    submit_image_request,
)

pytestmark = pytest.mark.anyio

PUBLIC = "https://horde.example.org/horde"
PROXIED = {"Host": "127.0.0.1:7001", "X-Forwarded-Proto": "https"}


def configured(offload_bytes: int = 0, **server: str) -> Config:
    return Config().replace(
        signals={"url": os.environ.get("HORDELITE_SIGNALS_URL", "")},
        server=server,
        images={"offload_bytes": offload_bytes} if offload_bytes else {},
    )


async def pop_with(worker: FakeChatWorker, headers: dict[str, str]) -> dict[str, Any]:
    r = await worker.client.post("/generate/text/pop", json=worker.pop_body(), headers=headers)
    assert r.status_code == 200, r.text
    job: dict[str, Any] = r.json()
    assert job["id"] is not None, job
    return job


async def popped_url(config: Config, headers: dict[str, str], *, offloaded: bool = False) -> str:
    """The signed URL of one image request's job popped with ``headers``
    (its messages_url when ``offloaded``), checked to fetch the image from
    this horde once its start is the horde's own."""
    async with open_env(config=config) as env, client_for(env.horde) as http:
        transports = OFFLOADING if offloaded else ("url",)
        async with online_vision_worker(env.horde, env.owner, transports) as worker:
            await submit_image_request(env, http)
            job = await pop_with(worker, headers)
            url = job["payload"]["messages_url"] if offloaded else image_url_of(job)
            await assert_signed_by(env.horde, http, url)
            return url


async def assert_signed_by(horde: TestHorde, http: httpx.AsyncClient, url: str) -> None:
    # Only the start differs from the horde's own URL: the signature holds.
    path = url[url.index("/blobs/") :]
    fetched = await http.get(horde.url + path, headers={"Accept-Encoding": "identity"})
    assert fetched.status_code == 200, fetched.text


async def test_public_url_starts_every_image_url_whatever_the_headers() -> None:
    headers = {**PROXIED, "X-Forwarded-Host": "other.example.org"}
    url = await popped_url(
        configured(public_url=PUBLIC + "/", trusted_proxies="127.0.0.1"), headers
    )
    assert url.startswith(PUBLIC + "/blobs/"), url


async def test_public_url_starts_the_offloaded_messages_url() -> None:
    config = configured(LOW_OFFLOAD_BYTES, public_url=PUBLIC)
    url = await popped_url(config, {}, offloaded=True)
    assert url.startswith(PUBLIC + "/blobs/"), url
    assert "-messages?" in url, url


@pytest.mark.parametrize(
    "headers",
    [
        {**PROXIED, "X-Forwarded-Host": "horde.example.org"},
        {"Host": "127.0.0.1:7001", "Forwarded": "for=192.0.2.7;proto=https;host=horde.example.org"},
    ],
    ids=["x-forwarded", "forwarded"],
)
async def test_a_trusted_proxys_forwarded_scheme_and_host_start_the_image_url(
    headers: dict[str, str],
) -> None:
    url = await popped_url(configured(trusted_proxies="127.0.0.1"), headers)
    assert url.startswith("https://horde.example.org/blobs/"), url


async def test_a_trusted_proxys_forwarded_scheme_and_host_start_the_messages_url() -> None:
    config = configured(LOW_OFFLOAD_BYTES, trusted_proxies="127.0.0.1")
    headers = {**PROXIED, "X-Forwarded-Host": "horde.example.org"}
    url = await popped_url(config, headers, offloaded=True)
    assert url.startswith("https://horde.example.org/blobs/"), url


async def test_forwarded_headers_from_an_untrusted_peer_are_ignored() -> None:
    # Guards against believing anyone: a horde that ignored forwarded headers
    # altogether (as before server.trusted_proxies) passes it too.
    headers = {
        "Host": "horde.example.org",
        "X-Forwarded-Proto": "https",
        "X-Forwarded-Host": "evil.example",
        "Forwarded": "proto=https;host=evil.example",
    }
    url = await popped_url(configured(), headers)
    # The connection's own scheme (the test horde speaks plain HTTP) and Host.
    assert url.startswith("http://horde.example.org/blobs/"), url


@pytest.mark.parametrize("host", ["evil.com/x", "a@b", "evil.com x"])
async def test_a_hostile_forwarded_host_from_a_trusted_peer_is_ignored(host: str) -> None:
    headers = {**PROXIED, "X-Forwarded-Host": host}
    url = await popped_url(configured(trusted_proxies="127.0.0.1"), headers)
    # The scheme was fine and is used; the host falls back to Host.
    assert url.startswith("https://127.0.0.1:7001/blobs/"), url
    headers = {"Host": "127.0.0.1:7001", "Forwarded": f'host="{host}"'}
    url = await popped_url(configured(trusted_proxies="127.0.0.1"), headers)
    assert "evil" not in url, url
    assert "@" not in url, url
    assert url.split("/blobs/")[0].endswith("://127.0.0.1:7001"), url
