"""``hordelite serve`` killed with SIGKILL while OpenAI calls wait and stream
(issue 20, decision 0051): nobody can read those replies any more, so the
process restarted in its place (same host and port) cancels their requests
before it serves, and the workers that hand in their jobs afterwards charge
the requester nothing.

On SQLite the streamed jobs' leases die with the process; on PostgreSQL with
Redis signals they outlive it, and the take-over settles those jobs on the
text they hold: charging nothing there too (issue 35, decision 0073)."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest

from hordelite.storage.database import Database
from hordelite.storage.schema import requests, users
from hordelite.testing import FakeChatWorker
from tests.integration._env import TLS
from tests.integration._helpers import eventually
from tests.integration.test_crash_recovery import MODEL, create_accounts, serve

pytestmark = pytest.mark.anyio

CALL_DEADLINE = 20.0
WAITING, STREAMING, QUEUED = 2, 2, 1


@pytest.fixture(params=["sqlite", "postgresql+redis"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str | None]:
    """The database, and the Redis signals URL (None: in-process signals)."""
    if request.param == "sqlite":
        return str(tmp_path / "horde.db"), None
    database: str = request.getfixturevalue("postgres_schema_url")
    redis = os.environ.get("HORDELITE_TEST_REDIS_URL")
    if not redis:
        pytest.skip("HORDELITE_TEST_REDIS_URL is not set: the Redis variant is skipped")
    return database, redis


def write_config(path: Path, database: str, port: int, redis: str | None = None) -> Path:
    lines = [
        "[server]",
        'host = "127.0.0.1"',
        f"port = {port}",  # the restart takes the same place, so the same reader name
        "grace_period = 1",
        "[storage]",
        f"database = {json.dumps(database)}",
        "[horde]",
        "sweep_interval = 0.2",
        "job_ttl = 120",  # the jobs in hand stay with their worker across the restart
    ]
    if redis is not None:
        # The streamed jobs' leases, with the text posted, outlive the kill.
        lines += ["[signals]", f"url = {json.dumps(redis)}"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def call(client: openai.AsyncOpenAI, content: str, stream: bool, heard: anyio.Event) -> None:
    """An OpenAI call cut by the kill; ``heard`` is set at a stream's first text."""
    messages: Any = [{"role": "user", "content": content}]
    try:
        if not stream:
            await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32)
            pytest.fail("the call was answered before the kill")
        response = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=32, stream=True
        )
        async for chunk in response:
            if chunk.choices and chunk.choices[0].delta.content:
                heard.set()
    except (openai.APIConnectionError, httpx.TransportError):
        return  # the horde was killed under it


def stored(database: str) -> tuple[float, list[tuple[str, float, bool]]]:
    """Alice's kudos, and each of her requests' state, charge and unread mark."""

    def read(conn: Any) -> tuple[float, list[tuple[str, float, bool]]]:
        kudos = conn.execute(
            users.select().with_only_columns(users.c.kudos).where(users.c.username == "alice")
        ).scalar_one()
        rows = conn.execute(
            requests.select().with_only_columns(
                requests.c.state, requests.c.kudos, requests.c.unread
            )
        ).all()
        return float(kudos), [tuple(r) for r in rows]

    db = Database(database, 1)
    try:
        return db.run_sync(read, False)
    finally:
        db.dispose()


async def test_calls_cut_by_a_kill_end_cancelled_and_uncharged_after_the_restart(
    tmp_path: Path, stores: tuple[str, str | None]
) -> None:
    database, redis = stores
    config = write_config(tmp_path / "serve.toml", database, free_port(), redis)
    accounts = create_accounts(database, {"alice": 100.0, "bob": 0.0})
    alice, bob = accounts["alice"].key, accounts["bob"].key
    jobs: list[dict[str, Any]] = []

    async with serve(config, tmp_path / "killed.log") as served:
        async with (
            FakeChatWorker(served.url, bob, name="bob-worker", model_id=MODEL) as worker,
            httpx.AsyncClient(verify=TLS, timeout=60) as http,
            openai.AsyncOpenAI(
                base_url=served.url + "/v1", api_key=alice, max_retries=0, http_client=http
            ) as client,
            anyio.create_task_group() as tg,
        ):
            assert (await worker.pop())["id"] is None  # online
            with anyio.fail_after(CALL_DEADLINE):
                for i in range(WAITING + STREAMING):
                    stream = i >= WAITING
                    heard = anyio.Event()
                    tg.start_soon(call, client, f"Name colour {i}.", stream, heard)
                    job = await worker.pop(wait=10)
                    assert job["id"] is not None, job
                    jobs.append(job)
                    if stream:
                        assert job["payload"]["stream_progress"] is True, job
                        body = {"id": job["id"], "seq": 1, "delta": {"content": "Blu"}}
                        r = await worker.client.post("/generate/text/progress", json=body)
                        assert r.status_code == 200, r.text
                        await heard.wait()  # the client is reading the reply
                for i in range(QUEUED):
                    tg.start_soon(call, client, f"Name fruit {i}.", False, anyio.Event())
                await eventually(lambda: len(stored(database)[1]) == WAITING + STREAMING + QUEUED)
            served.process.kill()
            assert await served.process.wait() == -signal.SIGKILL

    log = tmp_path / "restarted.log"
    async with serve(config, log) as served:
        async with FakeChatWorker(served.url, bob, name="bob-worker", model_id=MODEL) as worker:
            # The requests were cancelled before the horde served: the queued
            # one is popped by nobody, and the jobs in hand settle uncharged.
            assert (await worker.pop())["id"] is None
            for job in jobs:
                reply = {"message": {"role": "assistant", "content": "Blue."}}
                r = await worker.submit_reply(job, {**reply, "finish_reason": "stop"})
                if redis is not None and job["payload"].get("stream_progress"):
                    # Its lease outlived the kill: the take-over settled it
                    # on the text it held, and it takes no submit after.
                    assert r.status_code == 400, r.text
                    assert r.json()["rc"] == "AbortedGen", r.text
                    continue
                assert r.status_code == 200, r.text
                assert r.json()["reward"] > 0  # the volunteer is paid for its work
        served.process.send_signal(signal.SIGTERM)
        assert await served.process.wait() == 0, log.read_text()

    kudos, rows = stored(database)
    assert kudos == 100.0
    assert rows == [("cancelled", 0.0, True)] * (WAITING + STREAMING + QUEUED)
    text = log.read_text()
    assert f"{WAITING + STREAMING + QUEUED} OpenAI call(s) of the process" in text, text
