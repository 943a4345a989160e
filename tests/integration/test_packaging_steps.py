"""The image's steps outside a container: the Containerfile's CMD with its
environment, its HEALTHCHECK probe, and compose.yaml's example worker, as a
container engine would run them (no engine is needed, or used)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.unit.test_packaging import compose, container_env, containerfile

ROOT = Path(__file__).resolve().parents[2]
START_DEADLINE = 30.0


def _environment(tmp_path: Path) -> dict[str, str]:
    """This shell's environment without its HORDELITE_ variables, with the
    image's, its /data moved to ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDELITE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    for name, value in container_env().items():
        env[name] = value.replace("/data", str(tmp_path))
    return env


def _argv(command: list[str]) -> list[str]:
    assert command[0] == "hordelite"
    return [sys.executable, "-m", "hordelite", *command[1:]]


def _probe(env: dict[str, str], port: int) -> int:
    (check,) = [rest for word, rest in containerfile() if word == "HEALTHCHECK"]
    argv = json.loads(check.partition("CMD ")[2])
    assert argv[0] == "python"
    return subprocess.run(
        [sys.executable, *argv[1:]],
        env={**env, "HORDELITE_SERVER_PORT": str(port)},
        capture_output=True,
        timeout=10,
        check=False,
    ).returncode


def _wait_for(log: Path, pattern: str) -> re.Match[str]:
    deadline = time.monotonic() + START_DEADLINE
    while time.monotonic() < deadline:
        match = re.search(pattern, log.read_text(encoding="utf-8"))
        if match:
            return match
        time.sleep(0.1)
    pytest.fail(f"not within {START_DEADLINE} s: {pattern!r} in\n{log.read_text()}")


def test_the_image_command_serves_passes_its_healthcheck_and_a_worker_answers_a_chat_call(
    tmp_path: Path,
) -> None:
    env = _environment(tmp_path)
    (cmd,) = [json.loads(rest) for word, rest in containerfile() if word == "CMD"]
    # The image listens on 0.0.0.0:7001; a test listens on this machine only, on a free port.
    serve_log, worker_log = tmp_path / "serve.log", tmp_path / "worker.log"
    started: list[subprocess.Popen[bytes]] = []
    try:
        with serve_log.open("w") as out:
            started.append(
                subprocess.Popen(
                    [*_argv(cmd), "--host", "127.0.0.1", "--port", "0"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=tmp_path,
                    env=env,
                )
            )
        url = _wait_for(serve_log, r"serving at (http://127\.0\.0\.1:(\d+))")
        _wait_for(serve_log, r"keys create")
        port = int(url.group(2))
        assert (tmp_path / "hordelite.db").is_file()  # HORDELITE_STORAGE_DATABASE
        assert (
            tmp_path / "hordelite-blobs" / "signing.secret"
        ).is_file()  # HORDELITE_BLOBS_DIRECTORY
        assert _probe(env, port) == 0

        created = subprocess.run(
            _argv(["hordelite", "keys", "create", "alice"]),
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            check=True,
            timeout=30,
        )
        worker = compose()["services"]["worker"]
        worker_env = {**env, **worker["environment"]}
        worker_env["HORDELITE_WORKER_HORDE"] = url.group(1)  # not the compose service name
        worker_env["HORDELITE_WORKER_KEY"] = created.stdout.split()[-1]
        with worker_log.open("w") as out:
            started.append(
                subprocess.Popen(
                    _argv(worker["command"]),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=tmp_path,
                    env=worker_env,
                )
            )
        _wait_for(worker_log, r"serving 'fake-model'")

        reply = httpx.post(
            f"{url.group(1)}/v1/chat/completions",
            headers={"Authorization": "Bearer 0000000000"},
            json={
                "model": "fake-model",
                "messages": [{"role": "user", "content": "Name a colour."}],
            },
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == "echo: Name a colour."

        for process in reversed(started):
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=45) == 0
        assert _probe(env, port) != 0  # nothing answers: unhealthy
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
