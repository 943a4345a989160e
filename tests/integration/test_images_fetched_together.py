"""A request's image URLs are fetched together: several at once, within one
deadline for the whole request, a few at a time per request and per process.

A real horde (fetch_private on) and a loopback image server of the test's
own whose answers wait on what the server has seen, never on time:

- ``/together/<n>.png`` waits until ``gate`` such requests are waiting at
  once, then answers every one of them; the server keeps the most it saw
  waiting. Fetched one after another, the first of a request's images
  would wait for the others and never be answered.
- ``/image.png`` answers at once.
- ``/hung/<n>`` never answers; the server counts those that arrive and
  those the horde closes.
- ``/bad`` answers 404 once every hung request expected has arrived (they
  are in flight when it fails).

The deadline (``request_images.IMAGE_FETCH_DEADLINE``) and the caps are
set per test, so that a test failing on its deadline ends in seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from PIL import Image

from hordelite.config import Config
from hordelite.contract.chat_request import parse_chat_request
from hordelite.contract.limits import IMAGE_FETCHES_PER_REQUEST
from hordelite.horde import request_images
from hordelite.horde import requests as horde_requests
from hordelite.testing import TestHorde, open_horde
from tests.integration._helpers import closing_answer, loopback_server, request_head
from tests.integration.test_images import (
    MODEL,
    blob_files,
    client_for,
    online_vision_worker,
    png_data_url,
)

pytestmark = pytest.mark.anyio

CHAT_ASYNC = "/api/v2/generate/chat/async"
# Ample for fetches from loopback; a test that fails on it ends this soon.
TEST_DEADLINE = 5.0
# How long a test waits for the image server to see what the horde did (a
# guard against a hang: it is never reached when the test passes).
OBSERVED_WITHIN = 10.0


def png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


PNG = png_bytes()


@dataclasses.dataclass
class ImageServer:
    port: int
    # /together/ requests are answered once this many are waiting at once.
    gate: int = 1
    waiting: int = 0
    most_waiting: int = 0
    released: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    answered: int = 0
    # /hung/ requests: /bad answers once this many have arrived.
    hung_expected: int = 0
    hung: int = 0
    hung_closed: int = 0
    all_hung: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    all_hung_closed: anyio.Event = dataclasses.field(default_factory=anyio.Event)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def together(self) -> None:
        """Wait until ``gate`` requests wait at once. A request stops
        counting as waiting before its answer is sent, so that the count
        never includes one the horde may already have finished with."""
        self.waiting += 1
        self.most_waiting = max(self.most_waiting, self.waiting)
        release = self.released
        if self.waiting >= self.gate:
            release.set()
            self.released = anyio.Event()  # the next cohort's
        await release.wait()
        self.waiting -= 1

    async def hang(self, stream: anyio.abc.ByteStream) -> None:
        """Never answer; count the request, and count it closed when the
        horde closes its connection."""
        self.hung += 1
        if self.hung == self.hung_expected:
            self.all_hung.set()
        try:
            while True:
                await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            self.hung_closed += 1
            if self.hung_closed == self.hung_expected:
                self.all_hung_closed.set()


async def _serve_one(server: ImageServer, stream: anyio.abc.ByteStream) -> None:
    path, _ = await request_head(stream)
    if path.startswith("/hung/"):
        await server.hang(stream)
        return
    if path.startswith("/together/"):
        await server.together()
    elif path == "/bad":
        await server.all_hung.wait()
        await stream.send(closing_answer("404 Not Found"))
        return
    await stream.send(closing_answer("200 OK", PNG))
    server.answered += 1


@pytest.fixture
async def images() -> AsyncIterator[ImageServer]:
    """The loopback image server (a fixture: its task group then does not
    wrap a failing test's error in an exception group)."""
    async with loopback_server(ImageServer, _serve_one) as server:
        yield server


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_images, "IMAGE_FETCH_DEADLINE", TEST_DEADLINE)


@contextlib.asynccontextmanager
async def image_horde() -> AsyncIterator[tuple[TestHorde, httpx.AsyncClient, str]]:
    """A horde that fetches from loopback, a vision worker online (a request
    no worker could take is not queued), and a requester's key."""
    config = Config().replace(images={"fetch_private": True})
    async with open_horde(config=config) as horde, client_for(horde) as http:
        key = await horde.create_key("alice", kudos=1000)
        async with online_vision_worker(horde, await horde.create_key("bob")):
            yield horde, http, key


def body_of(urls: list[str]) -> dict[str, Any]:
    """One user message: a text part, then an image part per URL (the
    image at ``urls[k]`` is ``messages[0].content[k + 1]``)."""
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Which?"}, *parts]}],
        "max_tokens": 32,
    }


def part(k: int) -> str:
    return f"messages[0].content[{k + 1}].image_url"


async def submit(http: httpx.AsyncClient, key: str, urls: list[str]) -> httpx.Response:
    return await http.post(CHAT_ASYNC, headers={"apikey": key}, json=body_of(urls))


# Together ----------------------------------------------------------------------------


async def test_six_slow_images_cost_about_one_images_time(images: ImageServer) -> None:
    # Each image is answered only once all six are asked for: one after
    # another, the first would wait for the rest until the deadline.
    images.gate = 6
    async with image_horde() as (horde, http, key):
        r = await submit(http, key, [images.url(f"/together/{n}.png") for n in range(6)])
        assert r.status_code == 202, r.text
        request_id = r.json()["id"]
        assert images.most_waiting == 6
        assert blob_files(horde) == [f"{request_id}-{n}" for n in range(6)]


CAPS = [2, None]  # None: IMAGE_FETCHES_PER_REQUEST as it is


def set_cap(monkeypatch: pytest.MonkeyPatch, cap: int | None) -> int:
    if cap is None:
        return IMAGE_FETCHES_PER_REQUEST
    monkeypatch.setattr(request_images, "IMAGE_FETCHES_PER_REQUEST", cap)
    return cap


@pytest.mark.parametrize("cap", CAPS)
async def test_a_request_fetches_as_many_as_its_cap_at_once(
    images: ImageServer, monkeypatch: pytest.MonkeyPatch, cap: int | None
) -> None:
    # Answered in cohorts of the cap: fewer at once would never fill one.
    at_once = set_cap(monkeypatch, cap)
    images.gate = at_once
    async with image_horde() as (horde, http, key):
        urls = [images.url(f"/together/{n}.png") for n in range(2 * at_once)]
        r = await submit(http, key, urls)
        assert r.status_code == 202, r.text
        assert images.most_waiting == at_once
        assert images.answered == 2 * at_once
        assert len(blob_files(horde)) == 2 * at_once


@pytest.mark.parametrize("cap", CAPS)
async def test_a_request_fetches_no_more_than_its_cap_at_once(
    images: ImageServer, monkeypatch: pytest.MonkeyPatch, cap: int | None
) -> None:
    # Answered only once one more than the cap wait at once: the cap held,
    # that never happens and the request meets its deadline, every part
    # unfetched (the last never started).
    monkeypatch.setattr(request_images, "IMAGE_FETCH_DEADLINE", 2.0)
    at_once = set_cap(monkeypatch, cap)
    images.gate = at_once + 1
    async with image_horde() as (horde, http, key):
        urls = [images.url(f"/together/{n}.png") for n in range(at_once + 1)]
        r = await submit(http, key, urls)
        assert r.status_code == 400, r.text
        assert set(r.json()["errors"]) == {part(k) for k in range(at_once + 1)}
        assert images.most_waiting == at_once
        assert blob_files(horde) == []


async def submit_together(
    http: httpx.AsyncClient, key: str, images: ImageServer, requests: int, each: int
) -> list[httpx.Response]:
    """``requests`` submits at once, of ``each`` /together/ images."""
    answers: list[httpx.Response] = []

    async def one(n: int) -> None:
        urls = [images.url(f"/together/{n}-{m}.png") for m in range(each)]
        answers.append(await submit(http, key, urls))

    async with anyio.create_task_group() as tg:
        for n in range(requests):
            tg.start_soon(one, n)
    return answers


async def test_the_process_fetches_as_many_as_its_bound_at_once_across_requests(
    images: ImageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two requests of three images each, at once, each under its own cap:
    # the bound they share (read when the horde makes it, at its first
    # image) lets three through at a time. One after another within each
    # request, the two would never fill a cohort of three.
    monkeypatch.setattr(horde_requests, "IMAGE_FETCHES_PER_PROCESS", 3)
    images.gate = 3
    async with image_horde() as (horde, http, key):
        answers = await submit_together(http, key, images, requests=2, each=3)
        assert [r.status_code for r in answers] == [202] * 2, [r.text for r in answers]
        assert images.most_waiting == 3
        assert len(blob_files(horde)) == 6


async def test_the_process_fetches_no_more_than_its_bound_at_once_across_requests(
    images: ImageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same six fetches, answered only once four wait at once: the bound
    # held, both requests meet their deadline.
    monkeypatch.setattr(request_images, "IMAGE_FETCH_DEADLINE", 2.0)
    monkeypatch.setattr(horde_requests, "IMAGE_FETCHES_PER_PROCESS", 3)
    images.gate = 4
    async with image_horde() as (horde, http, key):
        answers = await submit_together(http, key, images, requests=2, each=3)
        assert [r.status_code for r in answers] == [400] * 2, [r.text for r in answers]
        assert images.most_waiting == 3
        assert blob_files(horde) == []


# The deadline and failures ---------------------------------------------------------


async def test_the_deadline_refuses_naming_the_parts_not_fetched_and_keeps_nothing(
    images: ImageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(request_images, "IMAGE_FETCH_DEADLINE", 2.0)
    images.hung_expected = 2
    urls = [images.url(p) for p in ("/image.png", "/hung/1", "/image.png", "/hung/2")]
    async with image_horde() as (horde, http, key):
        r = await submit(http, key, urls)
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["rc"] == "ChatRequestInvalid"
        assert body["param"] == part(1)  # the first in message order
        assert set(body["errors"]) == {part(1), part(3)}
        assert body["message"].startswith(f"{part(1)}, {part(3)}: not fetched within 2 s")
        assert "127.0.0.1" in body["errors"][part(3)]
        # The two answered images were stored and are gone with the request.
        assert images.answered == 2
        assert blob_files(horde) == []
        with anyio.fail_after(OBSERVED_WITHIN):
            await images.all_hung_closed.wait()


async def test_a_failing_image_among_slow_ones_cancels_the_rest_and_keeps_nothing(
    images: ImageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three parts at once: a data: image, a hung fetch and /bad start; the
    # second hung fetch starts once the data: image is stored (its slot is
    # freed after the put), and /bad fails once both hung fetches are in
    # flight. A hung fetch not cancelled would run on to the deadline and
    # be named as not fetched in time.
    monkeypatch.setattr(request_images, "IMAGE_FETCHES_PER_REQUEST", 3)
    images.hung_expected = 2
    urls = [png_data_url(), images.url("/hung/1"), images.url("/bad"), images.url("/hung/2")]
    async with image_horde() as (horde, http, key):
        r = await submit(http, key, urls)
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["rc"] == "ChatRequestInvalid"
        assert body["param"] == part(2)
        assert "HTTP status 404" in body["message"]
        assert set(body["errors"]) == {part(2)}  # the hung ones were cancelled, not refused
        assert blob_files(horde) == []
        with anyio.fail_after(OBSERVED_WITHIN):
            await images.all_hung_closed.wait()
        assert images.hung_closed == 2


async def test_a_submit_cancelled_while_its_images_are_taken_in_keeps_nothing(
    images: ImageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two parts at once: the hung fetch starts once the data: image or the
    # fetched one is stored (its slot freed after the put); the submit is
    # cancelled, from outside, once that fetch is in flight.
    monkeypatch.setattr(request_images, "IMAGE_FETCHES_PER_REQUEST", 2)
    images.hung_expected = 1
    body = body_of([png_data_url(), images.url("/image.png"), images.url("/hung/1")])
    queued: list[object] = []
    async with image_horde() as (horde, _, key):
        submit_scope = anyio.CancelScope()

        async def cancel_once_in_flight() -> None:
            await images.all_hung.wait()
            submit_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_once_in_flight)
            with submit_scope:
                queued.append(
                    await horde.horde.queue_chat(key, parse_chat_request(body), "test:1:cancel")
                )
        assert submit_scope.cancelled_caught  # the cancellation came through
        assert queued == []
        assert blob_files(horde) == []
        with anyio.fail_after(OBSERVED_WITHIN):
            await images.all_hung_closed.wait()
