"""SIGINT to ``hordelite serve`` while a worker holds an OpenAI call's job.

Starts a fresh default ``hordelite serve`` (SQLite, in-process signals) on
``--port``, a fake chat worker pops the job of one OpenAI call, the server
gets SIGINT, and the worker submits its reply ``--submit-after`` seconds
later. Prints what the call got, what the submit got, and how long the
server took to exit (server.grace_period is 10 s by default).

    .venv/bin/python bench/hostile_drain.py --port 7183
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import anyio
import httpx

from hordelite.testing import FakeChatWorker
from hordelite.testing._fake_worker import colour_reply

MODEL = "bench-drain-model"


def _start(port: int, folder: str) -> subprocess.Popen[str]:
    database = os.path.join(folder, "horde.db")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDELITE_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "hordelite", "serve", "--port", str(port), "--database", database],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=folder,
        env=env,
    )
    assert server.stdout is not None
    for line in server.stdout:
        if "keys create" in line:
            return server
    raise SystemExit("serve exited before its banner")


def _key(folder: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hordelite", "keys", "create", "drainer", "--kudos", "1000"],
        capture_output=True,
        text=True,
        cwd=folder,
        env={
            "HORDELITE_DATABASE_URL": os.path.join(folder, "horde.db"),
            "PATH": os.environ["PATH"],
        },
        check=True,
    )
    found = re.search(r"\b([A-Za-z0-9_-]{22,})\b", done.stdout)
    assert found, done.stdout
    return found.group(1)


async def _run(port: int, submit_after: float) -> None:
    with tempfile.TemporaryDirectory() as folder:
        server = _start(port, folder)
        url = f"http://127.0.0.1:{port}"
        key = _key(folder)
        worker = FakeChatWorker(url, key, model_id=MODEL)
        result: dict[str, object] = {}
        try:
            assert (await worker.pop(0))["id"] is None  # online, nothing queued

            async def call() -> None:
                async with httpx.AsyncClient(timeout=60) as client:
                    started = time.monotonic()
                    try:
                        r = await client.post(
                            f"{url}/v1/chat/completions",
                            headers={"Authorization": f"Bearer {key}"},
                            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                        )
                        result["call"] = f"{r.status_code} {r.text[:120]}"
                    except httpx.HTTPError as exc:
                        result["call"] = f"{type(exc).__name__}: {exc}"
                    result["call_seconds"] = round(time.monotonic() - started, 2)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                job: dict[str, object] = {"id": None}
                with anyio.fail_after(20):
                    while job["id"] is None:
                        job = await worker.pop(2)
                stopped_at = time.monotonic()
                server.send_signal(signal.SIGINT)

                async def exited() -> None:
                    await anyio.to_thread.run_sync(server.wait)
                    result["server_exit_seconds"] = round(time.monotonic() - stopped_at, 2)
                    result["server_exit_code"] = server.returncode

                tg.start_soon(exited)
                await anyio.sleep(submit_after)  # the worker generating its reply
                try:
                    r = await worker.submit_reply(job, colour_reply(job))
                    result["submit"] = f"{r.status_code} {r.text[:120]}"
                except httpx.HTTPError as exc:
                    result["submit"] = f"{type(exc).__name__}: {exc}"
        finally:
            await worker.client.aclose()
            if server.poll() is None:
                server.kill()
                server.wait()
        for name, value in result.items():
            print(f"{name}: {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=7183)
    parser.add_argument("--submit-after", type=float, default=2.0)
    args = parser.parse_args()
    anyio.run(_run, args.port, args.submit_after)


if __name__ == "__main__":
    main()
