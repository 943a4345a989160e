"""OpenAI calls cut by a kill -9 of ``hordelite serve --processes 2`` on
PostgreSQL + Redis (issue 35, finding 9; decision 0073), black-box.

16 calls (8 streamed, each with text posted by the worker and read by its
client, 8 not) are open when every process of the horde is killed. The
horde restarted in its place abandons them before it serves; the worker
then hands in the jobs that were not streamed. Prints what the requester
was charged per request: the streamed ones were charged 1.76 kudos each,
for text their clients never got, before decision 0073.

    python bench/hostile_orphaned_streams.py --port 7172 \\
        --postgres postgresql://postgres@127.0.0.1:5432/test \\
        --redis redis://127.0.0.1:6379/13

Uses a fresh PostgreSQL schema (dropped at the end) and the Redis logical
database given (its keys are named by request and job ids).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import anyio.abc
import httpx
import openai
import psycopg

from hordelite.testing import FakeChatWorker

MODEL = "hostile/chat"
CALLS, STREAMED = 16, 8


def with_schema(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), ("options", f"-csearch_path={schema}")]
    return urlunsplit(parts._replace(query=urlencode(query)))


def cli(config: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hordelite", "--config", str(config), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout + done.stderr


def create(config: Path, name: str, kudos: float) -> str:
    out = cli(config, "keys", "create", name, "--kudos", str(kudos))
    found = re.search(r"API key \(shown once, keep it\): (\S+)", out)
    if found is None:
        raise SystemExit(out)
    return found.group(1)


@contextlib.asynccontextmanager
async def serving(config: Path, log: Path, url: str) -> AsyncIterator[anyio.abc.Process]:
    with log.open("a") as out:
        # A session of its own: the kill takes every process of the horde.
        server = await anyio.open_process(
            [sys.executable, "-m", "hordelite", "--config", str(config), "serve"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        with anyio.fail_after(60):
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    async with httpx.AsyncClient() as client:
                        ready = await client.get(url + "/readyz", timeout=1)
                    if ready.status_code == 200:
                        break
                await anyio.sleep(0.2)
        yield server
    finally:
        if server.returncode is None:
            os.killpg(server.pid, signal.SIGTERM)
            with anyio.fail_after(30):
                await server.wait()


def kill_all(pid: int) -> None:
    """SIGKILL the supervisor and its serving processes at once (they run in
    sessions of their own: a kill of the supervisor alone lets them drain)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for each in [*children, str(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(each), signal.SIGKILL)


async def call(client: openai.AsyncOpenAI, i: int, stream: bool, heard: anyio.Event) -> None:
    messages: Any = [{"role": "user", "content": f"Name colour {i}."}]
    with contextlib.suppress(openai.APIConnectionError, httpx.TransportError):
        if not stream:
            await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32)
            return
        response = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=32, stream=True
        )
        async for chunk in response:
            if chunk.choices and chunk.choices[0].delta.content:
                heard.set()


async def run(config: Path, workdir: Path, url: str, alice: str, bob: str) -> None:
    jobs: list[dict[str, Any]] = []
    async with serving(config, workdir / "killed.log", url) as server:
        async with (
            FakeChatWorker(url, bob, name="bob-worker", model_id=MODEL) as worker,
            httpx.AsyncClient(timeout=60) as http,
            openai.AsyncOpenAI(
                base_url=url + "/v1", api_key=alice, max_retries=0, http_client=http
            ) as client,
            anyio.create_task_group() as tg,
        ):
            await worker.pop()
            with anyio.fail_after(60):
                for i in range(CALLS):
                    stream, heard = i < STREAMED, anyio.Event()
                    tg.start_soon(call, client, i, stream, heard)
                    job = await worker.pop(wait=10)
                    jobs.append(job)
                    if stream:
                        body = {"id": job["id"], "seq": 1, "delta": {"content": "Blu"}}
                        posted = await worker.client.post("/generate/text/progress", json=body)
                        posted.raise_for_status()
                        await heard.wait()
            kill_all(server.pid)
            await server.wait()
            tg.cancel_scope.cancel()
    async with serving(config, workdir / "restarted.log", url):
        async with FakeChatWorker(url, bob, name="bob-worker", model_id=MODEL) as w:
            for job in jobs:
                reply = {"message": {"role": "assistant", "content": "Blue."}}
                await w.submit_reply(job, {**reply, "finish_reason": "stop"})


def report(database: str) -> None:
    with psycopg.connect(database) as conn:
        kudos = conn.execute("SELECT kudos FROM users WHERE username = 'alice'").fetchone()
        rows = conn.execute(
            "SELECT r.state, r.kudos, r.unread, (SELECT count(*) FROM jobs j WHERE "
            "j.request_id = r.id AND j.tokens > 0) FROM requests r ORDER BY r.created"
        ).fetchall()
    charged = [round(r[1], 2) for r in rows]
    print(
        f"requests: {len(rows)}, states: {sorted({r[0] for r in rows})}, "
        f"unread: {sum(bool(r[2]) for r in rows)}"
    )
    print(f"charged per request: {charged}")
    print(
        f"charged for cut calls: {sum(charged):.2f} kudos "
        f"({sum(c > 0 for c in charged)} of {len(rows)} requests charged); "
        f"alice: 1000 -> {kudos[0] if kudos else None:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=7172)
    parser.add_argument("--postgres", default=os.environ.get("HORDELITE_TEST_POSTGRES_URL"))
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--keep", type=Path, help="copy the logs and config there")
    args = parser.parse_args()
    schema = f"hostile_{secrets.token_hex(6)}"
    with psycopg.connect(args.postgres, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    database = with_schema(args.postgres, schema)
    try:
        with tempfile.TemporaryDirectory(prefix="hostile-orphans-") as tmp:
            workdir = Path(tmp)
            config = workdir / "hordelite.toml"
            config.write_text(
                "\n".join(
                    [
                        "[server]",
                        'host = "127.0.0.1"',
                        f"port = {args.port}",
                        "processes = 2",
                        "grace_period = 1",
                        "[storage]",
                        f"database = {json.dumps(database)}",
                        "[signals]",
                        f"url = {json.dumps(args.redis)}",
                        "[horde]",
                        "sweep_interval = 0.5",
                        "job_ttl = 120",
                    ]
                )
                + "\n",
                encoding="utf-8",
            )
            print(cli(config, "db", "upgrade").strip())
            alice, bob = create(config, "alice", 1000), create(config, "bob", 0)
            started = time.monotonic()
            anyio.run(run, config, workdir, f"http://127.0.0.1:{args.port}", alice, bob)
            print(f"run: {time.monotonic() - started:.1f} s")
            for line in (workdir / "restarted.log").read_text().splitlines():
                if "OpenAI call(s)" in line:
                    print("log:", line.strip())
            if args.keep:
                shutil.copytree(workdir, args.keep, dirs_exist_ok=True)
            report(database)
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    main()
