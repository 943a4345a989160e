"""Idempotent resubmits of chat requests with images (Idempotency-Key).

A resubmit of a request with the same operation key and the same body
answers the first request's id: it queues nothing, stores no second image
and charges nothing twice. The request's images are taken in at submit
(a ``data:`` URL decoded, an ``http`` URL fetched) and stored under the
request's id, so the resubmit must be recognised from what the client sent,
not from the stored form whose image references name a fresh request id.

Two routes, each with a ``data:`` image, a fetched image and no image (the
control, which never depended on the images):

- ``native``: ``POST /api/v2/generate/chat/async`` with the
  ``Idempotency-Key`` header.
- ``front``: the in-process call the OpenAI front makes,
  ``Horde.queue_chat(api_key, parse_chat_request(body), agent, operation_key)``.
  ``/v1/chat/completions`` itself passes no operation key (its call cannot
  lose an answer on the way back) and ignores a client's ``Idempotency-Key``,
  so the front's path is driven at that call, as a resubmit after a lost
  answer would make it.

Fetched images come from a loopback HTTP server of the test's own
(``[images] fetch_private`` lets the horde reach it); it counts the fetches.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import os
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from PIL import Image

from hordelite.config import Config
from hordelite.contract.chat_request import parse_chat_request
from hordelite.errors import HordeError
from hordelite.testing import TestHorde
from tests.integration._chat_helpers import CHAT_ASYNC, chat_status_path, pop_job, pop_nothing
from tests.integration._env import open_suite_horde
from tests.integration._helpers import closing_answer, loopback_server, request_head
from tests.integration.test_images import (
    MODEL,
    assert_jpeg,
    blob_files,
    client_for,
    image_body,
    image_url_of,
    online_vision_worker,
    png_data_url,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("chat_database")]

ROUTES = ["native", "front"]
SOURCES = ["data", "fetched", "none"]
FRONT_AGENT = "idempotency-test:1:front"
REPLY = {"message": {"role": "assistant", "content": "Red."}, "finish_reason": "stop"}


def png_bytes(colour: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return buffer.getvalue()


# What the loopback server serves, by path.
SERVED = {"/red.png": png_bytes((200, 30, 30)), "/blue.png": png_bytes((30, 30, 200))}


# A loopback image server -------------------------------------------------------------


@dataclasses.dataclass
class ImageServer:
    port: int
    hits: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


async def _serve_one(server: ImageServer, stream: anyio.abc.ByteStream) -> None:
    path, _ = await request_head(stream)
    server.hits[path] += 1
    body = SERVED.get(path)
    if body is None:
        await stream.send(closing_answer("404 Not Found", content_type="text/plain"))
    else:
        await stream.send(closing_answer("200 OK", body))


@pytest.fixture
async def images() -> AsyncIterator[ImageServer]:
    """The loopback image server (a fixture: its task group then does not
    wrap a failing test's error in an exception group)."""
    async with loopback_server(ImageServer, _serve_one) as server:
        yield server


# The horde, its requester and the two routes ------------------------------------------


@dataclasses.dataclass
class Env:
    horde: TestHorde
    http: httpx.AsyncClient
    key: str
    owner: str
    images: ImageServer
    # The blob keys stored (every put, even one deleted again later).
    puts: list[str]

    def body(self, source: str, *, other: bool = False) -> dict[str, Any]:
        """The request body of this image source; ``other`` asks something else
        (another image, or another question for the control)."""
        if source == "data":
            return image_body(png_data_url(32, 32) if other else png_data_url())
        if source == "fetched":
            return image_body(self.images.url("/blue.png" if other else "/red.png"))
        question = "What colour is grass?" if other else "What colour is the sky?"
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 32,
        }

    async def submit(self, route: str, body: dict[str, Any], operation_key: str) -> str:
        """Submit on ``route``; the id answered (fails the test on a refusal)."""
        if route == "native":
            response = await self.http.post(
                CHAT_ASYNC,
                headers={"apikey": self.key, "Idempotency-Key": operation_key},
                json=body,
            )
            assert response.status_code == 202, (
                f"native submit under Idempotency-Key {operation_key!r}: "
                f"{response.status_code} {response.text}"
            )
            return str(response.json()["id"])
        try:
            answer = await self.horde.horde.queue_chat(
                self.key, parse_chat_request(body), FRONT_AGENT, operation_key
            )
        except HordeError as refused:
            # An AssertionError, not pytest.fail: the horde's task group
            # would wrap pytest's BaseException in an exception group.
            raise AssertionError(
                f"front submit under operation key {operation_key!r}: "
                f"{refused.status} {refused.rc.name}: {refused.message}"
            ) from None
        return answer.id

    async def refusal(self, route: str, body: dict[str, Any], operation_key: str) -> str:
        """Submit on ``route`` expecting a refusal; its rc."""
        if route == "native":
            response = await self.http.post(
                CHAT_ASYNC,
                headers={"apikey": self.key, "Idempotency-Key": operation_key},
                json=body,
            )
            assert response.status_code == 409, response.text
            return str(response.json()["rc"])
        with pytest.raises(HordeError) as refused:
            await self.horde.horde.queue_chat(
                self.key, parse_chat_request(body), FRONT_AGENT, operation_key
            )
        assert refused.value.status == 409, refused.value
        return refused.value.rc.name

    async def kudos(self) -> float:
        response = await self.http.get("/api/v2/find_user", headers={"apikey": self.key})
        assert response.status_code == 200, response.text
        return float(response.json()["kudos"])

    async def status(self, request_id: str) -> dict[str, Any]:
        response = await self.http.get(chat_status_path(request_id))
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    async def assert_serves_its_image(self, job: dict[str, Any], request_id: str) -> None:
        """The job carries the request's stored image, still fetchable."""
        url = image_url_of(job)
        assert url.startswith(f"{self.horde.url}/blobs/{request_id}-0?"), url
        fetched = await self.http.get(url)
        assert fetched.status_code == 200, fetched.text
        assert fetched.headers["content-type"] == "image/jpeg"
        assert_jpeg(fetched.content, (64, 48))


@contextlib.asynccontextmanager
async def open_env(images: ImageServer, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    config = Config().replace(
        signals={"url": os.environ.get("HORDELITE_SIGNALS_URL", "")},
        images={"fetch_private": True},
    )
    async with open_suite_horde(config=config) as horde, client_for(horde) as http:
        key = await horde.create_key("alice", kudos=1000)
        owner = await horde.create_key("bob")
        puts: list[str] = []
        store = horde.blobs
        put = store.put

        async def recorded_put(key: str, data: bytes, content_type: str) -> None:
            puts.append(key)
            await put(key, data, content_type)

        monkeypatch.setattr(store, "put", recorded_put)
        yield Env(horde, http, key, owner, images, puts)


def images_of(source: str) -> int:
    return 0 if source == "none" else 1


# The tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("route", ROUTES)
async def test_a_resubmit_with_the_same_key_and_body_answers_the_first_request_and_stores_and_charges_nothing_again(
    route: str, source: str, images: ImageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        open_env(images, monkeypatch) as env,
        online_vision_worker(env.horde, env.owner) as worker,
    ):
        body = env.body(source)
        first = await env.submit(route, body, "op-1")
        stored = blob_files(env.horde)
        assert stored == [f"{first}-{n}" for n in range(images_of(source))]
        fetched = env.images.hits["/red.png"]
        assert fetched == (1 if source == "fetched" else 0)
        kudos = await env.kudos()
        puts = len(env.puts)

        again = await env.submit(route, body, "op-1")

        assert again == first
        assert env.puts[puts:] == [], "the resubmit stored images of its own"
        assert blob_files(env.horde) == stored, "the blobs changed at the resubmit"
        assert env.images.hits["/red.png"] == fetched, "the resubmit fetched its image again"
        assert await env.kudos() == kudos

        # One request in the queue, the first, whole: its image is still there.
        job = await pop_job(worker)
        if source != "none":
            await env.assert_serves_its_image(job, first)
        await pop_nothing(worker)
        response = await worker.submit_reply(job, REPLY)
        assert response.status_code == 200, response.text
        status = await env.status(first)
        assert status["done"], status
        charged = status["kudos"]
        assert charged > 0
        assert await env.kudos() == pytest.approx(kudos - charged)

        # Once it has ended, the same resubmit still answers it, for nothing.
        assert await env.submit(route, body, "op-1") == first
        await pop_nothing(worker)
        assert await env.kudos() == pytest.approx(kudos - charged)
        assert blob_files(env.horde) == stored
        assert env.puts[puts:] == []


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("route", ROUTES)
async def test_a_different_request_under_a_used_key_is_refused_keeping_the_first_and_nothing_else(
    route: str, source: str, images: ImageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Recognising a resubmit must still tell another image (or question) apart.
    async with (
        open_env(images, monkeypatch) as env,
        online_vision_worker(env.horde, env.owner) as worker,
    ):
        first = await env.submit(route, env.body(source), "op-1")
        stored = blob_files(env.horde)
        kudos = await env.kudos()

        assert (
            await env.refusal(route, env.body(source, other=True), "op-1") == "OperationKeyReused"
        )

        assert blob_files(env.horde) == stored
        assert await env.kudos() == kudos
        job = await pop_job(worker)
        if source != "none":
            await env.assert_serves_its_image(job, first)
        await pop_nothing(worker)


@pytest.mark.parametrize("route", ROUTES)
async def test_a_resubmit_under_a_new_key_is_a_second_request_with_its_own_image(
    route: str, images: ImageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same image under another key is another request: it keeps its own copy.
    async with open_env(images, monkeypatch) as env, online_vision_worker(env.horde, env.owner):
        body = env.body("data")
        first = await env.submit(route, body, "op-1")
        second = await env.submit(route, body, "op-2")
        assert second != first
        assert blob_files(env.horde) == sorted([f"{first}-0", f"{second}-0"])
