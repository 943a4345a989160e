"""Chat admission and the verification of chat replies do their work outside
the write transaction (issue 9, "Stalls and leaks"): on SQLite no other
write waits for them, and a long conversation or a reply checked against a
client's schema is worked on in a thread while the event loop serves others.

The probes are hooks on pure contract functions the work always calls: one
tries SQLite's write lock from another connection without waiting, the other
waits for a write the event loop makes meanwhile.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import anyio
import psycopg
import pytest

from hordelite.contract import chat_admission as chat
from hordelite.contract import chat_reply
from hordelite.contract.chat_features import ALL_NAMES
from tests.chat_shapes import json_schema_format
from tests.integration._chat_helpers import (
    ChatEnv,
    chat_body,
    open_chat_horde,
    pop_job,
)

pytestmark = pytest.mark.anyio

COLOUR_SCHEMA = json_schema_format("colour", ["colour"])


def write_lock_free(database: str) -> bool:
    """Whether another connection can take SQLite's write lock right now."""
    conn = sqlite3.connect(database, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        return False
    finally:
        conn.close()


def probe(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, check: Callable[[], bool]
) -> list[bool]:
    """Run ``check`` each time ``module.name`` is called; returns the results."""
    seen: list[bool] = []
    original = getattr(module, name)

    def probed(*args: Any, **kwargs: Any) -> Any:
        seen.append(check())
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, probed)
    return seen


def conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: " + "x" * 60})
        messages.append({"role": "assistant", "content": f"Answer {i}."})
    messages.append({"role": "user", "content": "Name one colour."})
    return messages


# A conversation long enough to be admitted in a worker thread, and cut to
# fit the worker's context.
LONG = {
    "messages": conversation(200),
    "horde": {"context_fit": "truncate_oldest"},
}


async def reply_to(
    env: ChatEnv, body: dict[str, Any], content: str, limits: dict[str, Any] | None = None
) -> None:
    worker = await env.chat_worker("w1", ALL_NAMES, limits=limits)
    await env.queue(body)
    job = await pop_job(worker)
    reply = {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    response = await worker.submit_reply(job, reply)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("body", "content"),
    [
        pytest.param(chat_body(), "Blue.", id="a plain reply"),
        pytest.param(
            chat_body(response_format=COLOUR_SCHEMA),
            '{"colour": "blue"}',
            id="a reply checked against a strict schema",
        ),
    ],
)
async def test_a_chat_reply_is_verified_while_the_write_lock_is_free(
    monkeypatch: pytest.MonkeyPatch, body: dict[str, Any], content: str
) -> None:
    async with open_chat_horde() as env:
        database = env.horde.database
        seen = probe(
            monkeypatch,
            chat_reply,
            "_check_calls_are_usable",
            lambda: write_lock_free(database),
        )
        await reply_to(env, body, content)
        assert seen == [True]


@pytest.mark.parametrize(
    "fields", [pytest.param({}, id="one message"), pytest.param(LONG, id="a long conversation")]
)
async def test_a_chat_request_is_admitted_while_the_write_lock_is_free(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any]
) -> None:
    async with open_chat_horde() as env:
        await env.chat_worker(
            "w1", ALL_NAMES, limits={"max_context_length": 2048, "max_length": 256}
        )
        database = env.horde.database
        seen = probe(monkeypatch, chat, "flatten_messages", lambda: write_lock_free(database))
        response = await env.submit(chat_body(**fields))
        assert response.status_code == 202, response.text
        if fields:
            assert response.json()["context_adjustments"][0]["field"] == "messages"
        assert seen
        assert all(seen), seen


async def check_the_loop_serves_while(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, env: ChatEnv, work: Any
) -> None:
    """While ``module.name`` runs inside ``work``, another write completes on
    the event loop: the hook waits for it (for at most 10 s)."""
    started, served = threading.Event(), threading.Event()

    def wait_for_the_loop() -> bool:
        started.set()
        return served.wait(timeout=10)

    seen = probe(monkeypatch, module, name, wait_for_the_loop)

    async def another_write() -> None:
        # The hook may run in a thread: poll its flag, with a deadline.
        with anyio.fail_after(20):
            while True:
                if started.is_set():
                    break
                await anyio.sleep(0.01)
        await env.horde.create_key("carol")
        served.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(another_write)
        await work()
    assert seen[:1] == [True], seen


async def test_the_event_loop_serves_while_a_long_schema_checked_reply_is_verified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with open_chat_horde() as env:

        async def work() -> None:
            # Long enough to be judged off the loop (HEAVY_REPLY_CHARS), for a
            # job whose max_length allows it (decision 0069: 16 bytes a token).
            padded = '{"colour": "blue"' + " " * chat_reply.HEAVY_REPLY_CHARS + "}"
            body = chat_body(response_format=COLOUR_SCHEMA, max_tokens=4096)
            limits = {"max_context_length": 8192, "max_length": 4096}
            await reply_to(env, body, padded, limits)

        await check_the_loop_serves_while(
            monkeypatch, chat_reply, "_check_calls_are_usable", env, work
        )


async def test_the_event_loop_serves_while_a_long_conversation_is_admitted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with open_chat_horde() as env:
        await env.chat_worker(
            "w1", ALL_NAMES, limits={"max_context_length": 2048, "max_length": 256}
        )

        async def work() -> None:
            response = await env.submit(chat_body(**LONG))
            assert response.status_code == 202, response.text

        await check_the_loop_serves_while(monkeypatch, chat, "truncate_oldest", env, work)


def jobs_unlocked(url: str) -> bool:
    """Whether another PostgreSQL connection can lock every job row at once."""
    with psycopg.connect(url) as conn:
        try:
            conn.execute("SELECT id FROM jobs FOR UPDATE NOWAIT")
        except psycopg.errors.LockNotAvailable:
            return False
        finally:
            conn.rollback()
    return True


async def test_on_postgresql_a_reply_is_verified_while_its_job_is_not_locked(
    monkeypatch: pytest.MonkeyPatch, postgres_schema_url: str
) -> None:
    async with open_chat_horde(database=postgres_schema_url) as env:
        seen = probe(
            monkeypatch,
            chat_reply,
            "_check_calls_are_usable",
            lambda: jobs_unlocked(postgres_schema_url),
        )
        await reply_to(env, chat_body(response_format=COLOUR_SCHEMA), '{"colour": "blue"}')
        assert seen == [True]


async def test_a_request_is_admitted_against_the_workers_as_they_are_at_its_transaction() -> None:
    # Admission is worked out ahead from the capacity the last submit for the
    # same model saw; a worker that changed its limits since is still obeyed.
    async with open_chat_horde() as env:
        worker = await env.chat_worker(
            "w1", ALL_NAMES, limits={"max_context_length": 2048, "max_length": 256}
        )
        for applied in (256, 128, 128):
            response = await env.submit(chat_body(max_tokens=1000))
            assert response.status_code == 202, response.text
            [adjustment] = response.json()["context_adjustments"]
            assert adjustment["applied"] == applied
            worker.chat_limits = {"max_context_length": 2048, "max_length": 128}
            await worker.pop()
