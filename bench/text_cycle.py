"""Throughput and latency of hordelite's text cycle, against a real `hordelite serve`.

This process is the load generator. Each phase starts its own server as a child
process (``python -m hordelite --config <tmp toml> serve``, port 0, a fresh
SQLite file in a temporary folder), so the load generator never shares the
server's GIL and no phase sees another's leftovers.

Figures, each with its target:

(a) Completed text requests per second through the whole cycle (POST async,
    long-polled POST pop with "wait", POST submit, GET status every
    ``--poll-interval`` until done) with ``--requesters`` clients and
    ``--workers`` workers for ``--duration`` seconds, next to the rate of a
    no-op route (GET /api/v2/status/heartbeat, no database) at the same
    concurrency. The ratio  cycle rate / (no-op rate / HTTP requests per
    cycle)  is the share of the server's bare HTTP capacity the cycle's
    requests keep; requests per cycle are counted as actually made.
    Target: >= 0.40. Latency: p50/p95 from sending the async POST to the
    worker's submit being answered (the request is done then), and to the
    requester's poll seeing it done (which adds up to a poll interval).
(b) p50 of a pop without wait by a worker serving model "m", with 100 and with
    100,000 waiting requests that it cannot serve (another model) or can serve
    (model "m": each pop takes one, and one is added back untimed so the queue
    stays at its size). The queue is filled straight into the database
    through hordelite.storage. Target: p50 at 100,000 <= 2 x p50 at 100.
(c) Long-poll wake latency: a worker waits in a pop with "wait": 10; a request
    is submitted; time from sending the async POST to the pop's answer.
    Target: p50 <= 20 ms.
(d) The server's CPU per status read: with 4 requests waiting (queued, never
    popped) and 4 done (queued, popped, submitted), ``--requesters`` clients
    read GET /api/v2/status/heartbeat, then GET
    /api/v2/generate/text/status/{id} of the waiting ones, then of the done
    ones (client i reads request i mod 4), then the same in reverse order,
    each run a quarter of ``--duration``. Server CPU seconds (from /proc)
    divided by the requests answered, per kind. Target: status CPU per
    request / heartbeat CPU per request <= 1.5, for waiting and for done.
(e) The cycle as AI Horde clients run it: ``--requesters`` requesters as in
    (a) (POST async, GET status every ``--poll-interval`` until done, the
    next), and ``--workers`` workers that pop as koboldcpp's embedded worker
    does, its body field for field and no "wait": on a job they submit at
    once and pop again, on an empty pop they pause ``--idle-pause`` (0.1 s;
    koboldcpp pauses 1 s, then 2 s and 3 s after 10 and 25 empty pops in a
    row, and 0.1 s after each job while it generates). Completed requests/s,
    p50/p95 from the async POST to the poll that sees it done, the server's
    cores busy, and the rate the requesters' pacing alone allows (each
    request needs at least one poll interval: requesters / poll interval).
    Targets: p50 <= 110 ms, server < 0.90 cores.

``--status-wait [N]`` makes the requesters of (a) and (e) long-poll GET
.../status/{id}?wait=N (5 s by default) instead of polling, to compare the
two once the server holds such reads. An answer not done that came back in
under 40 ms was not held (a server that ignores ``wait`` answers at once),
and the requester then waits the poll interval before the next read, so
the loop stays paced on any server.

For each measurement the table also shows the CPU that the server, this load
generator and everything else on the machine used (from /proc, so Linux
only): if the client is the busy one, the figure measures the client. The
exit status is 1 when a target is missed.

    .venv/bin/python bench/text_cycle.py              # the default run, about 2 minutes
    .venv/bin/python bench/text_cycle.py --help

HORDELITE_BENCH_PROFILE=DIR runs each server under cProfile in every thread
(CPU time), writes DIR/<phase>.prof and prints the server's hot spots after
the phase. The profiler slows the server several times over: read the hot
spots as shares, not the figures of that run.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import functools
import io
import json
import os
import pstats
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import httpx
from _common import (  # bench/ is on sys.path
    POSTGRES_ENV,
    REDIS_DB,
    REDIS_ENV,
    STORAGES,
    machine_cpu,
    never_refusing_budgets,
    process_cpu,
    process_tree,
    speed_unjudged,
    stop_process,
    storage_urls,
)
from sqlalchemy import Connection, insert, select

from hordelite.cli import main as hordelite_cli
from hordelite.config import load_config
from hordelite.contract import kudos as kudos_rules
from hordelite.contract.limits import UPFRONT_MAX_LENGTH
from hordelite.contract.text import parse_text_request
from hordelite.horde.service import Horde, hash_key, new_text_request
from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.storage.schema import queue, requests

MODEL = "m"  # the model every bench worker serves
OTHER_MODEL = "other"  # the model of the requests in (b) that it cannot serve
CLIENT_AGENT = "hordelite-bench:1:local"
PROFILE_ENV = "HORDELITE_BENCH_PROFILE"
# argv[1] that makes this script run a server under cProfile (see serve_profiled).
PROFILED_SERVER = "--serve-profiled"

# Fewest timed pops per queue size in (b), whatever the time budget.
MIN_POPS = 20

TARGET_RATIO = 0.40
TARGET_POP_GROWTH = 2.0
TARGET_WAKE_MS = 20.0
TARGET_STATUS_COST = 1.5  # (d): server CPU per status read / per heartbeat
TARGET_HORDE_P50_MS = 110.0  # (e): async POST -> the poll that sees it done
TARGET_HORDE_CPU = 0.90  # (e): the server's cores busy on average

# With --status-wait: a status answer back sooner than this was not held by
# the server (see poll_until_done).
LONG_POLL_HELD = 0.04
# (e)'s rate counts as held down by the requesters' pacing when their poll
# pauses fill at least this share of a cycle's time: the answers and the
# wait for a worker's pop add little, so a faster server would not make
# many more cycles.
PACED_SHARE = 0.75


def text_request(model: str, prompt: str = "Once upon a time, a benchmark") -> dict[str, Any]:
    return {
        "prompt": prompt,
        "params": {"max_length": 32, "max_context_length": 1024},
        "models": [model],
    }


def pop_body(name: str, wait: float = 0) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "models": [MODEL],
        "max_length": 512,
        "max_context_length": 4096,
        "bridge_agent": CLIENT_AGENT,
    }
    if wait:
        body["wait"] = wait
    return body


def submit_body(job_id: str) -> dict[str, Any]:
    return {"id": job_id, "generation": "there was a fast queue.", "state": "ok", "seed": 1}


# HTTP clients ---------------------------------------------------------------


class Http(Protocol):
    async def call(
        self, method: str, path: str, body: Any = None, apikey: str = ""
    ) -> tuple[int, Any]:
        """Send one request; returns (HTTP status, decoded JSON answer)."""
        ...


# Seconds idle after which the lean client reconnects (see LeanHttp.call).
IDLE_RECONNECT = 4.0


class LeanHttp:
    """One keep-alive HTTP/1.1 connection, one request at a time.

    Only what the bench needs from a client: JSON bodies, Content-Length
    framing (Hypercorn frames every hordelite answer so) and a reconnect after
    an answer with ``connection: close`` (Hypercorn sends one every 1,000
    requests). Why not httpx: on asyncio with 20 pooled connections it spent
    about 1.9 ms of client CPU per request here, against the server's 0.55 ms
    per heartbeat, so the no-op figure measured the client; this client spends
    about 0.1 ms. ``--client httpx`` runs the same phases over httpx.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._stream: anyio.abc.SocketStream | None = None
        self._buffer = b""
        self._last_used = 0.0

    async def _connection(self) -> anyio.abc.SocketStream:
        """The open connection, or a new one when there is none or it has been idle."""
        if self._stream is not None and time.monotonic() - self._last_used > IDLE_RECONNECT:
            # The server closes a connection idle for server.keep_alive_timeout
            # (5 s): open a new one rather than race that close, as HTTP
            # clients' pools do.
            await self.aclose()
        if self._stream is None:
            self._stream = await anyio.connect_tcp(self._host, self._port)
            self._buffer = b""
        return self._stream

    async def call(
        self, method: str, path: str, body: Any = None, apikey: str = ""
    ) -> tuple[int, Any]:
        stream = await self._connection()
        payload = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} /api/v2{path} HTTP/1.1\r\nhost: {self._host}\r\n"
            f"apikey: {apikey}\r\nclient-agent: {CLIENT_AGENT}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
        )
        await stream.send(head.encode() + payload)
        status, answer = await self._read_answer()
        self._last_used = time.monotonic()
        return status, json.loads(answer)

    async def _read_answer(self) -> tuple[int, bytes]:
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            await self._receive()
        lines = self._buffer[:end].decode("latin-1").lower().split("\r\n")
        self._buffer = self._buffer[end + 4 :]
        status = int(lines[0].split(" ", 2)[1])
        headers = dict(line.split(":", 1) for line in lines[1:])
        length = int(headers["content-length"])
        while len(self._buffer) < length:
            await self._receive()
        answer, self._buffer = self._buffer[:length], self._buffer[length:]
        if headers.get("connection", "").strip() == "close":
            await self.aclose()
        return status, answer

    async def _receive(self) -> None:
        assert self._stream is not None
        try:
            self._buffer += await self._stream.receive(65536)
        except anyio.EndOfStream:
            raise ConnectionError(
                "the server closed the connection in the middle of an answer"
            ) from None

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()


class HttpxHttp:
    """The same calls over a shared httpx.AsyncClient and its connection pool."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def call(
        self, method: str, path: str, body: Any = None, apikey: str = ""
    ) -> tuple[int, Any]:
        response = await self._client.request(method, path, json=body, headers={"apikey": apikey})
        return response.status_code, response.json()


LeanT = TypeVar("LeanT", bound=LeanHttp)


@contextlib.asynccontextmanager
async def lean_clients(
    kind: type[LeanT], url: str | Sequence[str], count: int
) -> AsyncIterator[list[LeanT]]:
    """``count`` clients of ``url``; of several URLs (replicas of one horde),
    client i on url[i mod n], as a load balancer spreads clients round-robin."""
    urls = [url] if isinstance(url, str) else url
    clients = [kind(urls[i % len(urls)]) for i in range(count)]
    try:
        yield clients
    finally:
        with anyio.CancelScope(shield=True):
            for client in clients:
                await client.aclose()


@contextlib.asynccontextmanager
async def open_clients(
    kind: str, url: str | Sequence[str], count: int
) -> AsyncIterator[list[Http]]:
    """``count`` clients, one per concurrent task (the lean ones spread over
    several URLs as ``lean_clients`` does)."""
    if kind == "httpx":
        if not isinstance(url, str):
            raise ValueError("the httpx client serves one URL")
        limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
        async with httpx.AsyncClient(
            base_url=url + "/api/v2",
            limits=limits,
            timeout=60,
            headers={"Client-Agent": CLIENT_AGENT},
        ) as shared:
            yield [HttpxHttp(shared) for _ in range(count)]
        return
    async with lean_clients(LeanHttp, url, count) as lean:
        yield list(lean)


async def expect(status: int, call: Awaitable[tuple[int, Any]]) -> Any:
    """The answer of a call that must have ``status``; anything else stops the bench."""
    got, answer = await call
    if got != status:
        raise RuntimeError(f"expected HTTP {status}, got {got}: {answer}")
    return answer


async def post_text(http: Http, key: str, body: dict[str, Any] | None = None) -> str:
    """POST /generate/text/async (``body`` or a request for MODEL); returns the request's id."""
    body = body or text_request(MODEL)
    answer = await expect(202, http.call("POST", "/generate/text/async", body, key))
    return str(answer["id"])


async def pop(http: Http, key: str, name: str, wait: float = 0) -> dict[str, Any]:
    """POST /generate/text/pop; returns the pop answer (its "id" is None when empty)."""
    answer: dict[str, Any] = await expect(
        200, http.call("POST", "/generate/text/pop", pop_body(name, wait), key)
    )
    return answer


async def submit(http: Http, key: str, job_id: str) -> None:
    """POST /generate/text/submit with a generation for the job."""
    await expect(200, http.call("POST", "/generate/text/submit", submit_body(job_id), key))


# CPU accounting -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CpuUse:
    """Cores kept busy on average during one measurement."""

    wall: float
    server: float
    client: float
    others: float


@contextlib.contextmanager
def cpu_use(server_pid: int, into: list[CpuUse]) -> Iterator[None]:
    """Append to ``into`` the CPU use of the server, this process and the rest."""
    wall, srv, cli, total = (
        time.perf_counter(),
        process_cpu(server_pid),
        process_cpu(os.getpid()),
        machine_cpu(),
    )
    yield
    wall = time.perf_counter() - wall
    srv = process_cpu(server_pid) - srv
    cli = process_cpu(os.getpid()) - cli
    total = machine_cpu() - total
    into.append(CpuUse(wall, srv / wall, cli / wall, max(total - srv - cli, 0.0) / wall))


# The server -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Server:
    name: str
    url: str
    pid: int
    config: Path


@contextlib.contextmanager
def running_server(
    workdir: Path,
    name: str,
    backend: str,
    database: str | None = None,
    signals_url: str | None = None,
    serve_args: Sequence[str] = (),
    extra: dict[str, dict[str, Any]] | None = None,
    source: Path | None = None,
) -> Iterator[Server]:
    """``hordelite serve [serve_args]`` on ``database`` (by default a fresh
    SQLite file) with ``signals_url`` (by default the configuration's default);
    SIGTERM and wait on exit, for it and for any process it started.
    ``extra``: more configuration sections (``{"budgets": {...}}``);
    ``source``: another hordelite tree the server runs from (``PYTHONPATH``),
    a baseline to compare with in the same run."""
    config = workdir / f"{name}.toml"
    sections: dict[str, dict[str, Any]] = {
        "server": {"host": "127.0.0.1", "port": 0, "backend": backend, "grace_period": 1.0},
        "storage": {"database": database or f"{workdir / name}.db"},
        # Where a server on SQLite keeps them anyway; one on PostgreSQL would
        # use the current directory. Replicas of one horde share it.
        "blobs": {"directory": str(workdir / "hordelite-blobs")},
    }
    if signals_url is not None:
        sections["signals"] = {"url": signals_url}
    # Budgets that never refuse, yet are checked (a tree without budgets
    # gets none): a bench's one worker key stands for many owners
    # (connections.py opens 1,000 workers under it), one requester key for
    # many clients.
    budgets = never_refusing_budgets()
    if budgets:
        sections["budgets"] = budgets
    if moderation := speed_unjudged():
        sections["moderation"] = moderation
    for section, keys in (extra or {}).items():
        sections[section] = {**sections.get(section, {}), **keys}
    config.write_text(
        "".join(
            f"[{section}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
            for section, keys in sections.items()
        )
    )
    command = [sys.executable, "-m", "hordelite", "--config", str(config), "serve", *serve_args]
    profile_dir = os.environ.get(PROFILE_ENV)
    if profile_dir:
        out = Path(profile_dir).resolve() / f"{name}.prof"
        command = [sys.executable, __file__, PROFILED_SERVER, str(out), *command[3:]]
    log = (workdir / f"{name}.log").open("w")
    # ``python -m`` puts the working directory first on sys.path, before
    # PYTHONPATH: the server of another tree starts in that tree.
    env = None if source is None else {**os.environ, "PYTHONPATH": str(source)}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=source
    )
    try:
        url = _served_url(proc, workdir / f"{name}.log")
        yield Server(name, url, proc.pid, config)
    finally:
        descendants = process_tree(proc.pid)[1:]
        stop_process(proc, 30)
        for pid in descendants:  # a process the server started, left behind
            with contextlib.suppress(OSError):
                if "hordelite" in Path(f"/proc/{pid}/cmdline").read_text():
                    os.kill(pid, signal.SIGTERM)
        log.close()
        if profile_dir:
            print_hot_spots(Path(profile_dir).resolve() / f"{name}.prof", name)


def _served_url(proc: subprocess.Popen[str], log: Path) -> str:
    """The URL from the server's "serving at" line (the server prints it once it listens)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if " serving at " in line:
            return line.split(" serving at ", 1)[1].split()[0]
    raise RuntimeError(f"the server exited before serving:\n{log.read_text()[-3000:]}")


def create_key(server: Server, name: str) -> str:
    """A new user's API key, made by the ``hordelite keys create`` command."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = hordelite_cli(["--config", str(server.config), "keys", "create", name])
    if code != 0:
        raise RuntimeError(f"hordelite keys create {name} failed: {out.getvalue()}")
    [key_line] = [line for line in out.getvalue().splitlines() if line.startswith("API key")]
    return key_line.rsplit(":", 1)[1].strip()


# (a) the whole cycle next to a no-op route ----------------------------------


@dataclasses.dataclass
class Window:
    """What happened between start and deadline of one timed run."""

    duration: float
    deadline: float = 0.0
    requests: dict[str, int] = dataclasses.field(default_factory=dict)
    # Seconds from sending a request to its requester seeing it done.
    latencies: list[float] = dataclasses.field(default_factory=list)
    # Seconds from sending a request to the worker's submit being answered
    # (the request is done on the server then), whatever the poll interval.
    done: list[float] = dataclasses.field(default_factory=list)
    sent: dict[str, float] = dataclasses.field(default_factory=dict)
    # Poll intervals the requesters paused for between status reads.
    pauses: int = 0

    def open(self) -> None:
        self.deadline = time.perf_counter() + self.duration

    def count(self, kind: str) -> bool:
        """Count one HTTP request of ``kind`` answered now; False once past the deadline."""
        if time.perf_counter() > self.deadline:
            return False
        self.requests[kind] = self.requests.get(kind, 0) + 1
        return True

    @property
    def total(self) -> int:
        return sum(self.requests.values())


Task = Callable[[], Coroutine[Any, Any, None]]


async def run_until_deadline(window: Window, tasks: Sequence[Task]) -> None:
    """Run ``tasks`` from now until the window's deadline, then cancel them."""
    window.open()
    with anyio.move_on_after(window.duration):
        async with anyio.create_task_group() as tg:
            for task in tasks:
                tg.start_soon(task)


async def measure_noop(url: str, args: argparse.Namespace) -> Window:
    window = Window(args.duration)
    concurrency = args.requesters + args.workers

    async with open_clients(args.client, url, concurrency) as clients:

        async def heartbeat(http: Http) -> None:
            while True:
                await expect(200, http.call("GET", "/status/heartbeat"))
                window.count("heartbeat")

        await run_until_deadline(window, [functools.partial(heartbeat, h) for h in clients])
    return window


async def request_cycles(
    http: Http, key: str, model: str, args: argparse.Namespace, window: Window
) -> None:
    """One requester: POST async a request for ``model``, poll its status until
    done, then the next, until the window's deadline."""
    while True:
        # A prompt of its own lets the worker tell when this request was sent.
        prompt = f"bench request {uuid.uuid4()}"
        sent = window.sent[prompt] = time.perf_counter()
        request_id = await post_text(http, key, text_request(model, prompt))
        window.count("async")
        if not await poll_until_done(http, f"/generate/text/status/{request_id}", args, window):
            return
        window.latencies.append(time.perf_counter() - sent)


async def poll_until_done(http: Http, path: str, args: argparse.Namespace, window: Window) -> bool:
    """GET the status ``path`` until it says done; False once past the window's deadline.

    Plain polling waits ``args.poll_interval`` before each read. With
    ``--status-wait N`` each read is a long poll, ``path?wait=N``, sent at
    once; an answer that came back not done within LONG_POLL_HELD was not
    held (a server that ignores ``wait``, or a change short of done), so the
    next read waits the poll interval, as plain polling would, rather than
    spin.
    """
    # chat_cycle.py's text runs pass their own flags, which have no --status-wait.
    wait = getattr(args, "status_wait", 0.0)
    query = f"?wait={wait:g}" if wait else ""
    while True:
        if not wait:
            window.pauses += 1
            await anyio.sleep(args.poll_interval)
        asked = time.perf_counter()
        status = await expect(200, http.call("GET", path + query))
        if not window.count("status"):
            return False
        if status["done"]:
            return True
        if wait and time.perf_counter() - asked < LONG_POLL_HELD:
            window.pauses += 1
            await anyio.sleep(args.poll_interval)


async def measure_cycle(
    url: str | Sequence[str], worker_key: str, requester_keys: list[str], args: argparse.Namespace
) -> Window:
    """(a)'s cycle; with several URLs, client i (workers first, then
    requesters) on url[i mod n]."""
    window = Window(args.duration)

    async def worker(http: Http, name: str) -> None:
        while True:
            job = await pop(http, worker_key, name, args.pop_wait)
            window.count("pop")
            if job["id"] is not None:
                await submit(http, worker_key, job["id"])
                if window.count("submit"):
                    sent = window.sent.pop(job["payload"]["prompt"])
                    window.done.append(time.perf_counter() - sent)

    async with open_clients(args.client, url, args.requesters + args.workers) as clients:
        workers, requesters = clients[: args.workers], clients[args.workers :]
        names = [f"bench-worker-{i}" for i in range(args.workers)]
        for http, name in zip(workers, names, strict=True):
            # Check in first, so that no request is queued before a worker is online.
            await pop(http, worker_key, name)
        tasks: list[Task] = [
            functools.partial(worker, http, name) for http, name in zip(workers, names, strict=True)
        ]
        tasks += [
            functools.partial(request_cycles, http, key, MODEL, args, window)
            for http, key in zip(requesters, requester_keys, strict=True)
        ]
        await run_until_deadline(window, tasks)
    return window


# (b) pop latency against a deep queue ---------------------------------------


class QueueFiller:
    """Writes waiting text requests into the server's database, as POST async would.

    One request goes through ``queries.submit_request`` (the query the server
    runs); the rest are bulk copies of its ``requests`` and ``queue`` rows,
    each with its own id, a later creation time and the priority key that
    time gives, so 100,000 requests take seconds, not 100,000 HTTP posts.
    """

    def __init__(self, server: Server, api_key: str, model: str) -> None:
        config = load_config(server.config)
        self.db = Database(config.storage.database, 1)
        horde = Horde(config, self.db)  # for its rules and pricing only: no server here
        # No in-flight limit: the bench's user stands for many users.
        self.rules = dataclasses.replace(horde.rules, concurrency=0)
        self.quote = horde.quote
        self.key_hash = hash_key(api_key)
        self.request = parse_text_request(text_request(model))
        self.size = 0

    def submit_one(self) -> str:
        request_id = str(uuid.uuid4())
        self.db.run_sync(
            queries.submit_request,
            True,
            self.key_hash,
            new_text_request(self.request, self.quote),
            request_id,
            time.time(),
            self.rules,
            UPFRONT_MAX_LENGTH,
            CLIENT_AGENT,
        )
        self.size += 1
        return request_id

    def fill_to(self, size: int, batch: int = 10_000) -> None:
        template = self.submit_one()
        while self.size < size:
            count = min(batch, size - self.size)
            self.db.run_sync(_copy_request, True, template, count, self.size)
            self.size += count

    def close(self) -> None:
        self.db.dispose()


def _copy_request(conn: Connection, template_id: str, count: int, offset: int) -> None:
    """``count`` copies of a waiting request and its queue rows, created one by one after it."""
    request = conn.execute(select(requests).where(requests.c.id == template_id)).mappings().one()
    queue_rows = (
        conn.execute(select(queue).where(queue.c.request_id == template_id)).mappings().all()
    )
    new_requests, new_queue = [], []
    for i in range(offset, offset + count):
        created = request["created"] + i * 1e-4
        order = {
            "created": created,
            "prio_key": kudos_rules.priority_key(request["priority"], created),
        }
        request_id = str(uuid.uuid4())
        new_requests.append({**request, **order, "id": request_id})
        for row in queue_rows:
            copy = {**row, **order, "request_id": request_id}
            del copy["id"]
            new_queue.append(copy)
    conn.execute(insert(requests), new_requests)
    conn.execute(insert(queue), new_queue)


async def measure_pops(
    server: Server, worker_key: str, filler: QueueFiller, servable: bool, args: argparse.Namespace
) -> tuple[dict[int, list[float]], dict[int, CpuUse]]:
    """Pop latencies (seconds) and CPU use for each queue size of ``args.queue_sizes``.

    Each size gets ``args.pops`` pops, or fewer (at least MIN_POPS) once
    ``args.pop_budget`` seconds have passed, so a slow pop cannot stretch the run.
    """
    latencies: dict[int, list[float]] = {}
    cpu: dict[int, CpuUse] = {}
    async with open_clients(args.client, server.url, 1) as (http,):
        await pop(http, worker_key, "bench-popper")  # check in
        for size in args.queue_sizes:
            await anyio.to_thread.run_sync(filler.fill_to, size)
            timed: list[float] = []
            latencies[size] = timed
            budget_end = time.perf_counter() + args.pop_budget
            use: list[CpuUse] = []
            with cpu_use(server.pid, use):
                while len(timed) < args.pops and (
                    len(timed) < MIN_POPS or time.perf_counter() < budget_end
                ):
                    start = time.perf_counter()
                    job = await pop(http, worker_key, "bench-popper")
                    timed.append(time.perf_counter() - start)
                    if (job["id"] is not None) != servable:
                        raise RuntimeError(f"a pop with {size} waiting requests answered {job}")
                    if servable:
                        # Untimed: put one back, so that the queue stays at its size.
                        filler.size -= 1
                        await anyio.to_thread.run_sync(filler.submit_one)
            cpu[size] = use[0]
    return latencies, cpu


# (c) long-poll wake latency -------------------------------------------------


async def measure_wake(
    url: str, worker_key: str, requester_key: str, args: argparse.Namespace
) -> list[float]:
    """Seconds from sending a request to the answer of a pop already waiting for it."""
    latencies = []
    async with open_clients(args.client, url, 2) as (worker, requester):
        await pop(worker, worker_key, "bench-waiter")  # check in
        for _ in range(args.wake_rounds):
            answered: list[tuple[float, dict[str, Any]]] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_for_job, worker, worker_key, answered)
                # Give the pop time to reach the server and park on the queue signal.
                await anyio.sleep(args.wake_settle)
                sent = time.perf_counter()
                await post_text(requester, requester_key)
            arrived, job = answered[0]
            if job["id"] is None:
                raise RuntimeError(f"the waiting pop came back empty: {job}")
            latencies.append(arrived - sent)
            await submit(worker, worker_key, job["id"])
    return latencies


async def wait_for_job(
    worker: Http, worker_key: str, answered: list[tuple[float, dict[str, Any]]]
) -> None:
    """Pop with "wait": 10; append (arrival time, pop answer) to ``answered``."""
    job = await pop(worker, worker_key, "bench-waiter", wait=10)
    answered.append((time.perf_counter(), job))


# (d) the server's CPU per status read, next to a heartbeat -----------------

# (d)'s timed reads in the order they run: mirrored, so that a drift in the
# machine's load falls on the three kinds alike.
STATUS_READS = ("heartbeat", "waiting", "done", "done", "waiting", "heartbeat")
# Each of them lasts this share of --duration (2.5 s of the default 10 s).
STATUS_READ_SHARE = 0.25
# Requests of each state (waiting, done) whose status (d)'s clients read.
STATUS_REQUESTS = 4


@dataclasses.dataclass
class ReadCost:
    """The requests answered and the server CPU they took, over the runs of one kind."""

    requests: int = 0
    server_seconds: float = 0.0
    uses: list[CpuUse] = dataclasses.field(default_factory=list)


async def measure_status_reads(
    server: Server, worker_key: str, requester_key: str, args: argparse.Namespace
) -> dict[str, ReadCost]:
    """Server CPU and requests answered for GET heartbeat and for GET status of
    unchanged waiting and done requests, ``args.requesters`` clients each."""
    async with open_clients(args.client, server.url, 1) as (setup,):
        worker = "bench-status-worker"
        await pop(setup, worker_key, worker)  # check in
        done = []
        for _ in range(STATUS_REQUESTS):
            done.append(await post_text(setup, requester_key))
            job = await pop(setup, worker_key, worker)
            if job["id"] is None:
                raise RuntimeError(f"the worker's pop came back empty: {job}")
            await submit(setup, worker_key, job["id"])
        # Queued after the worker's last pop, and nobody pops again: they wait.
        waiting = [await post_text(setup, requester_key) for _ in range(STATUS_REQUESTS)]
        for kind, ids in (("done", done), ("waiting", waiting)):
            for request_id in ids:
                status = await expect(200, setup.call("GET", f"/generate/text/status/{request_id}"))
                if not status[kind]:
                    raise RuntimeError(f"a request meant to be {kind} is not: {status}")
    paths = {
        "heartbeat": ["/status/heartbeat"],
        "waiting": [f"/generate/text/status/{request_id}" for request_id in waiting],
        "done": [f"/generate/text/status/{request_id}" for request_id in done],
    }
    costs = {kind: ReadCost() for kind in paths}

    async def read(http: Http, path: str, window: Window) -> None:
        while True:
            await expect(200, http.call("GET", path))
            window.count("read")

    for kind in STATUS_READS:
        window = Window(args.duration * STATUS_READ_SHARE)
        reads = [paths[kind][i % len(paths[kind])] for i in range(args.requesters)]
        # Fresh clients for each run: the end of a run cancels reads in flight,
        # which leaves their connections mid-answer.
        async with open_clients(args.client, server.url, args.requesters) as clients:
            for http, path in zip(clients, reads, strict=True):
                await expect(200, http.call("GET", path))  # connect, untimed
            tasks: list[Task] = [
                functools.partial(read, http, path, window)
                for http, path in zip(clients, reads, strict=True)
            ]
            use: list[CpuUse] = []
            with cpu_use(server.pid, use):
                await run_until_deadline(window, tasks)
        cost = costs[kind]
        cost.requests += window.total
        cost.server_seconds += use[0].server * use[0].wall
        cost.uses.append(use[0])
    return costs


def combined(uses: Sequence[CpuUse]) -> CpuUse:
    """The CPU use of several measurements taken as one."""
    wall = sum(use.wall for use in uses)
    return CpuUse(
        wall,
        sum(use.server * use.wall for use in uses) / wall,
        sum(use.client * use.wall for use in uses) / wall,
        sum(use.others * use.wall for use in uses) / wall,
    )


# (e) the cycle as AI Horde clients run it: koboldcpp's pops, no waits ------

# koboldcpp's embedded worker serves "koboldcpp/<its model>" and names itself so.
KOBOLD_MODEL = "koboldcpp/bench-model"
KOBOLD_AGENT = "KoboldCppEmbedWorker:2:https://github.com/LostRuins/koboldcpp"


def kobold_pop_body(name: str) -> dict[str, Any]:
    """The body of koboldcpp's embedded worker's pop, field for field: no "wait"."""
    return {
        "name": name,
        "models": [KOBOLD_MODEL],
        "max_length": 512,
        "max_context_length": 4096,
        "priority_usernames": [],
        "softprompts": [],
        "bridge_agent": KOBOLD_AGENT,
    }


async def measure_horde_cycle(
    url: str, worker_key: str, requester_keys: list[str], args: argparse.Namespace
) -> Window:
    """(a)'s requesters with workers that pop without wait, pausing ``args.idle_pause`` when idle."""
    window = Window(args.duration)

    async def worker(http: Http, name: str) -> None:
        while True:
            job = await expect(
                200, http.call("POST", "/generate/text/pop", kobold_pop_body(name), worker_key)
            )
            if job["id"] is None:
                window.count("empty pop")
                await anyio.sleep(args.idle_pause)
                continue
            window.count("pop")
            await submit(http, worker_key, job["id"])
            if window.count("submit"):
                window.done.append(time.perf_counter() - window.sent.pop(job["payload"]["prompt"]))

    async with open_clients(args.client, url, args.requesters + args.workers) as clients:
        workers, requesters = clients[: args.workers], clients[args.workers :]
        names = [f"bench-kobold-{i}" for i in range(args.workers)]
        for http, name in zip(workers, names, strict=True):
            # Check in first, so that no request is queued before a worker is online.
            await expect(
                200, http.call("POST", "/generate/text/pop", kobold_pop_body(name), worker_key)
            )
        tasks: list[Task] = [
            functools.partial(worker, http, name) for http, name in zip(workers, names, strict=True)
        ]
        tasks += [
            functools.partial(request_cycles, http, key, KOBOLD_MODEL, args, window)
            for http, key in zip(requesters, requester_keys, strict=True)
        ]
        await run_until_deadline(window, tasks)
    return window


# Running the phases ---------------------------------------------------------


@dataclasses.dataclass
class Report:
    rows: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    cpu: list[tuple[str, CpuUse]] = dataclasses.field(default_factory=list)
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)

    def add(self, figure: str, measured: str, target: str = "", passed: bool | None = None) -> None:
        verdict = "" if passed is None else ("PASS" if passed else "MISS")
        self.rows.append((figure, measured, target, verdict))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def percentile(values: Sequence[float], p: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


@contextlib.contextmanager
def stored_server(workdir: Path, name: str, args: argparse.Namespace) -> Iterator[Server]:
    """The server of (a) or (e) on the storage ``--storage`` names."""
    with (
        storage_urls(args.storage, str(workdir / f"{name}.db")) as (database, signals_url),
        running_server(workdir, name, args.server_backend, database, signals_url) as server,
    ):
        yield server


def run_cycle_phase(workdir: Path, args: argparse.Namespace, report: Report) -> None:
    with stored_server(workdir, "cycle", args) as server:
        worker_key = create_key(server, "bench-workers")
        requester_keys = [
            create_key(server, f"bench-requester-{i}") for i in range(args.requesters)
        ]
        cpu: list[CpuUse] = []
        with cpu_use(server.pid, cpu):
            noop = anyio.run(measure_noop, server.url, args, backend=args.client_backend)
        with cpu_use(server.pid, cpu):
            cycle = anyio.run(
                measure_cycle,
                server.url,
                worker_key,
                requester_keys,
                args,
                backend=args.client_backend,
            )
    report.cpu += [("(a) no-op heartbeat", cpu[0]), ("(a) text cycle", cpu[1])]
    noop_rate = noop.total / noop.duration
    cycles = len(cycle.latencies)
    if not cycles:
        raise RuntimeError("no text request completed its cycle")
    rate = cycles / cycle.duration
    per_cycle = cycle.total / cycles
    ratio = rate / (noop_rate / per_cycle)
    p50, p95 = percentile(cycle.done, 50), percentile(cycle.done, 95)
    seen50, seen95 = percentile(cycle.latencies, 50), percentile(cycle.latencies, 95)
    if args.status_wait:
        report.add("(a) status reads", status_reads(args))
    report.add("(a) no-op GET heartbeat", f"{noop_rate:.0f} req/s")
    report.add("(a) text cycles completed", f"{rate:.1f} /s")
    kinds = ", ".join(
        f"{kind} {cycle.requests.get(kind, 0) / cycles:.2f}"
        for kind in ("async", "pop", "submit", "status")
    )
    report.add("(a) HTTP requests per cycle", f"{per_cycle:.2f} ({kinds})")
    report.add("(a) cycle HTTP rate", f"{rate * per_cycle:.0f} req/s")
    report.add(
        "(a) ratio cycle / (no-op / req per cycle)",
        f"{ratio:.2f}",
        f">= {TARGET_RATIO:.2f}",
        ratio >= TARGET_RATIO,
    )
    report.add("(a) submit-to-done p50 / p95", f"{ms(p50)} / {ms(p95)}")
    report.add("(a) submit-to-seen-done p50 / p95", f"{ms(seen50)} / {ms(seen95)}")
    pacing = add_pacing(report, "(a)", args, rate, cycle.pauses / cycles, cpu[1].server)
    report.figures["cycle"] = {
        "noop_rps": noop_rate,
        "cycles_per_s": rate,
        "requests_per_cycle": per_cycle,
        "requests_by_kind": cycle.requests,
        "ratio": ratio,
        "latency_p50_ms": p50 * 1000,
        "latency_p95_ms": p95 * 1000,
        "seen_done_p50_ms": seen50 * 1000,
        "seen_done_p95_ms": seen95 * 1000,
        **pacing,
    }


def run_pop_phase(workdir: Path, args: argparse.Namespace, report: Report, servable: bool) -> None:
    kind = "servable" if servable else "unservable"
    with running_server(workdir, f"pop-{kind}", args.server_backend) as server:
        worker_key = create_key(server, "bench-worker")
        filler = QueueFiller(
            server, create_key(server, "bench-requester"), MODEL if servable else OTHER_MODEL
        )
        try:
            latencies, cpu = anyio.run(
                measure_pops,
                server,
                worker_key,
                filler,
                servable,
                args,
                backend=args.client_backend,
            )
        finally:
            filler.close()
    label = "can serve" if servable else "cannot serve"
    for size, use in cpu.items():
        report.cpu.append((f"(b) pops, {size:,} it {label}", use))
    medians = {size: statistics.median(values) for size, values in latencies.items()}
    small, large = min(medians), max(medians)
    for size, median in medians.items():
        pops = len(latencies[size])
        report.add(f"(b) pop p50, {size:,} waiting it {label}", f"{ms(median)} ({pops} pops)")
    growth = medians[large] / medians[small]
    report.add(
        f"(b) pop p50 growth {small:,} -> {large:,}, {kind}",
        f"x {growth:.2f}",
        f"<= x {TARGET_POP_GROWTH:.1f}",
        growth <= TARGET_POP_GROWTH,
    )
    report.figures[f"pop_{kind}"] = {str(size): median * 1000 for size, median in medians.items()}


def run_wake_phase(workdir: Path, args: argparse.Namespace, report: Report) -> None:
    with running_server(workdir, "wake", args.server_backend) as server:
        worker_key = create_key(server, "bench-worker")
        requester_key = create_key(server, "bench-requester")
        cpu: list[CpuUse] = []
        with cpu_use(server.pid, cpu):
            latencies = anyio.run(
                measure_wake,
                server.url,
                worker_key,
                requester_key,
                args,
                backend=args.client_backend,
            )
    report.cpu.append(("(c) long-poll wake", cpu[0]))
    p50 = statistics.median(latencies)
    report.add(
        "(c) long-poll wake p50",
        ms(p50),
        f"<= {TARGET_WAKE_MS:.0f} ms",
        p50 * 1000 <= TARGET_WAKE_MS,
    )
    report.add("(c) long-poll wake p95", ms(percentile(latencies, 95)))
    report.figures["wake_p50_ms"] = p50 * 1000


def run_status_phase(workdir: Path, args: argparse.Namespace, report: Report) -> None:
    with running_server(workdir, "status", args.server_backend) as server:
        worker_key = create_key(server, "bench-worker")
        requester_key = create_key(server, "bench-requester")
        costs = anyio.run(
            measure_status_reads,
            server,
            worker_key,
            requester_key,
            args,
            backend=args.client_backend,
        )
    labels = {
        "heartbeat": "GET /status/heartbeat",
        "waiting": "GET text status, waiting",
        "done": "GET text status, done",
    }
    per_request: dict[str, float] = {}
    for kind, cost in costs.items():
        if not cost.requests:
            raise RuntimeError(f"no {kind} read was answered in (d)")
        use = combined(cost.uses)
        report.cpu.append((f"(d) {kind} reads", use))
        per_request[kind] = cost.server_seconds / cost.requests
        report.add(
            f"(d) server CPU per {labels[kind]}",
            f"{ms(per_request[kind])} ({cost.requests / use.wall:.0f} req/s)",
        )
    report.figures["status_cost"] = {
        kind: {"cpu_ms_per_request": seconds * 1000} for kind, seconds in per_request.items()
    }
    for kind in ("waiting", "done"):
        ratio = per_request[kind] / per_request["heartbeat"]
        report.add(
            f"(d) CPU ratio status {kind} / heartbeat",
            f"{ratio:.2f}",
            f"<= {TARGET_STATUS_COST:.1f}",
            ratio <= TARGET_STATUS_COST,
        )
        report.figures["status_cost"][f"ratio_{kind}"] = ratio


def run_horde_phase(workdir: Path, args: argparse.Namespace, report: Report) -> None:
    with stored_server(workdir, "horde-style", args) as server:
        worker_key = create_key(server, "bench-workers")
        requester_keys = [
            create_key(server, f"bench-requester-{i}") for i in range(args.requesters)
        ]
        cpu: list[CpuUse] = []
        with cpu_use(server.pid, cpu):
            cycle = anyio.run(
                measure_horde_cycle,
                server.url,
                worker_key,
                requester_keys,
                args,
                backend=args.client_backend,
            )
    use = cpu[0]
    report.cpu.append(("(e) AI Horde style cycle", use))
    cycles = len(cycle.latencies)
    if not cycles:
        raise RuntimeError("no text request completed the AI Horde style cycle")
    rate = cycles / cycle.duration
    kinds = ("async", "pop", "empty pop", "submit", "status")
    per_kind = ", ".join(f"{kind} {cycle.requests.get(kind, 0) / cycles:.2f}" for kind in kinds)
    report.add("(e) status reads", status_reads(args))
    report.add("(e) AI Horde style cycles completed", f"{rate:.1f} /s")
    report.add("(e) HTTP requests per cycle", f"{cycle.total / cycles:.2f} ({per_kind})")
    p50, p95 = percentile(cycle.latencies, 50), percentile(cycle.latencies, 95)
    report.add(
        "(e) async-to-seen-done p50",
        ms(p50),
        f"<= {TARGET_HORDE_P50_MS:.0f} ms",
        p50 * 1000 <= TARGET_HORDE_P50_MS,
    )
    report.add("(e) async-to-seen-done p95", ms(p95))
    done50, done95 = percentile(cycle.done, 50), percentile(cycle.done, 95)
    report.add("(e) async-to-submitted p50 / p95", f"{ms(done50)} / {ms(done95)}")
    report.add(
        "(e) server CPU",
        f"{use.server:.2f} cores",
        f"< {TARGET_HORDE_CPU:.2f}",
        use.server < TARGET_HORDE_CPU,
    )
    pacing = add_pacing(report, "(e)", args, rate, cycle.pauses / cycles, use.server)
    report.figures["horde_style"] = {
        "cycles_per_s": rate,
        "requests_by_kind": cycle.requests,
        "seen_done_p50_ms": p50 * 1000,
        "seen_done_p95_ms": p95 * 1000,
        "submitted_p50_ms": done50 * 1000,
        "submitted_p95_ms": done95 * 1000,
        "server_cores": use.server,
        **pacing,
        "status_wait": args.status_wait,
    }


def status_reads(args: argparse.Namespace) -> str:
    if args.status_wait:
        return f"long polls, GET .../status/{{id}}?wait={args.status_wait:g}"
    return f"GET .../status/{{id}} every {ms(args.poll_interval)}"


def add_pacing(
    report: Report,
    phase: str,
    args: argparse.Namespace,
    rate: float,
    pauses_per_cycle: float,
    server_cores: float,
) -> dict[str, float | None]:
    """What the requesters' own pauses allow, the cycle time split into
    them and the rest, and which holds the rate down: the server, or the
    pacing (a fast server's cycle rate then stays put whatever it saves).
    Returns those figures for the JSON report."""
    pacing = None if args.status_wait else args.requesters / args.poll_interval
    if pacing is not None:
        report.add(
            f"{phase} requesters' pacing allows",
            f"<= {pacing:.0f} /s ({args.requesters} x one {ms(args.poll_interval)} poll "
            f"per cycle); measured {rate / pacing:.0%} of it",
        )
    # Little's law: every requester is always in a cycle.
    cycle_time = args.requesters / rate
    paused = pauses_per_cycle * args.poll_interval
    report.add(
        f"{phase} requester's cycle time",
        f"{ms(cycle_time)}: {ms(paused)} poll pauses, {ms(cycle_time - paused)} answers "
        "and waits for a pop",
    )
    report.add(f"{phase} rate limited by", horde_limit(server_cores, paused / cycle_time))
    return {
        "pacing_bound_per_s": pacing,
        "cycle_time_ms": cycle_time * 1000,
        "poll_pauses_ms": paused * 1000,
    }


def horde_limit(server_cores: float, paused_share: float) -> str:
    """What most likely holds a cycle's rate down, read from its figures."""
    paced = paused_share >= PACED_SHARE
    if server_cores >= TARGET_HORDE_CPU and paced:
        return (
            f"both: the server (saturated) and the requesters' pacing ({paused_share:.0%} "
            "of a cycle in poll pauses): a cheaper server shows little in the rate"
        )
    if server_cores >= TARGET_HORDE_CPU:
        return "the server (saturated)"
    if paced:
        return f"the requesters' pacing ({paused_share:.0%} of a cycle in poll pauses)"
    return f"neither alone: {paused_share:.0%} of a cycle in poll pauses, the rest answers and pops"


def print_report(report: Report, args: argparse.Namespace) -> None:
    rows = [("figure", "measured", "target", ""), *report.rows]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print()
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print()
    print(
        f"{'CPU, cores busy on average':38} {'wall':>7} {'server':>7} {'client':>7} {'others':>7}"
    )
    for name, use in report.cpu:
        print(f"{name:38} {use.wall:6.1f}s {use.server:7.2f} {use.client:7.2f} {use.others:7.2f}")
    print()
    print(
        f"machine: {os.cpu_count()} cores, {cpu_model()}; server backend {args.server_backend}, "
        f"client {args.client} on {args.client_backend}"
    )
    print("command:", shlex.join(["python", *sys.argv]))


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


# Profiling the server (HORDELITE_BENCH_PROFILE) -----------------------------


def serve_profiled(out: str, argv: list[str]) -> None:
    """Run ``hordelite <argv>`` with a cProfile profiler in every thread; write their sum to ``out``.

    The queries run in worker threads, so the main thread alone would miss
    them. The profilers count each thread's CPU time, not wall time: a thread
    waiting for the GIL, a lock or the socket costs nothing, so the hot spots
    are where the server's CPU goes.
    """
    profiles = [cProfile.Profile(time.thread_time)]

    def profile_thread(*_: Any) -> None:
        # threading.setprofile runs this first thing in each new thread.
        sys.setprofile(None)
        profile = cProfile.Profile(time.thread_time)
        profiles.append(profile)
        profile.enable()

    threading.setprofile(profile_thread)
    profiles[0].enable()
    try:
        hordelite_cli(argv)
    finally:
        profiles[0].disable()
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            stats.add(profile)
        stats.dump_stats(out)


# Where an idle thread waits. Left out: a wait costs no CPU, and a worker
# thread still waiting when the stats are taken is charged the main thread's
# clock by cProfile.
_IDLE = (
    "<method 'acquire' of '_thread.lock' objects>",
    "<method 'poll' of 'select.epoll' objects>",
)


def _where(file: str, line: int, function: str) -> str:
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    else:
        file = "hordelite/" + file.split("/hordelite/", 1)[1] if "/hordelite/" in file else file
    return f"{file}:{line}({function})"


def print_hot_spots(path: Path, name: str, top: int = 20) -> None:
    """The server's functions by CPU self time, and hordelite's own by cumulative time."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    rows = [
        (tottime, cumtime, calls, _where(*key))
        for key, (_, calls, tottime, cumtime, _) in stats.items()
        if key[2] not in _IDLE
    ]
    total = sum(r[0] for r in rows) or 1.0
    print(f"\nserver hot spots, phase {name}: {total:.1f} s of CPU over all threads")
    print(f"{'self %':>7} {'self s':>7} {'cum %':>7} {'calls':>9}  function (by CPU self time)")
    for tottime, cumtime, calls, where in sorted(rows, reverse=True)[:top]:
        print(f"{tottime / total:7.1%} {tottime:7.2f} {cumtime / total:7.1%} {calls:9d}  {where}")
    print(
        f"{'self %':>7} {'self s':>7} {'cum %':>7} {'calls':>9}  hordelite function (by cumulative CPU time)"
    )
    own = sorted((r for r in rows if r[3].startswith("hordelite/")), key=lambda r: -r[1])
    for tottime, cumtime, calls, where in own[:top]:
        print(f"{tottime / total:7.1%} {tottime:7.2f} {cumtime / total:7.1%} {calls:9d}  {where}")


# Command line ---------------------------------------------------------------


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",")]
    if len(sizes) < 2 or any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError("give at least two positive sizes, e.g. 100,100000")
    return sizes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument(
        "--phases",
        default="abcde",
        help="which phases to run: any of a, b, c, d, e (default abcde)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="seconds of each timed run in (a) and (e); each of the six reads in (d) "
        f"runs {STATUS_READ_SHARE:g} of it (default 10)",
    )
    p.add_argument(
        "--requesters",
        type=int,
        default=16,
        help="concurrent requesters in (a) and (e), clients in (d) (default 16)",
    )
    p.add_argument(
        "--workers", type=int, default=4, help="concurrent workers in (a) and (e) (default 4)"
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.05,
        help="seconds a requester waits before each status poll in (a) and (e) (default 0.05)",
    )
    p.add_argument(
        "--status-wait",
        type=float,
        nargs="?",
        const=5.0,
        default=0.0,
        metavar="SECONDS",
        help="requesters in (a) and (e) long-poll GET .../status/{id}?wait=SECONDS "
        "(5 when given alone) instead of polling every --poll-interval (default off)",
    )
    p.add_argument(
        "--idle-pause",
        type=float,
        default=0.1,
        help="seconds a worker in (e) waits after an empty pop before popping again "
        "(default 0.1; koboldcpp's embedded worker waits 1 s, then 2 s and 3 s "
        "after 10 and 25 empty pops in a row)",
    )
    p.add_argument(
        "--pop-wait", type=float, default=5.0, help='the workers\' pop "wait" in (a) (default 5)'
    )
    p.add_argument(
        "--queue-sizes",
        type=_sizes,
        default=[100, 100_000],
        help="waiting requests in (b), smallest first (default 100,100000)",
    )
    p.add_argument(
        "--pops", type=int, default=200, help="timed pops per queue size in (b) (default 200)"
    )
    p.add_argument(
        "--pop-budget",
        type=float,
        default=10.0,
        help=f"seconds of timed pops per queue size in (b), at least {MIN_POPS} pops (default 10)",
    )
    p.add_argument("--wake-rounds", type=int, default=50, help="rounds in (c) (default 50)")
    p.add_argument(
        "--wake-settle",
        type=float,
        default=0.05,
        help="seconds a pop gets to park on the server before the request in (c) (default 0.05)",
    )
    p.add_argument(
        "--client",
        choices=["lean", "httpx"],
        default="lean",
        help="HTTP client: lean (a minimal keep-alive client, the default) or httpx",
    )
    add_common_arguments(p)
    return p


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """The flags every benchmark takes: the event loops and --json."""
    p.add_argument(
        "--client-backend",
        choices=["trio", "asyncio"],
        default="asyncio",
        help="event loop of the load generator (default asyncio)",
    )
    p.add_argument(
        "--server-backend",
        choices=["trio", "asyncio"],
        default="trio",
        help="server.backend of the server (default trio, as hordelite serve)",
    )
    p.add_argument(
        "--storage",
        choices=STORAGES,
        default="sqlite",
        help="the server's storage in (a) and (e): a fresh SQLite file (default), a new "
        f"PostgreSQL schema (${POSTGRES_ENV}), or that and Redis signals (${REDIS_ENV}, "
        f"database {REDIS_DB}, flushed)",
    )
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")


def finish(report: Report, args: argparse.Namespace) -> int:
    """Print the report, write --json, and exit 1 when a target was missed."""
    print_report(report, args)
    if args.json:
        args.json.write_text(json.dumps(report.figures, indent=2))
    return 1 if any(row[3] == "MISS" for row in report.rows) else 0


def run_phases(
    args: argparse.Namespace, phases: dict[str, Callable[[Path, argparse.Namespace, Report], None]]
) -> int:
    """Run the phases ``args.phases`` names, each in a shared temporary folder,
    then print the report (``finish``); the exit status says whether a target
    was missed."""
    if profile_dir := os.environ.get(PROFILE_ENV):
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="hordelite-bench-") as tmp:
        for name, phase in phases.items():
            if name in args.phases:
                phase(Path(tmp), args, report)
    return finish(report, args)


def main(argv: list[str] | None = None) -> int:
    def pops(workdir: Path, args: argparse.Namespace, report: Report) -> None:
        run_pop_phase(workdir, args, report, servable=False)
        run_pop_phase(workdir, args, report, servable=True)

    return run_phases(
        parser().parse_args(argv),
        {
            "a": run_cycle_phase,
            "b": pops,
            "c": run_wake_phase,
            "d": run_status_phase,
            "e": run_horde_phase,
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == PROFILED_SERVER:
        serve_profiled(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(main())
