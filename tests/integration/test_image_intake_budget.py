"""Images refused before they are taken in, and normalised fairly
(decision 0070), black-box against a real horde on SQLite.

An account's image budget (budgets.image_bytes) is checked before an image
is fetched, decoded or stored: a full budget refuses at once; a data URL is
counted from its length, a fetch as its bytes arrive. The images here that
are refused are no images at all (junk bytes): had any been decoded, the
answer would be 400 ChatRequestInvalid, not the budget's refusal. And one
account's queue of images waiting to be normalised does not hold another
account's image back.
"""

from __future__ import annotations

import base64
import io
import os
from typing import Any

import anyio
import httpx
import pytest
from PIL import Image
from sqlalchemy import func, select

from hordelite.config import Config
from hordelite.contract.image_normalise import normalise
from hordelite.storage.schema import requests, users
from hordelite.testing import TestHorde
from tests.integration._env import open_env
from tests.integration.test_image_fetch import serve
from tests.integration.test_images import blob_files, client_for, image_body, online_vision_worker
from tests.unit.test_fair_turns import Turns, until

pytestmark = pytest.mark.anyio

ANON = "0000000000"
CHAT_ASYNC = "/api/v2/generate/chat/async"
LIMIT = "budgets.image_bytes"


def noise_jpeg(side: int = 200) -> bytes:
    """An image whose JPEG is not tiny (noise does not compress), a little
    smaller as it is sent than once stored (an image is counted as it
    arrives, then as stored)."""
    buffer = io.BytesIO()
    Image.effect_noise((side, side), 64).convert("RGB").save(buffer, "JPEG", quality=85)
    return buffer.getvalue()


IMAGE = noise_jpeg()
JPEG_BYTES = len(normalise(IMAGE).jpeg)  # what one such image holds once stored


def data_url(data: bytes, mime: str = "image/jpeg") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def config(image_bytes: int) -> Config:
    return Config().replace(
        budgets={"image_bytes": image_bytes},
        images={"fetch_private": True},
        signals={"url": os.environ.get("HORDELITE_SIGNALS_URL", "")},
    )


async def held_image_bytes(horde: TestHorde) -> int:
    def read(conn: Any) -> int:
        return int(
            conn.execute(select(func.coalesce(func.sum(requests.c.image_bytes), 0))).one()[0]
        )

    return await horde.horde.db.read(read)


def assert_budget_refused(r: httpx.Response, status: int, rc: str) -> None:
    assert r.status_code == status, r.text
    assert (r.json()["rc"], r.json()["limit"]) == (rc, LIMIT)
    if status == 429:
        assert r.headers["Retry-After"]


async def fill(http: httpx.AsyncClient, key: str) -> list[str]:
    """Queue requests of one image until the image budget refuses one."""
    accepted: list[str] = []
    while True:
        r = await http.post(CHAT_ASYNC, headers={"apikey": key}, json=image_body(data_url(IMAGE)))
        if r.status_code != 202:
            assert_budget_refused(r, 429, "StoredBytesExceeded")
            return accepted
        accepted.append(r.json()["id"])
        assert len(accepted) < 50, "the image budget never refused"


async def test_a_full_image_budget_refuses_before_any_image_is_fetched_or_decoded(
    database: str | None,
) -> None:
    async with (
        open_env(config=config(2 * JPEG_BYTES), database=database) as env,
        client_for(env.horde) as http,
        serve() as host,
    ):
        async with online_vision_worker(env.horde, env.owner):
            assert len(await fill(http, env.requester)) == 2
            junk = data_url(b"no image at all" * 8)
            r = await http.post(
                CHAT_ASYNC, headers={"apikey": env.requester}, json=image_body(junk)
            )
            assert_budget_refused(r, 429, "StoredBytesExceeded")
            r = await http.post(
                CHAT_ASYNC, headers={"apikey": env.requester}, json=image_body(host.url("/image"))
            )
            assert_budget_refused(r, 429, "StoredBytesExceeded")
            assert host.connections == 0  # not fetched
            assert len(blob_files(env.horde)) == 2  # the held requests' alone


async def test_a_data_url_that_cannot_fit_is_refused_before_it_is_decoded() -> None:
    limit = 2 * JPEG_BYTES + JPEG_BYTES // 2
    async with (
        open_env(config=config(limit)) as env,
        client_for(env.horde) as http,
    ):
        async with online_vision_worker(env.horde, env.owner):
            junk = data_url(b"\0" * (limit + 1))  # larger than the whole budget
            r = await http.post(
                CHAT_ASYNC, headers={"apikey": env.requester}, json=image_body(junk)
            )
            assert_budget_refused(r, 413, "RequestTooLarge")
            for _ in range(2):
                r = await http.post(
                    CHAT_ASYNC, headers={"apikey": env.requester}, json=image_body(data_url(IMAGE))
                )
                assert r.status_code == 202, r.text
            room = limit - await held_image_bytes(env.horde)
            assert 0 < room < JPEG_BYTES
            # Within the budget, not within what is left of it.
            junk = data_url(b"\0" * (room + 1))
            r = await http.post(
                CHAT_ASYNC, headers={"apikey": env.requester}, json=image_body(junk)
            )
            assert_budget_refused(r, 429, "StoredBytesExceeded")
            assert len(blob_files(env.horde)) == 2


@pytest.mark.parametrize("path", ["/declared/{n}", "/endless"])
async def test_a_fetch_stops_once_its_bytes_cannot_fit(path: str) -> None:
    limit = 4 * JPEG_BYTES
    async with (
        open_env(config=config(limit)) as env,
        client_for(env.horde) as http,
        serve() as host,
    ):
        async with online_vision_worker(env.horde, env.owner):
            r = await http.post(
                CHAT_ASYNC, headers={"apikey": env.requester}, json=image_body(data_url(IMAGE))
            )
            assert r.status_code == 202, r.text
            room = limit - await held_image_bytes(env.horde)
            # A declared length past what is left, then zeros without end;
            # or zeros without a length.
            url = host.url(path.format(n=room + 1))
            r = await http.post(CHAT_ASYNC, headers={"apikey": env.requester}, json=image_body(url))
            assert_budget_refused(r, 429, "StoredBytesExceeded")
            assert host.connections == 1
            assert len(blob_files(env.horde)) == 1


async def test_an_image_waits_for_no_other_accounts_queue_to_be_normalised() -> None:
    async with (
        open_env(config=config(64 * 1024 * 1024)) as env,
        client_for(env.horde) as http,
    ):

        def anonymous_id(conn: Any) -> int:
            return int(conn.execute(select(users.c.id).where(users.c.anonymous)).scalar_one())

        flooder = await env.horde.horde.db.read(anonymous_id)
        turns = env.horde.horde.requests._normalising
        async with (
            online_vision_worker(env.horde, env.owner),
            anyio.create_task_group() as tg,
        ):
            # The anonymous account holds the one normalising slot, three more
            # of its images waiting: a flood in progress.
            flood = Turns(turns, tg)
            for n in range(4):
                await flood.ask(f"flood-{n}", flooder)
            answers: list[httpx.Response] = []

            async def submit() -> None:
                body = image_body(data_url(IMAGE))
                answers.append(
                    await http.post(CHAT_ASYNC, headers={"apikey": env.requester}, json=body)
                )

            tg.start_soon(submit)
            await until(lambda: turns.waiting == 4)
            flood.go["flood-0"].set()
            # alice's image has the next turn: her submit is answered while
            # the flood's images still wait (in a FIFO they would go first,
            # and hold it until each was let go).
            await until(lambda: bool(answers), seconds=30)
            assert answers[0].status_code == 202, answers[0].text
            assert flood.order == ["flood-0", "flood-1"]
            assert turns.waiting == 2
            for event in flood.go.values():
                event.set()


async def test_images_being_taken_in_count_toward_the_budget_before_any_is_stored() -> None:
    limit = JPEG_BYTES + JPEG_BYTES // 2  # room for one image, not two
    async with (
        open_env(config=config(limit)) as env,
        client_for(env.horde) as http,
    ):
        turns = env.horde.horde.requests._normalising
        async with (
            online_vision_worker(env.horde, env.owner),
            anyio.create_task_group() as tg,
        ):
            # Another account holds the normalising slot: alice's first
            # image is counted as received, then waits for its turn.
            busy = Turns(turns, tg)
            await busy.ask("elsewhere", "someone else")
            answers: list[httpx.Response] = []

            async def first() -> None:
                body = image_body(data_url(IMAGE))
                answers.append(
                    await http.post(CHAT_ASYNC, headers={"apikey": env.requester}, json=body)
                )

            tg.start_soon(first)
            await until(lambda: turns.waiting == 1)
            # Her second does not fit beside the first: refused at once,
            # though nothing of hers is stored yet.
            with anyio.fail_after(10):
                r = await http.post(
                    CHAT_ASYNC, headers={"apikey": env.requester}, json=image_body(data_url(IMAGE))
                )
            assert_budget_refused(r, 429, "StoredBytesExceeded")
            assert "being taken in" in r.json()["message"]
            assert blob_files(env.horde) == []
            busy.go["elsewhere"].set()
            await until(lambda: bool(answers), seconds=30)
            assert answers[0].status_code == 202, answers[0].text
            assert len(blob_files(env.horde)) == 1
