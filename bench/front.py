"""The OpenAI-compatible front under load, against a real `hordelite serve`.

The pieces (servers as child processes, the lean HTTP client, CPU accounting,
the report, profiling) are bench/text_cycle.py's; the chat request, the chat
pop and the structured reply are bench/chat_cycle.py's; both imported. Each
measurement gets its own ``hordelite serve`` on a fresh SQLite file.

Figures, each with its target (issue 4, "Performance"):

(a) Completed chat requests per second with ``--requesters`` clients and
    ``--workers`` long-polling chat workers (structured submits) for
    ``--duration`` seconds, through the front and through the native chat
    routes, alternated ``--rounds`` times (the order flips each round) so
    that a change in the machine's load falls on both. Front: one
    POST /v1/chat/completions per request in the openai SDK's HTTP shape
    (Authorization: Bearer, a compact JSON body with the horde object at the
    top level as ``extra_body`` puts it, the SDK's own headers), answered
    when the reply lands. Native: POST /api/v2/generate/chat/async, then GET
    /generate/chat/status/{id} every ``--poll-interval`` until done
    (chat_cycle.py's (a)). The request is chat_cycle.py's: a strict
    json_schema reply under conformance strict. Target: front / native
    completed requests per second >= 0.80.
(b) ``--calls`` concurrent non-streamed calls held open while no worker
    serves their model, one connection each, opened by the same lean client
    (at most ``--open-ahead`` ahead of what the server has queued). The
    server runs with a front timeout and no_worker_grace of an hour, so the
    calls wait, and no in-flight limit for the bench's user. A chat request
    is refused at submission unless an online chat worker serves its model,
    so a worker serves ``--warmup`` calls first (which also warms the
    server up) and stops popping; the calls are opened; then the worker
    stops serving: its owner puts it into maintenance (``--offline-by
    maintenance``, the default), or the bench waits for its
    horde.worker_online window (``--worker-online`` seconds) to pass
    (``--offline-by window``: no worker online at all; opening must take
    less than the window). Either way GET /v1/models lists no model and
    ``is_possible`` is false. Then: the server's resident memory per open
    call, (VmRSS with the calls open - VmRSS before they were opened) /
    calls, from /proc/<pid>/status (target <= 30 KB); the server's CPU over
    ``--hold`` seconds while they wait (target < 10% of one core), taken
    once a whole front.recheck_interval has passed since the last call was
    queued, so that every call's fallback re-reads run at their steady
    rate. Then
    ``--workers`` long-polling workers come online and every call must be
    answered with its own reply (none lost); the time to drain is reported.
    ``--routes`` (default ``chat``) runs (b) on each route named, each on a
    server of its own: ``chat`` (``/v1/chat/completions``), ``responses``
    (``/v1/responses``, the same request as ``instructions``, ``input`` and
    ``text.format``) and ``messages`` (``/v1/messages``, as ``system``,
    ``messages`` and ``output_config.format``); issue 38's target is the same
    memory per open call on each as on the chat route.

The table of cores busy (server, this load generator, everything else)
comes with every measurement, as in text_cycle.py: read it first. The file
descriptor limit (``ulimit -n``) is raised in this process when ``--calls``
needs it; the server, a child process, inherits it (its limit is read back
from /proc/<pid>/limits and reported). The exit status is 1 when a target is
missed.

    .venv/bin/python bench/front.py              # the default run, about 3-4 minutes
    .venv/bin/python bench/front.py --phases b --calls 10000
    .venv/bin/python bench/front.py --help

HORDELITE_BENCH_PROFILE=DIR profiles each server as text_cycle.py does.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import platform
import resource
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import chat_cycle as cc  # bench/ is the script's folder, so on sys.path
import openai
import text_cycle as tc
from sqlalchemy import Connection, func, select

from hordelite.config import load_config
from hordelite.storage.database import Database
from hordelite.storage.schema import requests

MODEL = tc.MODEL
COMPLETIONS = "/v1/chat/completions"

TARGET_FRONT_RATIO = 0.80
TARGET_KB_PER_CALL = 30.0
TARGET_HOLD_CPU = 0.10  # cores

# Headers the openai SDK (AsyncOpenAI) sends with every call, as captured from
# openai 3.x; Authorization, the retry count, the read timeout and the
# framing are added per call.
SDK_HEADERS = "".join(
    f"{name}: {value}\r\n"
    for name, value in (
        ("accept-encoding", "gzip, deflate"),
        ("accept", "application/json"),
        ("content-type", "application/json"),
        ("user-agent", f"AsyncOpenAI/Python {openai.__version__}"),
        ("x-stainless-lang", "python"),
        ("x-stainless-package-version", openai.__version__),
        ("x-stainless-os", platform.system()),
        ("x-stainless-arch", "x64" if platform.machine() == "x86_64" else platform.machine()),
        ("x-stainless-runtime", platform.python_implementation()),
        ("x-stainless-runtime-version", platform.python_version()),
        ("x-stainless-async", "async:asyncio"),
        ("x-stainless-retry-count", "0"),
        ("x-stainless-read-timeout", "600"),
    )
)


class SdkShapedHttp(tc.LeanHttp):
    """text_cycle's lean keep-alive client, sending what the openai SDK sends.

    ``path`` is the full path (no /api/v2 prefix); ``apikey`` goes into
    ``Authorization: Bearer``. ``send`` and ``receive`` are apart so that a
    held call can give up its connect slot once its request is out.
    """

    async def call(
        self, method: str, path: str, body: Any = None, apikey: str = ""
    ) -> tuple[int, Any]:
        await self.send(method, path, body, apikey)
        return await self.receive()

    async def send(self, method: str, path: str, body: Any = None, apikey: str = "") -> None:
        if self._stream is None:
            self._stream = await anyio.connect_tcp(self._host, self._port)
            self._buffer = b""
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nhost: {self._host}:{self._port}\r\n{SDK_HEADERS}"
            f"authorization: Bearer {apikey}\r\ncontent-length: {len(payload)}\r\n\r\n"
        )
        await self._stream.send(head.encode() + payload)

    async def receive(self) -> tuple[int, Any]:
        status, answer = await self._read_answer()
        return status, json.loads(answer)


def reply_tag(answer: dict[str, Any]) -> str:
    """The tag a chat_cycle reply carries (the request's own), from a completion."""
    return str(json.loads(answer["choices"][0]["message"]["content"])["request"])


def responses_request(tag: str) -> dict[str, Any]:
    """chat_cycle's request (cc.chat_request) as a Responses call."""
    chat = cc.chat_request(tag)
    return {
        "model": MODEL,
        "instructions": chat["messages"][0]["content"],
        "input": chat["messages"][1]["content"],
        "max_output_tokens": chat["max_tokens"],
        "text": {"format": {"type": "json_schema", **chat["response_format"]["json_schema"]}},
        "horde": chat["horde"],
    }


def responses_tag(answer: dict[str, Any]) -> str:
    text = "".join(
        part.get("text", "")
        for item in answer["output"]
        if item.get("type") == "message"
        for part in item["content"]
    )
    return str(json.loads(text)["request"])


def messages_request(tag: str) -> dict[str, Any]:
    """chat_cycle's request (cc.chat_request) as a Messages call."""
    chat = cc.chat_request(tag)
    return {
        "model": MODEL,
        "system": chat["messages"][0]["content"],
        "messages": chat["messages"][1:],
        "max_tokens": chat["max_tokens"],
        "output_config": {
            "format": {
                "type": "json_schema",
                "schema": chat["response_format"]["json_schema"]["schema"],
            }
        },
        "horde": chat["horde"],
    }


def messages_tag(answer: dict[str, Any]) -> str:
    text = "".join(block.get("text", "") for block in answer["content"])
    return str(json.loads(text)["request"])


@dataclasses.dataclass(frozen=True)
class FrontRoute:
    """A route of the front that queues a chat request: its path, the body
    of chat_cycle's request sent to it, and the tag read back from its answer."""

    path: str
    request: Callable[[str], dict[str, Any]]
    tag: Callable[[dict[str, Any]], str]


FRONT_ROUTES = {
    "chat": FrontRoute(COMPLETIONS, cc.chat_request, reply_tag),
    "responses": FrontRoute("/v1/responses", responses_request, responses_tag),
    "messages": FrontRoute("/v1/messages", messages_request, messages_tag),
}


async def chat_worker(
    http: tc.Http,
    name: str,
    worker_key: str,
    pop_wait: float,
    window: tc.Window | None = None,
    stop: anyio.Event | None = None,
) -> None:
    """chat_cycle's worker: long-polled chat pops, structured submits.

    Counts into ``window`` when given; returns after the pop in flight when
    ``stop`` is set (a cancelled pop could be handed a job nobody submits).
    """
    while stop is None or not stop.is_set():
        job = await cc.chat_pop(http, worker_key, name, pop_wait)
        if window is not None:
            window.count("pop")
        if job["id"] is None:
            continue
        if not job.get("chat"):
            raise RuntimeError(f"a chat worker got a job that is not chat: {job}")
        tag = cc.last_user_text(job).rsplit(". ", 1)[1]
        body = cc.chat_reply(job, tag)
        await tc.expect(200, http.call("POST", "/generate/text/submit", body, worker_key))
        if window is not None and window.count("submit"):
            window.done.append(time.perf_counter() - window.sent.pop(tag))


# Server configuration through the environment ---------------------------------


@contextlib.contextmanager
def server_env(values: dict[str, Any]) -> Iterator[None]:
    """HORDELITE_* variables for the server started inside (and the key CLI)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update({key: str(value) for key, value in values.items()})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def raise_fd_limit(needed: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE to ``needed`` if it is lower
    (children inherit it); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fd_limit_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return line.split()[3]
    return "unknown"


def vm_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


# (a) completed chat requests per second, front and native ----------------------


async def measure_front_cycle(
    url: str | Sequence[str],
    worker_key: str,
    requester_keys: list[str],
    args: argparse.Namespace,
    worker_prefix: str = "bench-chat-worker",
) -> tc.Window:
    """chat_cycle.measure_chat_cycle with one POST /v1/chat/completions per request.

    The workers are ``{worker_prefix}-{i}``; of several URLs, each kind of
    client is spread over them as lean_clients does.
    """
    window = tc.Window(args.duration)

    async def requester(http: SdkShapedHttp, key: str) -> None:
        while True:
            tag = f"bench request {uuid.uuid4()}"
            sent = window.sent[tag] = time.perf_counter()
            status, answer = await http.call("POST", COMPLETIONS, cc.chat_request(tag), key)
            if status != 200:
                raise RuntimeError(f"expected HTTP 200 from the front, got {status}: {answer}")
            if not window.count("completions"):
                return
            if reply_tag(answer) != tag:
                raise RuntimeError(f"a call got another request's reply: {answer}")
            window.latencies.append(time.perf_counter() - sent)

    async with (
        tc.lean_clients(tc.LeanHttp, url, args.workers) as workers,
        tc.lean_clients(SdkShapedHttp, url, args.requesters) as requesters,
    ):
        names = [f"{worker_prefix}-{i}" for i in range(args.workers)]
        for http, name in zip(workers, names, strict=True):
            # Check in first: a chat request for a model without a chat worker is refused.
            await cc.chat_pop(http, worker_key, name)
        tasks: list[tc.Task] = [
            functools.partial(chat_worker, http, name, worker_key, args.pop_wait, window)
            for http, name in zip(workers, names, strict=True)
        ]
        tasks += [
            functools.partial(requester, http, key)
            for http, key in zip(requesters, requester_keys, strict=True)
        ]
        await tc.run_until_deadline(window, tasks)
    return window


def run_cycle(
    workdir: Path, args: argparse.Namespace, kind: str, round_: int
) -> tuple[tc.Window, tc.CpuUse]:
    """One timed run of the ``kind`` ("front" or "native") path on a server of its own."""
    with tc.running_server(workdir, f"cycle-{kind}-{round_}", args.server_backend) as server:
        worker_key = tc.create_key(server, "bench-workers")
        requester_keys = [
            tc.create_key(server, f"bench-requester-{i}") for i in range(args.requesters)
        ]
        measure = measure_front_cycle if kind == "front" else cc.measure_chat_cycle
        cpu: list[tc.CpuUse] = []
        with tc.cpu_use(server.pid, cpu):
            window = anyio.run(
                measure, server.url, worker_key, requester_keys, args, backend=args.client_backend
            )
    if not window.latencies:
        raise RuntimeError(f"no chat request completed through the {kind} path")
    return window, cpu[0]


def run_cycle_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    windows: dict[str, list[tc.Window]] = {"native": [], "front": []}
    server_cpu = {"native": 0.0, "front": 0.0}
    for round_ in range(1, args.rounds + 1):
        order = ("native", "front") if round_ % 2 else ("front", "native")
        for kind in order:
            window, use = run_cycle(workdir, args, kind, round_)
            windows[kind].append(window)
            server_cpu[kind] += use.server * use.wall
            report.cpu.append((f"(a) {kind} chat, round {round_}", use))
    rates: dict[str, float] = {}
    for kind in ("native", "front"):
        runs = windows[kind]
        done = sum(len(w.latencies) for w in runs)
        seconds = sum(w.duration for w in runs)
        requests_by: dict[str, int] = {}
        for w in runs:
            for name, count in w.requests.items():
                requests_by[name] = requests_by.get(name, 0) + count
        total = sum(requests_by.values())
        rate = rates[kind] = done / seconds
        per_round = ", ".join(f"{len(w.latencies) / w.duration:.1f}" for w in runs)
        report.add(f"(a) {kind} chat requests completed", f"{rate:.1f} /s (rounds: {per_round})")
        names = ("completions", "pop", "submit") if kind == "front" else cc_kinds()
        kinds = ", ".join(f"{name} {requests_by.get(name, 0) / done:.2f}" for name in names)
        report.add(f"(a) {kind} HTTP requests per completion", f"{total / done:.2f} ({kinds})")
        cpu_each = server_cpu[kind] / done
        report.add(f"(a) {kind} server CPU per completion", tc.ms(cpu_each))
        seen = [s for w in runs for s in w.latencies]
        report.add(
            f"(a) {kind} sent-to-answered p50 / p95",
            f"{tc.ms(tc.percentile(seen, 50))} / {tc.ms(tc.percentile(seen, 95))}",
        )
        report.figures[f"{kind}_chat"] = {
            "completed_per_s": rate,
            "completed_per_s_by_round": [len(w.latencies) / w.duration for w in runs],
            "requests_per_completion": total / done,
            "requests_by_kind": requests_by,
            "server_cpu_ms_per_completion": cpu_each * 1000,
            "answered_p50_ms": tc.percentile(seen, 50) * 1000,
            "answered_p95_ms": tc.percentile(seen, 95) * 1000,
        }
    ratio = rates["front"] / rates["native"]
    report.add(
        "(a) ratio front / native completed per second",
        f"{ratio:.2f}",
        f">= {TARGET_FRONT_RATIO:.2f}",
        ratio >= TARGET_FRONT_RATIO,
    )
    report.figures["front_native_ratio"] = ratio


def cc_kinds() -> tuple[str, ...]:
    return ("async", "pop", "submit", "status")


# (b) many calls held open while no worker is online ----------------------------


def count_waiting(conn: Connection) -> int:
    query = select(func.count()).select_from(requests).where(requests.c.state == "waiting")
    return int(conn.execute(query).scalar_one())


@dataclasses.dataclass
class Held:
    calls: int
    rss_before_kb: int = 0
    rss_open_kb: int = 0
    rss_end_of_hold_kb: int = 0
    rss_drained_kb: int = 0
    open_seconds: float = 0.0
    offline_wait: float = 0.0
    drain_seconds: float = 0.0
    answered: int = 0
    failures: dict[str, int] = dataclasses.field(default_factory=dict)
    early: int = 0  # answered before the workers came back
    cpu: dict[str, tc.CpuUse] = dataclasses.field(default_factory=dict)


async def measure_held(
    server: tc.Server,
    worker_key: str,
    key: str,
    db: Database,
    route: FrontRoute,
    args: argparse.Namespace,
) -> Held:
    held = Held(args.calls)
    recheck_interval = load_config(server.config).front.recheck_interval
    draining = anyio.Event()
    answered = anyio.Event()
    last_answer = [0.0]

    # Warm-up: a worker serves some calls, then stops popping.
    stop = anyio.Event()
    async with (
        tc.lean_clients(tc.LeanHttp, server.url, 1) as (worker,),
        tc.lean_clients(SdkShapedHttp, server.url, args.requesters) as requesters,
    ):
        await cc.chat_pop(worker, worker_key, "bench-warmup-worker")  # check in
        left = [args.warmup]

        async def warm(http: SdkShapedHttp) -> None:
            while left[0] > 0:
                left[0] -= 1
                tag = f"warm-up {uuid.uuid4()}"
                status, answer = await http.call("POST", route.path, route.request(tag), key)
                if status != 200 or route.tag(answer) != tag:
                    raise RuntimeError(f"a warm-up call got {status}: {answer}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(chat_worker, worker, "bench-warmup-worker", worker_key, 1.0, None, stop)
            async with anyio.create_task_group() as calls:
                for http in requesters:
                    calls.start_soon(warm, http)
            stop.set()  # the worker's pop in flight returns empty within a second
        # A pop without wait: the worker counts as online for the whole
        # horde.worker_online window (after a long-poll, only about twice its
        # wait), so the calls opened next are queued, not refused.
        await cc.chat_pop(worker, worker_key, "bench-warmup-worker")
    offline_at = time.monotonic() + args.worker_online + 1.0
    await anyio.sleep(1.0)
    held.rss_before_kb = vm_rss_kb(server.pid)

    errors: list[str] = []

    async def call(i: int) -> None:
        tag = f"held call {i} {uuid.uuid4()}"
        http = SdkShapedHttp(server.url)
        step = "connect"
        try:
            await http.send("POST", route.path, route.request(tag), key)
            step = "answer"
            status, answer = await http.receive()
        except (OSError, ConnectionError, anyio.BrokenResourceError) as exc:
            cause = exc.__cause__ or exc
            label = f"{step}: {type(cause).__name__} {cause}"[:100]
            held.failures[label] = held.failures.get(label, 0) + 1
            return
        finally:
            await http.aclose()
        if not draining.is_set():
            held.early += 1
        if status == 200 and route.tag(answer) == tag:
            held.answered += 1
            last_answer[0] = time.perf_counter()
        else:
            label = f"HTTP {status} {answer.get('error', {}).get('code', '')}".strip()
            held.failures[label] = held.failures.get(label, 0) + 1
            if len(errors) < 3:
                errors.append(json.dumps(answer)[:300])
        if held.answered + sum(held.failures.values()) == held.calls:
            answered.set()

    async with anyio.create_task_group() as tg:
        opened = time.perf_counter()
        use: list[tc.CpuUse] = []
        with tc.cpu_use(server.pid, use):
            # A call is held once its request waits in the server's queue. At
            # most --open-ahead calls are opened ahead of the queue: a client
            # far ahead of the server fills its listen backlog, and the
            # kernel resets connections left there too long.
            sent = 0
            deadline = time.monotonic() + args.open_timeout
            while (
                queued := await anyio.to_thread.run_sync(db.run_sync, count_waiting, False)
            ) < args.calls:
                if held.early or held.failures:
                    raise RuntimeError(f"calls were answered while opening: {held}, {errors}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{queued} of {args.calls} calls queued in {args.open_timeout} s"
                    )
                while sent < min(args.calls, queued + args.open_ahead):
                    tg.start_soon(call, sent)
                    sent += 1
                await anyio.sleep(0.05)
        queued_at = time.perf_counter()
        held.open_seconds = queued_at - opened
        progress(f"(b) {args.calls} calls queued in {held.open_seconds:.1f} s")
        held.cpu["open"] = use[0]
        # No worker serves the model from here: the models list empties.
        waited = time.perf_counter()
        if args.offline_by == "window":
            if time.monotonic() > offline_at:
                raise RuntimeError(
                    f"opening took {held.open_seconds:.1f} s, past the worker's online "
                    "window; give --worker-online more seconds"
                )
            await anyio.sleep(max(offline_at - time.monotonic(), 0))
        async with tc.lean_clients(tc.LeanHttp, server.url, 1) as (native,):
            if args.offline_by == "maintenance":
                worker = await tc.expect(
                    200, native.call("GET", "/workers/name/bench-warmup-worker")
                )
                change = {"maintenance": True}
                await tc.expect(
                    200, native.call("PUT", f"/workers/{worker['id']}", change, worker_key)
                )
        async with tc.lean_clients(SdkShapedHttp, server.url, 1) as (probe,):
            while True:
                listed = await tc.expect(200, probe.call("GET", "/v1/models", None, key))
                if not listed["data"]:
                    break
                await anyio.sleep(0.5)
        held.offline_wait = time.perf_counter() - waited
        # Every call's fallback re-reads are in their steady rhythm once a
        # whole recheck_interval has passed since the last one began waiting.
        steady = queued_at + recheck_interval - time.perf_counter()
        progress(
            f"(b) no worker serves the model; {max(steady, 1.0):.0f} s to the steady "
            f"state, then holding {args.hold:.0f} s"
        )
        await anyio.sleep(max(steady, 1.0))
        held.rss_open_kb = vm_rss_kb(server.pid)
        use = []
        with tc.cpu_use(server.pid, use):
            await anyio.sleep(args.hold)
        held.cpu["hold"] = use[0]
        held.rss_end_of_hold_kb = vm_rss_kb(server.pid)
        if held.early or held.failures:
            raise RuntimeError(f"calls were answered while no worker was online: {held}, {errors}")

        # Workers come online; every call must get its own reply.
        progress(f"(b) {args.workers} workers come online")
        draining.set()
        use = []
        started = time.perf_counter()
        with tc.cpu_use(server.pid, use):
            async with tc.lean_clients(tc.LeanHttp, server.url, args.workers) as workers:
                stop = anyio.Event()
                async with anyio.create_task_group() as drain:
                    for i, drainer in enumerate(workers):
                        drain.start_soon(
                            chat_worker,
                            drainer,
                            f"bench-drain-{i}",
                            worker_key,
                            args.pop_wait,
                            None,
                            stop,
                        )
                    with anyio.move_on_after(args.drain_timeout):
                        await answered.wait()
                    stop.set()
        held.cpu["drain"] = use[0]
        held.drain_seconds = (last_answer[0] or time.perf_counter()) - started
        held.rss_drained_kb = vm_rss_kb(server.pid)
        tg.cancel_scope.cancel()  # calls still open past the drain timeout count as lost
    if errors:
        print("first failures:", *errors, sep="\n  ", file=sys.stderr)
    return held


def progress(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


def print_log_tail(log: Path, lines: int = 60) -> None:
    """The end of a server's log, to see why a bench run failed."""
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    print(f"--- the last {len(tail)} lines of {log.name} ---", *tail, sep="\n", file=sys.stderr)


def run_held_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    """(b) on each route of ``--routes``, each on a server of its own."""
    for route in args.routes:
        run_held_route(workdir, args, report, route)


def run_held_route(
    workdir: Path, args: argparse.Namespace, report: tc.Report, route_name: str
) -> None:
    route = FRONT_ROUTES[route_name]
    # The chat route's figures keep their names; another route's say which.
    b = "(b)" if route_name == "chat" else f"(b {route.path})"
    client_limit = raise_fd_limit(args.calls + 1000)
    env = {
        "HORDELITE_FRONT_TIMEOUT": 3600,
        "HORDELITE_FRONT_NO_WORKER_GRACE": 3600,
        "HORDELITE_FRONT_MAX_OPEN_CALLS": args.calls + 1000,
        "HORDELITE_FRONT_MAX_OPEN_PER_SOURCE": args.calls + 1000,
        # One bench user stands for many users: no in-flight limit.
        "HORDELITE_HORDE_CONCURRENCY": 0,
    }
    if args.offline_by == "window":
        env["HORDELITE_HORDE_WORKER_ONLINE"] = args.worker_online
    with (
        server_env(env),
        tc.running_server(workdir, f"held-{route_name}", args.server_backend) as server,
    ):
        server_limit = fd_limit_of(server.pid)
        if server_limit != "unlimited" and int(server_limit) < args.calls + 100:
            raise RuntimeError(f"the server may open {server_limit} files, too few for the calls")
        worker_key = tc.create_key(server, "bench-worker")
        key = tc.create_key(server, "bench-requester")
        db = Database(load_config(server.config).storage.database, 1)
        try:
            held = anyio.run(
                measure_held, server, worker_key, key, db, route, args, backend=args.client_backend
            )
        except BaseException:
            print_log_tail(workdir / f"held-{route_name}.log")
            raise
        finally:
            db.dispose()
        if " ERROR " in (workdir / f"held-{route_name}.log").read_text(errors="replace"):
            print_log_tail(workdir / f"held-{route_name}.log")
    n = held.calls
    report.cpu += [
        (f"{b} opening {n:,} calls", held.cpu["open"]),
        (f"{b} {n:,} calls held, no worker", held.cpu["hold"]),
        (f"{b} draining {n:,} calls", held.cpu["drain"]),
    ]
    per_call = (held.rss_open_kb - held.rss_before_kb) / n
    hold_cpu = held.cpu["hold"].server
    lost = n - held.answered
    report.add(
        f"{b} {n:,} calls opened and queued",
        f"in {held.open_seconds:.1f} s ({n / held.open_seconds:.0f} /s)",
    )
    how = (
        "its owner put it into maintenance"
        if args.offline_by == "maintenance"
        else f"its {args.worker_online:.0f} s online window passed"
    )
    report.add(f"{b} the worker stopped serving", f"{how} ({held.offline_wait:.1f} s)")
    report.add(
        f"{b} server VmRSS before / open / end of hold / drained",
        " / ".join(
            f"{kb / 1024:.1f}"
            for kb in (
                held.rss_before_kb,
                held.rss_open_kb,
                held.rss_end_of_hold_kb,
                held.rss_drained_kb,
            )
        )
        + " MiB",
    )
    report.add(
        f"{b} server memory per open call",
        f"{per_call:.1f} KB",
        f"<= {TARGET_KB_PER_CALL:.0f} KB",
        per_call <= TARGET_KB_PER_CALL,
    )
    report.add(
        f"{b} server CPU while {n:,} wait ({args.hold:.0f} s)",
        f"{hold_cpu:.1%} of a core",
        f"< {TARGET_HOLD_CPU:.0%}",
        hold_cpu < TARGET_HOLD_CPU,
    )
    report.add(
        f"{b} answered after workers came online",
        f"{held.answered:,} of {n:,} in {held.drain_seconds:.1f} s "
        f"({held.answered / max(held.drain_seconds, 1e-9):.0f} /s)"
        + (f"; failures {held.failures}" if held.failures else ""),
        "none lost",
        lost == 0,
    )
    report.add(f"{b} fd limits server / client", f"{server_limit} / {client_limit}")
    report.figures["held" if route_name == "chat" else f"held {route.path}"] = {
        **{k: v for k, v in dataclasses.asdict(held).items() if k != "cpu"},
        "kb_per_call": per_call,
        "hold_cpu_cores": hold_cpu,
        "server_fd_limit": server_limit,
        "client_fd_limit": client_limit,
    }


# Command line -----------------------------------------------------------------


def routes_of(text: str) -> list[str]:
    routes = [r.strip() for r in text.split(",") if r.strip()]
    if not routes or any(r not in FRONT_ROUTES for r in routes):
        raise argparse.ArgumentTypeError(f"any of {', '.join(FRONT_ROUTES)}: {text!r}")
    return routes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--phases", default="ab", help="which phases to run: any of a, b (default ab)")
    p.add_argument(
        "--duration", type=float, default=8.0, help="seconds of each timed run in (a) (default 8)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="native and front runs in (a), alternated, each on a fresh server (default 2)",
    )
    p.add_argument(
        "--requesters", type=int, default=16, help="concurrent requesters in (a) (default 16)"
    )
    p.add_argument(
        "--workers", type=int, default=4, help="long-polling workers in (a) and (b) (default 4)"
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.05,
        help="seconds a native requester waits before each status poll in (a) (default 0.05)",
    )
    p.add_argument(
        "--pop-wait", type=float, default=5.0, help='the workers\' pop "wait" (default 5)'
    )
    p.add_argument("--calls", type=int, default=5000, help="calls held open in (b) (default 5000)")
    p.add_argument(
        "--routes",
        type=routes_of,
        default=["chat"],
        help="the routes (b) holds calls on, each on a server of its own, comma-separated: "
        f"any of {', '.join(FRONT_ROUTES)} (default chat)",
    )
    p.add_argument(
        "--hold",
        type=float,
        default=10.0,
        help="seconds the server's CPU is measured while the calls wait in (b) (default 10)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=200,
        help="calls served before (b) opens its calls (default 200)",
    )
    p.add_argument(
        "--offline-by",
        choices=["maintenance", "window"],
        default="maintenance",
        help="how (b)'s only worker stops serving once the calls are open: its owner puts it "
        "into maintenance (the default), or its horde.worker_online window passes",
    )
    p.add_argument(
        "--worker-online",
        type=float,
        default=90.0,
        help="with --offline-by window: horde.worker_online of (b)'s server, which opening "
        "the calls must take less than (default 90)",
    )
    p.add_argument(
        "--open-ahead",
        type=int,
        default=64,
        help="calls opened but not yet queued by the server, at most, in (b) (default 64)",
    )
    p.add_argument(
        "--open-timeout", type=float, default=120.0, help="seconds to open the calls in (b)"
    )
    p.add_argument(
        "--drain-timeout", type=float, default=180.0, help="seconds to answer them all in (b)"
    )
    tc.add_common_arguments(p)
    # The native run is chat_cycle's, which picks its client by this.
    p.set_defaults(client="lean")
    return p


def main(argv: list[str] | None = None) -> int:
    return tc.run_phases(parser().parse_args(argv), {"a": run_cycle_phase, "b": run_held_phase})


if __name__ == "__main__":
    sys.exit(main())
