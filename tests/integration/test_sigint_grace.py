"""SIGINT to a real ``hordelite serve`` while a worker holds an OpenAI call's
job: the stop grants its grace to the open call (issue 35, finding 10). The
worker's submit, sent once the server is stopping, is served, the call gets
the reply, and the server exits 0 within ``server.grace_period``. Before,
the call got 503 at once and the submit found the port closed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest

from hordelite.testing import FakeChatWorker
from hordelite.testing._fake_worker import colour_reply

pytestmark = pytest.mark.anyio

MODEL = "grace-model"
GRACE_PERIOD = 10.0  # server.grace_period's default
STOP_MARGIN = 5.0  # the interpreter's own exit, on a loaded machine


def _environment() -> dict[str, str]:
    # A default horde: none of the suite's own settings (Redis, PostgreSQL).
    return {k: v for k, v in os.environ.items() if not k.startswith("HORDELITE_")}


def _serve(folder: Path) -> tuple[subprocess.Popen[str], str]:
    """A fresh default ``hordelite serve`` on a free port, and its URL."""
    server = subprocess.Popen(
        [sys.executable, "-m", "hordelite", "serve", "--port", "0", "--database", "horde.db"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=folder,
        env=_environment(),
    )
    assert server.stdout is not None
    for line in server.stdout:
        found = re.search(r"(http://127\.0\.0\.1:\d+)", line)
        if found:
            return server, found.group(1)
    raise AssertionError("serve exited before it printed its URL")


def _key(folder: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hordelite", "keys", "create", "bob", "--database", "horde.db"],
        capture_output=True,
        text=True,
        cwd=folder,
        env=_environment(),
        check=True,
    )
    [line] = [line for line in done.stdout.splitlines() if "API key" in line]
    return line.rsplit(":", 1)[1].strip()


async def _until_stopping(url: str) -> None:
    """Poll /readyz (with a deadline) until the server says it is stopping."""
    async with httpx.AsyncClient(base_url=url) as client:
        with anyio.fail_after(10):
            while True:
                if (await client.get("/readyz")).status_code == 503:
                    return
                await anyio.sleep(0.01)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_sigint_grants_an_open_call_the_grace_for_its_workers_submit(tmp_path: Path) -> None:
    server, url = _serve(tmp_path)
    try:
        key = _key(tmp_path)
        answers: list[httpx.Response] = []
        async with FakeChatWorker(url, key, model_id=MODEL) as worker:
            assert (await worker.pop(0))["id"] is None  # online, nothing queued

            async def call() -> None:
                async with httpx.AsyncClient(timeout=60) as client:
                    answers.append(
                        await client.post(
                            f"{url}/v1/chat/completions",
                            headers={"Authorization": f"Bearer {key}"},
                            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                        )
                    )

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                job: dict[str, object] = {"id": None}
                with anyio.fail_after(20):
                    while job["id"] is None:
                        job = await worker.pop(2)
                stopping = time.monotonic()
                server.send_signal(signal.SIGINT)
                await _until_stopping(url)
                submitted = await worker.submit_reply(job, colour_reply(job))
                assert submitted.status_code == 200, submitted.text
        [answer] = answers
        assert answer.status_code == 200, answer.text
        assert (
            answer.json()["choices"][0]["message"]["content"]
            == colour_reply(job)["message"]["content"]
        )
        exit_code = await anyio.to_thread.run_sync(server.wait)
        assert exit_code == 0
        assert time.monotonic() - stopping < GRACE_PERIOD + STOP_MARGIN
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        assert server.stdout is not None
        server.stdout.close()
