"""Codex CLI and Claude Code, unmodified, against a real horde.

A ``hordelite serve`` subprocess (SQLite) and one ``hordelite worker``
subprocess in front of the fake backend (hordelite/worker/fake_backend.py,
run here so that the test reads what it was sent), started once for the
module. Each test runs a client's non-interactive command as a user types
it, in a temporary folder with a temporary HOME, and asserts its exit code
and that what it prints is the worker's answer: the fake backend's
``echo: <last user text>`` of the conversation it was sent.

The binaries come from ``HORDELITE_TEST_CODEX`` and ``HORDELITE_TEST_CLAUDE``
(``.ci/run`` sets both from ``tests/agents/install_clis.py``, which installs
the pinned versions once into a cache); without one, its tests are skipped,
saying so. The tests are marked ``agents``: ``pytest -m agents`` runs them
alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from hordelite.worker.fake_backend import (
    FakeBackend,
    FakeBackendConfig,
    message_text,
    open_fake_backend,
)
from tests.integration._helpers import ServeProcess, run_hordelite, serve_environment

pytestmark = [pytest.mark.anyio, pytest.mark.agents]

CODEX_ENV = "HORDELITE_TEST_CODEX"
CLAUDE_ENV = "HORDELITE_TEST_CLAUDE"
MODEL = "fake-model"  # the fake backend's model id
WORKER = "agents-worker"
# Claude Code's system prompt and tools alone are some 20,000 of the fake's
# tokens (4 bytes each): a context as large as its real models'.
CONTEXT = 131072
MAX_LENGTH = 4096  # the worker's most tokens a reply, the AI Horde's bound
# A client's whole run, its horde round trips included.
RUN_TIMEOUT = 120
# The shell command the fake backend's minimal arguments name ("x", the
# schema's smallest string): a script the test puts on the client's PATH,
# so that a tool round trip shows the client really ran what the worker asked.
TOOL_OUTPUT = "the tool ran: 7f3a"
BEST_EFFORT = json.dumps({"conformance": "best_effort"})


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    # The clients are subprocesses: the event loop serving the fake backend
    # does not change what they see, and each run takes seconds.
    return "trio"


def binary(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value:
        pytest.skip(
            f"{variable} is not set: the coding agents' tests are skipped "
            "(install the clients with python3 tests/agents/install_clis.py)"
        )
    path = Path(value)
    assert path.is_file(), f"{variable}={value} is not a file"
    return path


# Module-scoped, and named first in each test's arguments, so that a test
# without its binary is skipped before the horde starts.
@pytest.fixture(scope="module")
def codex() -> Path:
    return binary(CODEX_ENV)


@pytest.fixture(scope="module")
def claude() -> Path:
    return binary(CLAUDE_ENV)


@dataclasses.dataclass
class Horde:
    url: str
    key: str  # the requester's API key, with kudos for Claude Code's long replies
    fake: FakeBackend
    folder: Path

    def chats(self) -> list[dict[str, Any]]:
        """The chat completions the worker asked of the fake backend, in order."""
        return [r["body"] for r in self.fake.requests if r["path"] == "/v1/chat/completions"]


def create_key(config: Path, name: str, *flags: str) -> str:
    done = run_hordelite(
        "--config", str(config), "keys", "create", name, *flags, cwd=config.parent, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("API key (shown once, keep it): ")[1].split()[0]


def start_horde(folder: Path) -> tuple[ServeProcess, str, str]:
    """``hordelite serve`` on a SQLite file, a worker owner's key and a requester's."""
    config = folder / "hordelite.toml"
    database = json.dumps(str(folder / "horde.db"))
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = 0\n[storage]\ndatabase = {database}\n',
        encoding="utf-8",
    )
    served = ServeProcess(config)
    try:
        owner = create_key(config, "owner")
        requester = create_key(config, "agent", "--kudos", "1000000")
    except BaseException:
        served.close()
        raise
    return served, owner, requester


@pytest.fixture(scope="module")
async def horde(
    anyio_backend: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Horde]:
    folder = tmp_path_factory.mktemp("agents")
    served, owner, requester = await anyio.to_thread.run_sync(start_horde, folder)
    try:
        async with open_fake_backend(FakeBackendConfig(context=CONTEXT)) as fake:
            async with running_worker(served.url, owner, fake, folder / "worker.log"):
                yield Horde(served.url, requester, fake, folder)
    finally:
        await anyio.to_thread.run_sync(served.close)


def text(path: Path) -> str:
    return path.read_text(errors="replace")


@contextlib.asynccontextmanager
async def running_worker(url: str, owner: str, fake: FakeBackend, log: Path) -> AsyncIterator[None]:
    """``hordelite worker`` in front of the fake backend, online; SIGINT at exit."""
    command = [sys.executable, "-m", "hordelite", "worker", "--horde", url, f"--key={owner}"]
    command += ["--name", WORKER, "--backend", fake.url, "--features", "tools"]
    command += ["--max-length", str(MAX_LENGTH)]
    with log.open("wb") as out:
        process = await anyio.open_process(
            command, cwd=log.parent, env=serve_environment(), stdout=out, stderr=out
        )
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            with anyio.fail_after(30):
                while (await client.get(f"/api/v2/workers/name/{WORKER}")).status_code != 200:
                    assert process.returncode is None, text(log)
                    await anyio.sleep(0.05)
        yield
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            with anyio.move_on_after(15, shield=True):
                await process.wait()
            if process.returncode is None:
                process.kill()
        await process.aclose()


# Running a client ------------------------------------------------------------------


def client_environment(home: Path, **variables: str) -> dict[str, str]:
    """A client's whole environment: a temporary HOME, a PATH with the
    test's ``x`` command first, and ``variables``; nothing of this process's
    (no API key or base URL of a real provider leaks in)."""
    tools = home / "bin"
    tools.mkdir(exist_ok=True)
    command = tools / "x"
    command.write_text(f"#!/bin/sh\necho '{TOOL_OUTPUT}'\n")
    command.chmod(0o755)
    # Codex runs a command in a login shell, which sets PATH again from
    # /etc/profile and then reads ~/.profile.
    (home / ".profile").write_text('PATH="$HOME/bin:$PATH"\n')
    path = f"{tools}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", **variables}


async def run_client(command: list[str], env: dict[str, str], cwd: Path) -> Done:
    """``command`` run to its exit in ``cwd``, within RUN_TIMEOUT seconds."""
    with anyio.fail_after(RUN_TIMEOUT):
        done = await anyio.run_process(command, cwd=cwd, env=env, check=False)
    return Done(done.returncode, done.stdout.decode(), done.stderr.decode())


@dataclasses.dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str


def answer_to(chat: dict[str, Any]) -> str:
    """The fake backend's text answer to a chat completion: ``echo: `` and
    the conversation's last user text (its module docstring)."""
    last_user = [m for m in chat["messages"] if m.get("role") == "user"][-1]
    return f"echo: {message_text(last_user['content'])}"


def tool_messages(chat: dict[str, Any]) -> list[str]:
    return [message_text(m["content"]) for m in chat["messages"] if m.get("role") == "tool"]


# Codex CLI -------------------------------------------------------------------------


def codex_config(url: str) -> str:
    """A ``config.toml`` naming the horde as Codex's model provider. The
    hosted ``web_search`` tool Codex offers by default cannot run on a
    worker and is refused under strict conformance: it is turned off."""
    return (
        f'model = "{MODEL}"\n'
        'model_provider = "horde"\n'
        'web_search = "disabled"\n'
        "\n"
        "[model_providers.horde]\n"
        'name = "hordelite"\n'
        f'base_url = "{url}/v1"\n'
        'env_key = "HORDE_API_KEY"\n'
        'wire_api = "responses"\n'
    )


def codex_set_up(horde: Horde, folder: Path) -> tuple[dict[str, str], Path]:
    """Codex's environment (its CODEX_HOME holding the config) and a work folder."""
    home = folder / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(codex_config(horde.url))
    env = client_environment(home, CODEX_HOME=str(home / ".codex"), HORDE_API_KEY=horde.key)
    (folder / "work").mkdir()
    return env, folder / "work"


async def codex_exec(codex: Path, horde: Horde, folder: Path, prompt: str) -> Done:
    env, work = codex_set_up(horde, folder)
    return await run_client([str(codex), "exec", "--skip-git-repo-check", prompt], env, work)


async def test_codex_exec_prints_the_workers_answer_and_exits_0(
    codex: Path, horde: Horde, tmp_path: Path
) -> None:
    before = len(horde.chats())
    done = await codex_exec(codex, horde, tmp_path, "Say hello")
    assert done.code == 0, done
    [chat] = horde.chats()[before:]
    assert answer_to(chat) == "echo: Say hello"
    assert done.out.strip() == "echo: Say hello", done


async def test_codex_exec_runs_the_shell_command_the_worker_calls_and_prints_its_answer(
    codex: Path, horde: Horde, tmp_path: Path
) -> None:
    prompt = "call exec_command, then say what it printed"
    before = len(horde.chats())
    done = await codex_exec(codex, horde, tmp_path, prompt)
    assert done.code == 0, done
    asked, answered = horde.chats()[before:]
    assert "exec_command" in [t["function"]["name"] for t in asked["tools"]]
    [result] = tool_messages(answered)
    assert TOOL_OUTPUT in result
    assert done.out.strip() == f"echo: {prompt}", done


# Claude Code -----------------------------------------------------------------------


def claude_set_up(horde: Horde, folder: Path) -> tuple[dict[str, str], Path]:
    """Claude Code's environment and a work folder."""
    home = folder / "home"
    home.mkdir()
    (folder / "work").mkdir()
    env = client_environment(
        home,
        ANTHROPIC_BASE_URL=horde.url,
        ANTHROPIC_API_KEY=horde.key,
        # Claude Code asks an effort on every call, which the fake worker
        # does not declare: best_effort takes it as a hint (decision 0079).
        ANTHROPIC_CUSTOM_HEADERS=f"X-Horde-Options: {BEST_EFFORT}",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    return env, folder / "work"


async def claude_print(claude: Path, horde: Horde, folder: Path, prompt: str, *flags: str) -> Done:
    env, work = claude_set_up(horde, folder)
    command = [str(claude), "-p", prompt, "--model", MODEL, *flags]
    return await run_client(command, env, work)


async def test_claude_print_prints_the_workers_answer_and_exits_0(
    claude: Path, horde: Horde, tmp_path: Path
) -> None:
    before = len(horde.chats())
    done = await claude_print(claude, horde, tmp_path, "Say hello")
    assert done.code == 0, done
    [chat] = horde.chats()[before:]
    answer = answer_to(chat)
    assert answer.endswith("Say hello")
    assert done.out.strip() == answer.strip(), done


async def test_claude_print_runs_the_bash_command_the_worker_calls_and_prints_its_answer(
    claude: Path, horde: Horde, tmp_path: Path
) -> None:
    prompt = "call Bash, then say what it printed"
    before = len(horde.chats())
    done = await claude_print(claude, horde, tmp_path, prompt, "--allowedTools", "Bash(x)")
    assert done.code == 0, done
    asked, answered = horde.chats()[before:]
    assert "Bash" in [t["function"]["name"] for t in asked["tools"]]
    [result] = tool_messages(answered)
    assert TOOL_OUTPUT in result
    answer = answer_to(answered)
    assert answer.endswith(prompt)
    assert done.out.strip() == answer.strip(), done
