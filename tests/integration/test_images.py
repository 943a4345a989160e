"""Images taken in at submit, stored as JPEG, handed out by the worker's transport.

Real Pillow on images the tests make, the real blob store of the test horde,
the official openai package for the front.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import io
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import openai
import pytest
from PIL import Image

from hordelite.blobs import DirectoryStore
from hordelite.config import Config
from hordelite.contract.limits import MESSAGES_URL_SECONDS, MIN_IMAGE_URL_SECONDS
from hordelite.testing import FakeChatWorker, ManualClock, TestHorde
from tests.integration import _env
from tests.integration._env import Env, open_env

pytestmark = pytest.mark.anyio

MODEL = "fake-vision-model"
VISION = ("prompt_overflow_refused", "vision")


def png_data_url(width: int = 64, height: int = 48, mode: str = "RGBA") -> str:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), (200, 30, 30, 128)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_body(url: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What colour is this?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ],
        "max_tokens": 32,
    }


@contextlib.asynccontextmanager
async def online_vision_worker(
    horde: TestHorde, owner: str, transports: tuple[str, ...] = ("url",)
) -> AsyncIterator[FakeChatWorker]:
    """A vision worker for MODEL taking images by ``transports``, declared by
    a first pop that finds nothing."""
    async with FakeChatWorker(
        horde.url, owner, model_id=MODEL, chat_features=VISION, image_transports=transports
    ) as worker:
        assert (await worker.pop())["id"] is None  # online, declared
        yield worker


def client_for(horde: TestHorde) -> httpx.AsyncClient:
    return _env.client_for(horde, timeout=30)


def sdk_of(env: Env, http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    """The OpenAI SDK as the requester, over ``http``, without retries."""
    return openai.AsyncOpenAI(
        base_url=env.horde.url + "/v1", api_key=env.requester, max_retries=0, http_client=http
    )


def image_url_of(job: dict[str, Any]) -> str:
    [part] = [
        p
        for m in job["payload"]["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]
    return str(part["image_url"]["url"])


def blob_files(horde: TestHorde) -> list[str]:
    assert isinstance(horde.blobs, DirectoryStore)
    kept = {"signing.secret", ".gitignore"}  # the store's own, no blob
    return sorted(p.name for p in horde.blobs.directory.iterdir() if p.name not in kept)


def assert_jpeg(data: bytes, size: tuple[int, int]) -> None:
    image = Image.open(io.BytesIO(data))
    assert (image.format, image.mode, image.size) == ("JPEG", "RGB", size)


@pytest.mark.parametrize("transport", ["url", "base64"])
async def test_an_openai_image_reaches_a_vision_worker_by_its_transport(transport: str) -> None:
    clock = ManualClock()
    async with (
        open_env(clock=clock) as env,
        client_for(env.horde) as http,
    ):
        async with (
            online_vision_worker(env.horde, env.owner, (transport,)) as worker,
            sdk_of(env, http) as sdk,
        ):
            answers: list[Any] = []

            async def call() -> None:
                answers.append(await sdk.chat.completions.create(**image_body(png_data_url())))

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    job = await worker.pop(wait=10)
                    url = image_url_of(job)
                    if transport == "url":
                        # A signed URL of this horde, valid for the job's TTL
                        # and at least MIN_IMAGE_URL_SECONDS.
                        assert url.startswith(env.horde.url + "/blobs/"), url
                        expires = int(httpx.URL(url).params["expires"])
                        assert expires >= clock.now() + MIN_IMAGE_URL_SECONDS - 1
                        fetched = await http.get(url)
                        assert fetched.status_code == 200, fetched.text
                        assert fetched.headers["content-type"] == "image/jpeg"
                        assert_jpeg(fetched.content, (64, 48))
                    else:
                        prefix = "data:image/jpeg;base64,"
                        assert url.startswith(prefix), url[:40]
                        assert_jpeg(base64.b64decode(url[len(prefix) :]), (64, 48))
                    reply = {"message": {"role": "assistant", "content": "Red."}}
                    r = await worker.submit_reply(job, {**reply, "finish_reason": "stop"})
                    assert r.status_code == 200, r.text
            assert answers[0].choices[0].message.content == "Red."


async def test_the_stored_request_keeps_a_reference_not_the_image() -> None:
    async with (
        open_env() as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner):
            big = png_data_url(1500, 1500, "RGB")
            r = await http.post(
                "/api/v2/generate/chat/async",
                headers={"apikey": env.requester},
                json=image_body(big),
            )
            assert r.status_code == 202, r.text
            request_id = r.json()["id"]
            [stored] = blob_files(env.horde)
            assert stored.startswith(request_id + "-")

            def stored_chat(conn: Any) -> str:
                from sqlalchemy import select

                from hordelite.storage.schema import requests

                row = conn.execute(select(requests.c.chat).where(requests.c.id == request_id))
                return str(row.scalar_one())

            chat = await env.horde.horde.db.read(stored_chat)
            assert "base64" not in chat
            assert "hordelite-blob:" in chat
            assert big[-40:] not in chat  # none of the image bytes


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("data:image/png;base64," + base64.b64encode(b"not an image at all").decode(), "image"),
        ("http://127.0.0.1:9/cat.png", "127.0.0.1"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
    ],
    ids=["not-an-image", "loopback", "metadata"],
)
async def test_a_bad_image_is_refused_naming_its_part_and_nothing_is_kept(
    url: str, reason: str
) -> None:
    async with (
        open_env() as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner) as worker:
            before = (await http.get("/api/v2/find_user", headers={"apikey": env.requester})).json()
            r = await http.post(
                "/api/v2/generate/chat/async",
                headers={"apikey": env.requester},
                json=image_body(url),
            )
            assert r.status_code == 400, r.text
            body = r.json()
            assert body["rc"] == "ChatRequestInvalid"
            assert "messages[0].content[1].image_url" in body["message"]
            assert reason in body["message"]
            assert blob_files(env.horde) == []
            assert (await worker.pop())["id"] is None  # nothing queued
            after = (await http.get("/api/v2/find_user", headers={"apikey": env.requester})).json()
            assert after["kudos"] == before["kudos"]


async def test_the_openai_front_refuses_an_image_no_vision_worker_can_take() -> None:
    async with (
        open_env() as env,
        client_for(env.horde) as http,
    ):
        async with (
            FakeChatWorker(env.horde.url, env.owner, model_id=MODEL) as worker,  # no vision
            sdk_of(env, http) as sdk,
        ):
            assert (await worker.pop())["id"] is None
            with pytest.raises(openai.APIStatusError) as refused:
                await sdk.chat.completions.create(**image_body(png_data_url()))
            # The worker serves the model but declares no vision: the call is
            # refused (its request cancelled; its image goes with the request
            # at the end of the retention, as the purge test shows).
            assert refused.value.status_code == 404
            assert "declares what this request needs" in str(refused.value)


async def test_a_purged_request_takes_its_images_with_it() -> None:
    clock = ManualClock()
    async with (
        open_env(clock=clock, retention=60) as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner) as worker:
            r = await http.post(
                "/api/v2/generate/chat/async",
                headers={"apikey": env.requester},
                json=image_body(png_data_url()),
            )
            assert r.status_code == 202, r.text
            assert len(blob_files(env.horde)) == 1
            assert await worker.serve_one(wait=0) is not None
            clock.advance(61)
            await env.horde.sweep()
            assert blob_files(env.horde) == []


async def test_a_native_image_request_waits_for_a_vision_worker() -> None:
    async with (
        open_env() as env,
        client_for(env.horde) as http,
    ):
        async with FakeChatWorker(env.horde.url, env.owner, model_id=MODEL, name="plain") as plain:
            assert (await plain.pop())["id"] is None  # serves the model, no vision
            r = await http.post(
                "/api/v2/generate/chat/async",
                headers={"apikey": env.requester},
                json=image_body(png_data_url()),
            )
            assert r.status_code == 202, r.text
            assert r.json()["warnings"][0]["code"] == "NoAvailableWorker"
            assert (await plain.pop())["id"] is None  # never handed to it
            assert len(blob_files(env.horde)) == 1
            async with FakeChatWorker(
                env.horde.url,
                env.owner,
                model_id=MODEL,
                name="seeing",
                chat_features=VISION,
                image_transports=("url",),
            ) as seeing:
                job = await seeing.pop()
                assert image_url_of(job).startswith(env.horde.url + "/blobs/")


# Messages offload ------------------------------------------------------------------

# Below the messages of one small image request, images inlined (about 1 KB).
LOW_OFFLOAD_BYTES = 200
OFFLOADING = ("url", "messages_url")


def offloading(offload_bytes: int) -> Config:
    return Config().replace(
        signals={"url": os.environ.get("HORDELITE_SIGNALS_URL", "")},
        images={"offload_bytes": offload_bytes},
    )


async def submit_image_request(env: Env, http: httpx.AsyncClient) -> str:
    r = await http.post(
        "/api/v2/generate/chat/async",
        headers={"apikey": env.requester},
        json=image_body(png_data_url()),
    )
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def assert_inlined_messages(messages: Any) -> None:
    """The request's messages, its image a JPEG data URL of the stored image."""
    [message] = messages
    assert message["role"] == "user"
    text, image = message["content"]
    assert text == {"type": "text", "text": "What colour is this?"}
    prefix = "data:image/jpeg;base64,"
    url = image["image_url"]["url"]
    assert url.startswith(prefix), url[:40]
    assert_jpeg(base64.b64decode(url[len(prefix) :]), (64, 48))


async def test_a_messages_url_worker_fetches_the_offloaded_messages_plain_or_gzipped() -> None:
    clock = ManualClock()
    async with (
        open_env(config=offloading(LOW_OFFLOAD_BYTES), clock=clock) as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner, OFFLOADING) as worker:
            request_id = await submit_image_request(env, http)
            job = await worker.pop()
            payload = job["payload"]
            assert "messages" not in payload
            url = payload["messages_url"]
            assert url.startswith(f"{env.horde.url}/blobs/{request_id}-messages?"), url
            assert int(httpx.URL(url).params["expires"]) == int(clock.now() + MESSAGES_URL_SECONDS)

            plain = await http.get(url, headers={"Accept-Encoding": "identity"})
            assert plain.status_code == 200, plain.text
            assert plain.headers["content-type"] == "application/json"
            assert "content-encoding" not in plain.headers
            assert_inlined_messages(json.loads(plain.content))

            async with http.stream("GET", url, headers={"Accept-Encoding": "gzip"}) as zipped:
                assert zipped.status_code == 200
                assert zipped.headers["content-encoding"] == "gzip"
                raw = b"".join([chunk async for chunk in zipped.aiter_raw()])
            assert gzip.decompress(raw) == plain.content

            # Valid 120 s, checked against the horde's clock.
            assert MESSAGES_URL_SECONDS == 120
            clock.advance(MESSAGES_URL_SECONDS + 1)
            expired = await http.get(url, headers={"Accept-Encoding": "identity"})
            assert expired.status_code == 403
            assert expired.json()["rc"] == "BlobURLInvalid"


async def test_a_worker_without_messages_url_receives_an_offloaded_request_inline() -> None:
    async with (
        open_env(config=offloading(LOW_OFFLOAD_BYTES)) as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner, ("base64",)) as worker:
            await submit_image_request(env, http)
            job = await worker.pop()
            assert "messages_url" not in job["payload"]
            assert_inlined_messages(job["payload"]["messages"])


async def test_a_request_under_the_threshold_is_not_offloaded() -> None:
    async with (
        open_env(config=offloading(64 * 1024)) as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner, OFFLOADING) as worker:
            request_id = await submit_image_request(env, http)
            job = await worker.pop()
            assert "messages_url" not in job["payload"]
            assert image_url_of(job).startswith(f"{env.horde.url}/blobs/{request_id}-0?")
            assert blob_files(env.horde) == [f"{request_id}-0"]  # no messages stored
