"""Faults of real processes (issue 9, "fault tests").

* ``hordelite serve`` killed with SIGKILL while clients submit text and chat
  requests and two workers pop and submit, then restarted on the same
  database (SQLite and PostgreSQL): every request whose submit was answered
  202 is still known by its status route and ends done or faulted, every
  submit a worker was answered is stored with the reward it was told, and
  the ledger balances to the kudo.
* ``hordelite worker`` killed with SIGKILL while its backend generates: the
  job goes back to the queue when its lease ends (not before), and another
  worker serves it; the requester pays once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from anyio.streams.text import TextReceiveStream

from hordelite.config import Config
from hordelite.contract.limits import ANONYMOUS_API_KEY
from hordelite.contract.models import ModelReference
from hordelite.horde.service import Horde, hash_key, new_api_key
from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.testing import FakeBackendConfig, FakeChatWorker, open_fake_backend
from tests.integration._env import TLS, open_env
from tests.integration._helpers import serve_environment
from tests.integration._ledger import ledger_errors, settled_jobs

pytestmark = pytest.mark.anyio

MODEL = "fake-chat-model"  # the fake chat workers' model, for text and chat alike
START_DEADLINE = 20.0
STOP_DEADLINE = 15.0
# The lease of a popped job: the jobs in hand at the kill come back this long
# after their pop, so it bounds the recovery (the load's jobs take milliseconds).
JOB_TTL = 3.0
SWEEP_INTERVAL = 0.2
# The kill comes once this much has been answered: requests queued and jobs settled.
ACKED_BEFORE_KILL = 40
SETTLED_BEFORE_KILL = 12
LOAD_DEADLINE = 20.0
RECOVERY_DEADLINE = 25.0


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_schema_url")  # type: ignore[no-any-return]
    return str(tmp_path / "crash.db")


# hordelite serve as a process --------------------------------------------------------


@dataclasses.dataclass
class Served:
    process: anyio.abc.Process
    url: str


async def _serving_url(process: anyio.abc.Process) -> str:
    """The URL of the start banner (read up to its last line)."""
    assert process.stdout is not None
    text = ""
    with anyio.fail_after(START_DEADLINE):
        async for chunk in TextReceiveStream(process.stdout):
            text += chunk
            if "keys create" in text:
                break
        else:
            pytest.fail(f"hordelite serve exited before its banner: {text!r}")
    url = next(w for w in text.split() if w.startswith("http://"))
    return url


@contextlib.asynccontextmanager
async def serve(config: Path, log: Path) -> AsyncIterator[Served]:
    """``hordelite serve`` with ``config`` until the block exits (killed then, if still up)."""
    with log.open("a", encoding="utf-8") as stderr:
        process = await anyio.open_process(
            [sys.executable, "-m", "hordelite", "--config", str(config), "serve"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=config.parent,
            env=serve_environment(),
        )
        try:
            yield Served(process, await _serving_url(process))
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True):
                await process.aclose()


def write_config(path: Path, database: str, backend: str) -> Path:
    horde = {
        "job_ttl": JOB_TTL,
        "sweep_interval": SWEEP_INTERVAL,
        # No in-flight limit: the load must not be refused for its volume.
        "concurrency": 0,
        "anonymous_concurrency": 0,
    }
    lines = [
        "[server]",
        'host = "127.0.0.1"',
        "port = 0",
        f'backend = "{backend}"',
        "grace_period = 1",
        "[storage]",
        # A JSON string is a TOML basic string.
        f"database = {json.dumps(database)}",
        "[horde]",
        *(f"{key} = {value}" for key, value in horde.items()),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@dataclasses.dataclass
class Account:
    id: int
    key: str
    kudos: float


def create_accounts(database: str, kudos: dict[str, float]) -> dict[str, Account]:
    """Users created in the database before the horde starts, and the anonymous one."""
    db = Database(database, 1)
    try:
        Horde(Config(), db).migrate()
        accounts = {"anonymous": Account(0, ANONYMOUS_API_KEY, 0.0)}
        for name, amount in kudos.items():
            key = new_api_key()
            user_id = db.run_sync(
                queries.create_user, True, name, hash_key(key), amount, False, False, time.time()
            )
            accounts[name] = Account(user_id, key, amount)
        return accounts
    finally:
        db.dispose()


# The load ----------------------------------------------------------------------------


@dataclasses.dataclass
class Load:
    """What the clients were answered."""

    acked: dict[str, str] = dataclasses.field(default_factory=dict)  # request id -> kind
    rewards: dict[str, float] = dataclasses.field(default_factory=dict)  # job id -> reward
    # Set just before the kill: from then on a broken connection ends a task.
    killed: bool = False
    enough: anyio.Event = dataclasses.field(default_factory=anyio.Event)

    def check(self) -> None:
        if len(self.acked) >= ACKED_BEFORE_KILL and len(self.rewards) >= SETTLED_BEFORE_KILL:
            self.enough.set()


def request_body(kind: str, i: int) -> dict[str, Any]:
    if kind == "chat":
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Name colour number {i}."}],
            "max_tokens": 32,
        }
    return {"prompt": f"Tell story number {i}", "params": {"max_length": 32}, "models": [MODEL]}


async def submitter(url: str, key: str, load: Load) -> None:
    """Queue text and chat requests in turn until the horde is killed."""
    async with httpx.AsyncClient(base_url=url, verify=TLS, timeout=30) as client:
        for i in range(10**6):
            kind = "chat" if i % 2 else "text"
            try:
                response = await client.post(
                    f"/api/v2/generate/{kind}/async",
                    headers={"apikey": key},
                    json=request_body(kind, i),
                )
            except httpx.TransportError:
                if load.killed:
                    return
                raise
            assert response.status_code == 202, response.text
            load.acked[response.json()["id"]] = kind
            load.check()


async def work(
    url: str,
    key: str,
    name: str,
    load: Load,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Pop and answer jobs (text and chat) until the horde is killed or the
    task is cancelled; each reward answered is recorded. Started once its
    first pop is answered: the worker is online, its model known."""
    async with FakeChatWorker(url, key, name=name, model_id=MODEL) as worker:
        online = False
        while True:
            try:
                job = await worker.pop(wait=0 if not online else 1)
                if not online:
                    online = True
                    task_status.started()
                if job["id"] is None:
                    continue
                if job.get("chat"):
                    response = await worker.submit_reply(job, worker.reply(job))
                    response.raise_for_status()
                    reward = response.json()["reward"]
                else:
                    answer = await worker.submit(job["id"], f"Once upon {job['id']}", seed=1)
                    reward = answer["reward"]
            except httpx.TransportError:
                if load.killed:
                    return
                raise
            load.rewards[job["id"]] = reward
            load.check()


async def status_of(client: httpx.AsyncClient, kind: str, request_id: str) -> dict[str, Any]:
    response = await client.get(f"/api/v2/generate/{kind}/status/{request_id}")
    assert response.status_code == 200, f"{kind} request {request_id}: {response.text}"
    return response.json()  # type: ignore[no-any-return]


# The kill cuts the load's POSTs mid-send: httpx then leaves its request
# body's async generator (ByteStream.__aiter__) to the garbage collector,
# which trio reports whenever it runs. That is the client's side of a
# connection killed on purpose, not the horde's.
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object ByteStream.__aiter__"
    ":pytest.PytestUnraisableExceptionWarning"
)
async def test_kill_9_under_load_loses_no_acknowledged_request_and_keeps_the_ledger(
    tmp_path: Path, database: str, anyio_backend: str
) -> None:
    config = write_config(tmp_path / "serve.toml", database, anyio_backend)
    accounts = create_accounts(database, {"alice": 1000.0, "carol": 0.0, "bob": 0.0})
    requesters = [accounts[name].key for name in ("alice", "carol", "anonymous")]
    load = Load()

    # Under load, then SIGKILL.
    async with serve(config, tmp_path / "killed.log") as served:
        async with anyio.create_task_group() as tg:
            await tg.start(work, served.url, accounts["bob"].key, "bob-worker", load)
            await tg.start(work, served.url, accounts["alice"].key, "alice-worker", load)
            for key in requesters:
                tg.start_soon(submitter, served.url, key, load)
            with anyio.fail_after(LOAD_DEADLINE):
                await load.enough.wait()
            load.killed = True
            served.process.kill()
            assert await served.process.wait() == -signal.SIGKILL
    acked_at_kill, settled_at_kill = len(load.acked), len(load.rewards)

    # Restarted on the same database: the workers serve what is left, and
    # the jobs in hand at the kill come back when their leases end.
    load.killed = False
    ended: dict[str, dict[str, Any]] = {}
    log = tmp_path / "restarted.log"
    async with serve(config, log) as served:
        async with (
            httpx.AsyncClient(base_url=served.url, verify=TLS, timeout=30) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(work, served.url, accounts["bob"].key, "bob-worker", load)
            tg.start_soon(work, served.url, accounts["alice"].key, "alice-worker", load)
            with anyio.fail_after(RECOVERY_DEADLINE):
                while len(ended) < len(load.acked):
                    for request_id, kind in load.acked.items():
                        if request_id not in ended:
                            status = await status_of(client, kind, request_id)
                            if status["done"] or status["faulted"]:
                                ended[request_id] = status
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        served.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(STOP_DEADLINE):
            assert await served.process.wait() == 0, log.read_text()

    assert acked_at_kill >= ACKED_BEFORE_KILL
    assert settled_at_kill >= SETTLED_BEFORE_KILL
    assert set(ended) == set(load.acked)
    # The restarted horde met nothing it could not handle.
    assert "Traceback" not in log.read_text(), log.read_text()
    db = Database(database, 1)
    try:
        stored = db.run_sync(settled_jobs, False)
        errors = db.run_sync(
            ledger_errors,
            False,
            {a.id: a.kudos for a in accounts.values()},
            ModelReference.load().billions,
        )
    finally:
        db.dispose()
    # Every submit a worker was answered is stored, done, with its reward.
    lost = {
        job_id: reward
        for job_id, reward in load.rewards.items()
        if stored.get(job_id) != ("done", reward)
    }
    assert not lost, f"answered submits not stored as answered: {lost}"
    assert not errors, "\n".join(errors)
    # The control: the ledger check reads the settled jobs this load produced.
    assert len(stored) >= len(load.rewards) >= SETTLED_BEFORE_KILL


# A worker killed mid-job ---------------------------------------------------------------

WORKER_NAME = "doomed-worker"
FAKE_MODEL = "fake-model"  # the fake backend's model id


async def _status_when(
    client: httpx.AsyncClient, request_id: str, ready: Any, deadline: float
) -> dict[str, Any]:
    with anyio.fail_after(deadline):
        while True:
            status = await status_of(client, "chat", request_id)
            if ready(status):
                return status
            await anyio.sleep(0.02)


async def test_a_worker_killed_mid_job_has_its_job_requeued_when_its_lease_ends(
    tmp_path: Path,
) -> None:
    ttl = 2.0
    async with (
        open_env(job_ttl=ttl, sweep_interval=0.1) as env,
        open_fake_backend(FakeBackendConfig(model=FAKE_MODEL)) as backend,
        httpx.AsyncClient(base_url=env.horde.url, verify=TLS, timeout=30) as client,
    ):
        log = tmp_path / "worker.log"
        with log.open("w", encoding="utf-8") as stderr:
            command = [sys.executable, "-m", "hordelite", "worker", "--horde", env.horde.url]
            command += ["--key", env.owner, "--name", WORKER_NAME, "--backend", backend.url]
            command += ["--wait", "1", "--grace-period", "0"]
            process = await anyio.open_process(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=tmp_path,
                env=serve_environment(),
            )
            try:
                # Online (it has popped once), then its backend stops answering.
                with anyio.fail_after(START_DEADLINE):
                    while (
                        await client.get(f"/api/v2/workers/name/{WORKER_NAME}")
                    ).status_code != 200:
                        assert process.returncode is None, log.read_text()
                        await anyio.sleep(0.05)
                backend.config.delay = 120
                seen = len(backend.requests)
                queued_at = time.time()
                response = await client.post(
                    "/api/v2/generate/chat/async",
                    headers={"apikey": env.requester},
                    json={
                        "model": FAKE_MODEL,
                        "messages": [{"role": "user", "content": "Name one colour."}],
                        "max_tokens": 16,
                    },
                )
                assert response.status_code == 202, response.text
                request_id = response.json()["id"]
                # Mid-job: the worker popped it and its backend is generating.
                with anyio.fail_after(START_DEADLINE):
                    while True:
                        paths = [r["path"] for r in backend.requests[seen:]]
                        if "/v1/chat/completions" in paths:
                            break
                        await anyio.sleep(0.02)
                process.kill()
                assert await process.wait() == -signal.SIGKILL
            finally:
                if process.returncode is None:
                    process.kill()
                with anyio.CancelScope(shield=True):
                    await process.aclose()
        backend.config.delay = 0

        # The job is in the dead worker's hands until its lease ends (it was
        # popped after queued_at), then back in the queue.
        status = await status_of(client, "chat", request_id)
        if time.time() < queued_at + ttl:
            assert status["processing"] == 1, status
            assert status["waiting"] == 0, status
        requeued = await _status_when(
            client,
            request_id,
            lambda s: s["waiting"] == 1 and s["processing"] == 0,
            ttl + 5,
        )
        requeued_at = time.time()
        assert requeued["restarted"] == 1
        assert not requeued["done"]
        assert not requeued["faulted"]
        assert requeued_at - queued_at >= ttl, "requeued before the lease could end"
        dead = (await client.get(f"/api/v2/workers/name/{WORKER_NAME}")).json()
        assert dead["uncompleted_jobs"] == 1
        assert dead["requests_fulfilled"] == 0

        # Another worker serves it; the requester pays for that job only.
        async with FakeChatWorker(
            env.horde.url, env.owner, name="live-worker", model_id=FAKE_MODEL
        ) as live:
            job = await live.serve_one(wait=5)
            assert job is not None
            assert job.get("chat")
        done = await _status_when(client, request_id, lambda s: s["done"] or s["faulted"], 10)
        assert done["done"]
        assert not done["faulted"]
        assert [g["worker_name"] for g in done["generations"]] == ["live-worker"]
        user = (await client.get("/api/v2/find_user", headers={"apikey": env.requester})).json()
        assert user["kudos"] == round(100 - done["kudos"], 2)
        assert done["kudos"] > 0
