"""Scaling out: `hordelite serve` replicas on one PostgreSQL database and one Redis.

With ``[signals] url`` set, several ``hordelite serve`` processes on one
PostgreSQL database and one Redis act as one horde (replicas). This bench
starts them as child processes, each on its own port, and spreads its
clients over them as a load balancer would. The pieces (the server child,
the lean HTTP client spread over the replicas, the report, the (a) cycle, the
key command) are bench/text_cycle.py's; CPU and the process tree from /proc,
the fresh schema and the Redis database bench/_common.py's; the chat pop
bench/chat_cycle.py's; the SDK-shaped client, the front cycle, the server
environment and the file descriptor limit bench/front.py's; the streaming
client and the streamed job bench/stream.py's: all imported.

Every configuration on PostgreSQL gets a fresh schema (libpq's
``options=-csearch_path=<schema>``), dropped afterwards; the Redis database
(``--redis-db``, 5 by default, on the host and port of
HORDELITE_TEST_REDIS_URL) is flushed before each. PostgreSQL is
HORDELITE_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/test).

Figures, each with its target:

(a) text_cycle.py's (a) cycle (``--requesters`` requesters: POST async, GET
    status every ``--poll-interval`` until done; ``--workers`` workers:
    long-polled pops with ``--pop-wait``, submit) for ``--duration`` s
    against: one process on SQLite (the default ``hordelite serve``), one
    process on PostgreSQL + Redis, two replicas on PostgreSQL + Redis (the
    clients round-robin over the two ports, client i on port i mod 2), and,
    when ``hordelite serve --help`` offers ``--processes``, one port served
    by ``--processes 2``. Completed cycles/s and each server's CPU for each.
    Target: 2 replicas / 1 replica >= 1.6.
(b) Cross-replica long-poll wake: a worker waits in a pop with "wait": 10 on
    replica A; a request is submitted on replica B; time from sending the
    async POST to the pop's answer, p50 over ``--wake-rounds`` rounds.
    Target: p50 <= 20 ms. The same with the request submitted on A is shown
    beside it (rounds alternated).
(c) Progress across replicas, front.pace_progress = false: a streamed
    OpenAI call (``"stream": true``, a plain body) waits on replica C; a chat
    worker pops its job on A and posts POST /api/v2/generate/text/progress
    ({id, seq, delta: {content}}) to B; time from sending each post to the
    SSE bytes carrying its text arriving at the client (one clock, this
    process). ``--relay-streams`` streams of ``--relay-posts`` posts each.
    Target: p50 <= 10 ms.
(d) Redis connections per server process with ``--calls`` OpenAI calls held
    waiting, spread over two replicas (a chat worker checks in and never
    pops again, so the calls wait): Redis's CLIENT LIST, each client
    attributed to the process that owns its socket (from /proc), before the
    calls are opened and, sampled every half second, while they open and
    are held. Target: flat (the same during as before, for each process;
    about 2: one pub/sub connection and one for commands).
(e) front.py's (a) front cycle (``--requesters`` SDK-shaped requesters, one
    POST /v1/chat/completions per request, answered when the reply lands;
    ``--workers`` chat workers, long-polled pops, structured submits) for
    ``--duration`` s against the configurations of (a). Completed chat
    completions/s and each server's CPU for each. User and worker names
    carry the configuration. Target: --processes 2 / 1 process (both on
    PostgreSQL + Redis) >= 1.6; 2 replicas / 1 process is shown beside it.

``--setups`` picks the configurations of (a) and (e) by key (sqlite, pg_1,
pg_2, pg_processes_2, and pg_only_1: one process on PostgreSQL with the
in-process signals, which shows what Redis costs on its own). With
``--against TREE``, (a) alternates between this checkout and TREE's
hordelite (``PYTHONPATH``), ``--rounds`` times, and prints each tree's
ratio of each configuration to SQLite, taken within a round, and their
median.

The table of cores busy comes with every measurement, as in text_cycle.py:
"server" is all the hordelite processes of the configuration together, and
"others" includes PostgreSQL and Redis (their share is also printed in the
rows). The exit status is 1 when a target is missed.

    .venv/bin/python bench/scale_out.py              # the default run (abcde), about 3-4 minutes
    .venv/bin/python bench/scale_out.py --phases a --duration 20
    .venv/bin/python bench/scale_out.py --help

HORDELITE_BENCH_PROFILE=DIR profiles each server as text_cycle.py does.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import chat_cycle as cc  # bench/ is the script's folder, so on sys.path
import front as fr
import stream as st
import text_cycle as tc
from _common import (
    DEFAULT_POSTGRES,
    DEFAULT_REDIS,
    POSTGRES_ENV,
    REDIS_ENV,
    RedisCommands,
    flush_redis,
    fresh_schema,
    machine_cpu,
    process_cpu,
    process_tree,
    redis_on_db,
)

from hordelite.storage.database import Database

COMPLETIONS = "/v1/chat/completions"
REPLICA_NAMES = "ABC"
# Processes counted as the shared backing stores in the CPU rows.
BACKING_COMMANDS = ("postgres", "redis-server")

TARGET_SCALE = 1.6  # (a): 2 replicas / 1 replica, cycles per second
TARGET_FRONT_PROCESSES = 1.6  # (e): --processes 2 / 1 process, completions per second
TARGET_WAKE_MS = 20.0  # (b)
TARGET_RELAY_MS = 10.0  # (c)
# (d): what a process is expected to hold, the target itself being "flat".
EXPECTED_REDIS_CONNECTIONS = 2

T = TypeVar("T")


# PostgreSQL and Redis -----------------------------------------------------------


# Processes, from /proc --------------------------------------------------------


def cpu_by_pid(pids: Sequence[int]) -> dict[int, float]:
    """CPU seconds each live process of ``pids`` has used (gone ones left out)."""
    seconds = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            seconds[pid] = process_cpu(pid)
    return seconds


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[pid] - before[pid] for pid in before if pid in after)


def backing_pids() -> list[int]:
    """PostgreSQL's and Redis's processes on this machine (other users' load included)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() in BACKING_COMMANDS:
                    pids.append(int(entry.name))
    return pids


@dataclasses.dataclass(frozen=True)
class Use:
    """Cores busy during one measurement: ``total.server`` is every server
    process together; ``servers`` each server's (its process tree)."""

    total: tc.CpuUse
    servers: dict[str, float]
    backing: float  # PostgreSQL and Redis


@contextlib.contextmanager
def cpu_of(servers: Sequence[tc.Server], into: list[Use]) -> Iterator[None]:
    """Append to ``into`` the CPU use of the servers, this process, the backing stores and the rest."""
    trees = {server.name: process_tree(server.pid) for server in servers}
    backing = backing_pids()
    wall = time.perf_counter()
    start = {name: cpu_by_pid(tree) for name, tree in trees.items()}
    client, stores, machine = process_cpu(os.getpid()), cpu_by_pid(backing), machine_cpu()
    yield
    wall = time.perf_counter() - wall
    each = {name: spent(start[name], cpu_by_pid(tree)) for name, tree in trees.items()}
    client = process_cpu(os.getpid()) - client
    # PostgreSQL forks a backend per new connection: one started meanwhile
    # spent all of its CPU within the measurement.
    stores_now = cpu_by_pid(backing_pids())
    stores_spent = sum(seconds - stores.get(pid, 0.0) for pid, seconds in stores_now.items())
    machine = machine_cpu() - machine
    server = sum(each.values())
    total = tc.CpuUse(
        wall, server / wall, client / wall, max(machine - server - client, 0.0) / wall
    )
    into.append(Use(total, {name: s / wall for name, s in each.items()}, stores_spent / wall))


def cores_row(use: Use, shared: bool) -> str:
    servers = ", ".join(
        f"{name.rsplit('-', 1)[1]} {cores:.2f}" for name, cores in use.servers.items()
    )
    row = f"{servers} cores (client {use.total.client:.2f}"
    if shared:
        row += f", PostgreSQL + Redis {use.backing:.2f}"
    return row + f", others {use.total.others:.2f})"


# The servers ----------------------------------------------------------------------


def processes_option() -> bool:
    """Whether ``hordelite serve`` takes ``--processes``."""
    command = [sys.executable, "-m", "hordelite", "serve", "--help"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    return "--processes" in out.stdout


@dataclasses.dataclass(frozen=True)
class Setup:
    """One configuration: ``replicas`` ``hordelite serve`` processes (each
    ``serve`` + ``serve_args``), on PostgreSQL + Redis when ``shared``, else
    on the default SQLite file with in-process signals."""

    key: str
    label: str
    replicas: int = 1
    shared: bool = True
    serve_args: tuple[str, ...] = ()
    # On PostgreSQL, Redis for the signals; False: the in-process signals
    # (one process only: it shows what Redis costs on its own).
    redis: bool = True


@dataclasses.dataclass(frozen=True)
class Horde:
    servers: list[tc.Server]
    database: str
    signals_url: str

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]


@contextlib.contextmanager
def running_horde(
    workdir: Path, name: str, setup: Setup, args: argparse.Namespace, source: Path | None = None
) -> Iterator[Horde]:
    """The setup's servers on fresh storage: a new schema and a flushed Redis
    database (dropped and flushed again on exit), or a new SQLite file. The replicas start one after another, so
    that the first has migrated the schema before the next starts."""
    with contextlib.ExitStack() as stack:
        if setup.shared:
            database = stack.enter_context(fresh_schema(args.postgres))
            signals_url = redis_on_db(args.redis, args.redis_db) if setup.redis else ""
            if signals_url:
                flush_redis(signals_url)
                stack.callback(flush_redis, signals_url)  # once the servers have stopped
        else:
            database, signals_url = str(workdir / f"{name}.db"), ""
        servers = [
            stack.enter_context(
                tc.running_server(
                    workdir,
                    f"{name}-{REPLICA_NAMES[i]}",
                    args.server_backend,
                    database,
                    signals_url,
                    setup.serve_args,
                    source=source,
                )
            )
            for i in range(setup.replicas)
        ]
        yield Horde(servers, database, signals_url)


def print_log_tails(workdir: Path, horde: Horde) -> None:
    for server in horde.servers:
        fr.print_log_tail(workdir / f"{server.name}.log", 30)


def measured(
    workdir: Path,
    horde: Horde,
    client_backend: str,
    measure: Callable[..., Awaitable[T]],
    *measure_args: Any,
) -> tuple[T, Use]:
    """What ``measure(*measure_args)`` returns, run on ``client_backend``, and
    the CPU use meanwhile; the servers' log tails first if it fails."""
    uses: list[Use] = []
    try:
        with cpu_of(horde.servers, uses):
            result = anyio.run(measure, *measure_args, backend=client_backend)
    except BaseException:
        print_log_tails(workdir, horde)
        raise
    return result, uses[0]


# (a) the text cycle, spread over the replicas ----------------------------------


def cycle_setups(args: argparse.Namespace) -> list[Setup]:
    setups = [
        Setup("sqlite", "1 process, SQLite", shared=False),
        Setup("pg_1", "1 process, PostgreSQL + Redis"),
        Setup("pg_2", "2 replicas, PostgreSQL + Redis", replicas=2),
    ]
    if args.processes_available:
        setups.append(
            Setup(
                "pg_processes_2",
                "--processes 2, PostgreSQL + Redis",
                serve_args=("--processes", "2"),
            )
        )
    setups.append(Setup("pg_only_1", "1 process, PostgreSQL, in-process signals", redis=False))
    if args.setups:
        wanted = args.setups.split(",")
        setups = [setup for setup in setups if setup.key in wanted]
    return setups


def run_cycle_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    report.figures["cycle"] = {}
    if args.against is not None:
        run_cycle_against(workdir, args, report)
        return
    rates: dict[str, float] = {}
    for setup in cycle_setups(args):
        rates[setup.key] = run_cycle_setup(workdir, args, report, setup)
    if "pg_2" in rates and "pg_1" in rates:
        scale = rates["pg_2"] / rates["pg_1"]
        report.add(
            "(a) ratio 2 replicas / 1 replica",
            f"{scale:.2f}",
            f">= {TARGET_SCALE:.1f}",
            scale >= TARGET_SCALE,
        )
        report.figures["cycle"]["ratio_2_replicas_1_replica"] = scale
    if "sqlite" in rates:
        for key, label in (("pg_1", "PostgreSQL + Redis"), ("pg_only_1", "PostgreSQL")):
            if key in rates:
                ratio = rates[key] / rates["sqlite"]
                report.add(f"(a) ratio 1 process {label} / SQLite", f"{ratio:.2f}")
                report.figures["cycle"][f"ratio_{key}_sqlite"] = ratio
    if "pg_processes_2" in rates and "pg_1" in rates:
        report.add(
            "(a) ratio --processes 2 / 1 process (PostgreSQL + Redis)",
            f"{rates['pg_processes_2'] / rates['pg_1']:.2f}",
        )
    elif not args.processes_available:
        report.add("(a) --processes 2", "not available: hordelite serve has no --processes")
    report.figures["cycle"]["processes_available"] = args.processes_available


def run_cycle_setup(
    workdir: Path,
    args: argparse.Namespace,
    report: tc.Report,
    setup: Setup,
    source: Path | None = None,
    tag: str = "",
) -> float:
    """(a) on one configuration (its servers run from ``source``, when
    given); its rows in the report; its cycles per second."""
    label = f"{setup.label}{tag}"
    fr.progress(f"(a) {label}")
    name = f"cycle-{setup.key}" + "".join(c if c.isalnum() else "-" for c in tag)
    with running_horde(workdir, name, setup, args, source) as horde:
        first = horde.servers[0]
        worker_key = tc.create_key(first, "bench-workers")
        requester_keys = [
            tc.create_key(first, f"bench-requester-{i}") for i in range(args.requesters)
        ]
        window, use = measured(
            workdir,
            horde,
            args.client_backend,
            tc.measure_cycle,
            horde.urls,
            worker_key,
            requester_keys,
            args,
        )
    report.cpu.append((f"(a) {label}", use.total))
    cycles = len(window.latencies)
    if not cycles:
        raise RuntimeError(f"no text request completed its cycle on {label}")
    rate = cycles / window.duration
    per_cycle = window.total / cycles
    report.add(
        f"(a) {label}: cycles completed",
        f"{rate:.1f} /s ({rate * per_cycle:.0f} HTTP req/s, {per_cycle:.2f} per cycle)",
    )
    report.add(f"(a) {label}: server CPU", cores_row(use, setup.shared))
    p50, p95 = tc.percentile(window.done, 50), tc.percentile(window.done, 95)
    report.add(f"(a) {label}: async-to-submitted p50 / p95", f"{tc.ms(p50)} / {tc.ms(p95)}")
    entry = {
        "cycles_per_s": rate,
        "requests_per_cycle": per_cycle,
        "requests_by_kind": window.requests,
        "server_cores": use.servers,
        "backing_cores": use.backing,
        "client_cores": use.total.client,
        "other_cores": use.total.others,
        "submitted_p50_ms": p50 * 1000,
        "submitted_p95_ms": p95 * 1000,
    }
    if tag:  # rounds of --against: each tree's runs, in order
        report.figures["cycle"].setdefault(f"{setup.key}{tag}", []).append(entry)
    else:
        report.figures["cycle"][setup.key] = entry
    return rate


def run_cycle_against(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    """(a) alternating between this checkout and ``--against``, round after
    round (each round runs every configuration on each tree, one after
    another), so that both trees see the same machine; the ratio of each
    configuration to SQLite is taken within a round, then its median."""
    trees: list[tuple[str, Path | None]] = [("this", None), ("against", args.against)]
    ratios: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for name, source in trees:
            rates = {
                setup.key: run_cycle_setup(
                    workdir, args, report, setup, source, f" [{name} {round_ + 1}]"
                )
                for setup in cycle_setups(args)
            }
            for key, rate in rates.items():
                if key != "sqlite" and "sqlite" in rates:
                    ratios.setdefault((name, key), []).append(rate / rates["sqlite"])
    for (name, key), values in sorted(ratios.items()):
        median = statistics.median(values)
        shown = ", ".join(f"{v:.2f}" for v in values)
        report.add(f"(a) ratio {key} / sqlite [{name}], median", f"{median:.2f} ({shown})")
        report.figures["cycle"][f"ratio_{key}_sqlite_{name}"] = values


# (b) cross-replica long-poll wake ------------------------------------------------


async def measure_cross_wake(
    urls: list[str], worker_key: str, requester_key: str, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Seconds from sending a request (on B, "cross"; on A, "same") to the
    answer of a pop already waiting on A; the two kinds alternate."""
    latencies: dict[str, list[float]] = {"cross": [], "same": []}
    async with (
        tc.lean_clients(tc.LeanHttp, urls[0], 2) as (worker, on_a),
        tc.lean_clients(tc.LeanHttp, urls[1], 1) as (on_b,),
    ):
        requesters = {"cross": on_b, "same": on_a}
        await tc.pop(worker, worker_key, "bench-waiter")  # check in
        for i in range(args.wake_rounds):
            for kind in ("cross", "same") if i % 2 == 0 else ("same", "cross"):
                answered: list[tuple[float, dict[str, Any]]] = []
                async with anyio.create_task_group() as tg:
                    tg.start_soon(tc.wait_for_job, worker, worker_key, answered)
                    # Give the pop time to reach A and park on the queue signal.
                    await anyio.sleep(args.wake_settle)
                    sent = time.perf_counter()
                    await tc.post_text(requesters[kind], requester_key)
                arrived, job = answered[0]
                if job["id"] is None:
                    raise RuntimeError(f"the waiting pop came back empty: {job}")
                latencies[kind].append(arrived - sent)
                await tc.submit(worker, worker_key, job["id"])
    return latencies


def run_wake_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    fr.progress("(b) cross-replica wake")
    setup = Setup("wake", "2 replicas", replicas=2)
    with running_horde(workdir, "wake", setup, args) as horde:
        worker_key = tc.create_key(horde.servers[0], "bench-worker")
        requester_key = tc.create_key(horde.servers[0], "bench-requester")
        latencies, use = measured(
            workdir,
            horde,
            args.client_backend,
            measure_cross_wake,
            horde.urls,
            worker_key,
            requester_key,
            args,
        )
    report.cpu.append(("(b) cross-replica wake", use.total))
    cross, same = latencies["cross"], latencies["same"]
    p50 = statistics.median(cross)
    report.add(
        f"(b) wake, pop on A, request on B, p50 ({len(cross)} rounds)",
        tc.ms(p50),
        f"<= {TARGET_WAKE_MS:.0f} ms",
        p50 * 1000 <= TARGET_WAKE_MS,
    )
    report.add("(b) wake, pop on A, request on B, p95", tc.ms(tc.percentile(cross, 95)))
    report.add(
        "(b) wake, pop and request on A, p50 / p95",
        f"{tc.ms(statistics.median(same))} / {tc.ms(tc.percentile(same, 95))}",
    )
    report.figures["wake"] = {
        "cross_p50_ms": p50 * 1000,
        "cross_p95_ms": tc.percentile(cross, 95) * 1000,
        "same_p50_ms": statistics.median(same) * 1000,
        "same_p95_ms": tc.percentile(same, 95) * 1000,
    }


# (c) progress post on B -> SSE bytes at a client of C --------------------------


async def measure_cross_relay(
    urls: list[str], worker_key: str, key: str, args: argparse.Namespace
) -> st.Latency:
    """stream.py's (a) across replicas: the call on C, the pop on A, the posts
    and the submit on B."""
    out = st.Latency()
    on_a, on_b, on_c = urls
    async with (
        tc.lean_clients(tc.LeanHttp, on_a, 1) as (popper,),
        tc.lean_clients(tc.LeanHttp, on_b, 1) as (poster,),
    ):
        await cc.chat_pop(popper, worker_key, st.WORKER)  # check in
        for _ in range(args.relay_streams):
            call = st.StreamingCall(on_c)
            tag = f"relay {uuid.uuid4()}"
            try:
                await call.open(st.stream_request(tag), key)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call.read)
                    popped = await st.pop_streamed(popper, worker_key, st.WORKER)
                    if st.tag_of(popped) != tag:
                        raise RuntimeError("the popped job is another call's")
                    job = st.StreamingJob(poster, worker_key, popped)
                    for seq in range(1, args.relay_posts + 1):
                        await job.post(seq, st.delta(seq, args.delta_chars))
                        await anyio.sleep(args.relay_interval)
                    # Every post's text has arrived by now (or it is lost).
                    with anyio.fail_after(5):
                        while len(call.text) < len(job.posted):
                            await call.grew.wait()
                    await job.submit()
            finally:
                await call.aclose()
            st.check_stream(call, job)
            for post in job.posts:
                arrived = call.arrival_of(post.end)
                assert arrived is not None
                out.relay.append(arrived - post.sent)
                out.post.append(post.answered - post.sent)
    return out


def run_relay_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    fr.progress("(c) progress relay across replicas")
    setup = Setup("relay", "3 replicas", replicas=3)
    env = {"HORDELITE_FRONT_PACE_PROGRESS": "false"}
    with fr.server_env(env), running_horde(workdir, "relay", setup, args) as horde:
        worker_key = tc.create_key(horde.servers[0], "bench-worker")
        key = tc.create_key(horde.servers[0], "bench-requester")
        out, use = measured(
            workdir,
            horde,
            args.client_backend,
            measure_cross_relay,
            horde.urls,
            worker_key,
            key,
            args,
        )
    report.cpu.append(("(c) progress relay across replicas", use.total))
    p50 = statistics.median(out.relay)
    report.add(
        f"(c) post to B -> its text at a client of C, p50 ({len(out.relay)} posts)",
        tc.ms(p50),
        f"<= {TARGET_RELAY_MS:.0f} ms",
        p50 * 1000 <= TARGET_RELAY_MS,
    )
    report.add(
        "(c) post to B -> its text at a client of C, p95 / max",
        f"{tc.ms(tc.percentile(out.relay, 95))} / {tc.ms(max(out.relay))}",
    )
    report.add(
        "(c) post to B sent -> answered, p50 / p95",
        f"{tc.ms(statistics.median(out.post))} / {tc.ms(tc.percentile(out.post, 95))}",
    )
    report.figures["relay"] = {
        "posts": len(out.relay),
        "relay_p50_ms": p50 * 1000,
        "relay_p95_ms": tc.percentile(out.relay, 95) * 1000,
        "post_p50_ms": statistics.median(out.post) * 1000,
        "post_p95_ms": tc.percentile(out.post, 95) * 1000,
    }


# (d) Redis connections per process while many calls wait ------------------------


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets a process holds."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def tcp_inodes_to(remote_port: int) -> dict[int, int]:
    """Local port -> socket inode of this machine's TCP connections to ``remote_port``."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == remote_port:
                    found[int(fields[1].rsplit(":", 1)[1], 16)] = int(fields[9])
    return found


def redis_connections(
    redis: RedisCommands, processes: dict[str, int]
) -> tuple[dict[str, int], int]:
    """Redis clients per process (label -> pid), by the socket each client's
    address belongs to; and INFO's connected_clients (every client of Redis)."""
    ports = [int(c["addr"].rsplit(":", 1)[1]) for c in redis.clients() if "addr" in c]
    inode_of = tcp_inodes_to(redis.port)
    counts = {}
    for label, pid in processes.items():
        mine = socket_inodes(pid)
        counts[label] = sum(1 for port in ports if inode_of.get(port) in mine)
    return counts, redis.connected_clients()


def server_processes(servers: Sequence[tc.Server]) -> dict[str, int]:
    """Label -> pid of every process of the servers (a server's own and any it started)."""
    processes = {}
    for server in servers:
        tree = process_tree(server.pid)
        for i, pid in enumerate(tree):
            name = server.name.rsplit("-", 1)[1]
            processes[f"{name}{f'.{i}' if len(tree) > 1 else ''} (pid {pid})"] = pid
    return processes


@dataclasses.dataclass
class Waits:
    calls: int
    before: dict[str, int] = dataclasses.field(default_factory=dict)
    during_max: dict[str, int] = dataclasses.field(default_factory=dict)
    during_last: dict[str, int] = dataclasses.field(default_factory=dict)
    clients_before: int = 0
    clients_during_max: int = 0
    samples: int = 0
    open_seconds: float = 0.0
    early: dict[int, int] = dataclasses.field(default_factory=dict)
    failures: dict[str, int] = dataclasses.field(default_factory=dict)
    uses: dict[str, Use] = dataclasses.field(default_factory=dict)


async def hold_waits(
    horde: Horde, worker_key: str, key: str, db: Database, args: argparse.Namespace
) -> Waits:
    waits = Waits(args.calls)
    urls = horde.urls
    redis = RedisCommands(horde.signals_url)
    processes = server_processes(horde.servers)

    def sample() -> None:
        counts, clients = redis_connections(redis, processes)
        waits.samples += 1
        waits.during_last = counts
        for label, count in counts.items():
            waits.during_max[label] = max(waits.during_max.get(label, 0), count)
        waits.clients_during_max = max(waits.clients_during_max, clients)

    try:
        # Warm-up: a worker on A serves calls spread over the replicas, so that
        # each has made the Redis commands of a whole call, then stops popping.
        stop = anyio.Event()
        async with (
            tc.lean_clients(tc.LeanHttp, urls[0], 1) as (worker,),
            tc.lean_clients(fr.SdkShapedHttp, urls, 2 * len(urls)) as callers,
        ):
            await cc.chat_pop(worker, worker_key, "bench-chat-worker")  # check in
            left = [args.warmup]

            async def warm(http: fr.SdkShapedHttp) -> None:
                while left[0] > 0:
                    left[0] -= 1
                    tag = f"warm-up {uuid.uuid4()}"
                    status, answer = await http.call("POST", COMPLETIONS, cc.chat_request(tag), key)
                    if status != 200 or fr.reply_tag(answer) != tag:
                        raise RuntimeError(f"a warm-up call got {status}: {answer}")

            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    fr.chat_worker, worker, "bench-chat-worker", worker_key, 1.0, None, stop
                )
                async with anyio.create_task_group() as calls:
                    for http in callers:
                        calls.start_soon(warm, http)
                stop.set()
            # A pop without wait: the worker stays online for the whole
            # horde.worker_online window, so the calls opened next are queued.
            await cc.chat_pop(worker, worker_key, "bench-chat-worker")
        await anyio.sleep(args.settle)
        waits.before, waits.clients_before = await anyio.to_thread.run_sync(
            redis_connections, redis, processes
        )

        async def call(i: int) -> None:
            http = fr.SdkShapedHttp(urls[i % len(urls)])
            try:
                await http.send(
                    "POST", COMPLETIONS, cc.chat_request(f"held {i} {uuid.uuid4()}"), key
                )
                status, _ = await http.receive()
                waits.early[status] = waits.early.get(status, 0) + 1  # none should come
            except (OSError, ConnectionError, anyio.BrokenResourceError) as exc:
                label = f"{type(exc.__cause__ or exc).__name__}"
                waits.failures[label] = waits.failures.get(label, 0) + 1
            finally:
                with anyio.CancelScope(shield=True):
                    await http.aclose()

        async with anyio.create_task_group() as tg:
            use: list[Use] = []
            began = time.perf_counter()
            next_sample = 0.0
            with cpu_of(horde.servers, use):
                # At most --open-ahead calls ahead of what the servers have
                # queued (front.py's (b)): a client far ahead fills the listen
                # backlog, and the kernel resets connections left there.
                sent = 0
                deadline = time.monotonic() + args.open_timeout
                while (
                    queued := await anyio.to_thread.run_sync(db.run_sync, fr.count_waiting, False)
                ) < args.calls:
                    if waits.early or waits.failures:
                        raise RuntimeError(f"calls were answered while opening: {waits}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{queued} of {args.calls} calls queued in {args.open_timeout} s"
                        )
                    while sent < min(args.calls, queued + args.open_ahead):
                        tg.start_soon(call, sent)
                        sent += 1
                    if time.monotonic() >= next_sample:
                        await anyio.to_thread.run_sync(sample)
                        next_sample = time.monotonic() + args.sample_every
                    await anyio.sleep(0.05)
            waits.open_seconds = time.perf_counter() - began
            waits.uses["open"] = use[0]
            fr.progress(f"(d) {args.calls} calls queued in {waits.open_seconds:.1f} s; holding")
            use = []
            with cpu_of(horde.servers, use):
                end = time.monotonic() + args.hold
                while time.monotonic() < end:
                    await anyio.to_thread.run_sync(sample)
                    await anyio.sleep(args.sample_every)
            waits.uses["hold"] = use[0]
            if waits.early or waits.failures:
                raise RuntimeError(f"calls were answered while held: {waits}")
            tg.cancel_scope.cancel()  # hang up every call
    finally:
        redis.close()
    return waits


def run_redis_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    fr.progress(f"(d) Redis connections with {args.calls} calls waiting")
    client_limit = fr.raise_fd_limit(args.calls + 1000)
    env = {
        "HORDELITE_FRONT_TIMEOUT": 3600,
        "HORDELITE_FRONT_NO_WORKER_GRACE": 3600,
        "HORDELITE_FRONT_MAX_OPEN_CALLS": args.calls + 1000,
        "HORDELITE_FRONT_MAX_OPEN_PER_SOURCE": args.calls + 1000,
        # One bench user stands for many users: no in-flight limit.
        "HORDELITE_HORDE_CONCURRENCY": 0,
    }
    setup = Setup("redis", "2 replicas", replicas=2)
    with fr.server_env(env), running_horde(workdir, "redis", setup, args) as horde:
        server_limits = [fr.fd_limit_of(server.pid) for server in horde.servers]
        worker_key = tc.create_key(horde.servers[0], "bench-worker")
        key = tc.create_key(horde.servers[0], "bench-requester")
        db = Database(horde.database, 1)
        try:
            waits = anyio.run(
                hold_waits, horde, worker_key, key, db, args, backend=args.client_backend
            )
        except BaseException:
            print_log_tails(workdir, horde)
            raise
        finally:
            db.dispose()
    n = waits.calls
    report.cpu += [
        (f"(d) opening {n:,} calls", waits.uses["open"].total),
        (f"(d) {n:,} calls held", waits.uses["hold"].total),
    ]
    report.add(
        f"(d) {n:,} calls opened and queued over 2 replicas",
        f"in {waits.open_seconds:.1f} s ({n / waits.open_seconds:.0f} /s)",
    )
    flat = True
    for label, before in waits.before.items():
        during, last = waits.during_max.get(label, 0), waits.during_last.get(label, 0)
        same = during == before and last == before
        flat = flat and same
        report.add(
            f"(d) Redis connections of {label}: before / during (max, last)",
            f"{before} / {during}, {last}",
            f"flat (~{EXPECTED_REDIS_CONNECTIONS})",
            same,
        )
    report.add(
        "(d) Redis connected_clients (all clients): before / during (max)",
        f"{waits.clients_before} / {waits.clients_during_max} ({waits.samples} samples)",
    )
    report.add("(d) server CPU while held", cores_row(waits.uses["hold"], True))
    report.add("(d) fd limits servers / client", f"{', '.join(server_limits)} / {client_limit}")
    report.figures["redis_connections"] = {
        "calls": n,
        "before": waits.before,
        "during_max": waits.during_max,
        "during_last": waits.during_last,
        "connected_clients_before": waits.clients_before,
        "connected_clients_during_max": waits.clients_during_max,
        "open_seconds": waits.open_seconds,
        "flat": flat,
    }


# (e) the OpenAI front's chat cycle, 1 and 2 processes -------------------------


def run_front_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    rates: dict[str, float] = {}
    report.figures["front_cycle"] = {}
    for setup in cycle_setups(args):
        fr.progress(f"(e) {setup.label}")
        # User and worker names carry the configuration, so that none is
        # taken twice in one database even were its storage not fresh (a
        # second user of a name is refused).
        prefix = f"front-{setup.key}"
        with running_horde(workdir, prefix, setup, args) as horde:
            first = horde.servers[0]
            worker_key = tc.create_key(first, f"{prefix}-workers")
            requester_keys = [
                tc.create_key(first, f"{prefix}-requester-{i}") for i in range(args.requesters)
            ]
            window, use = measured(
                workdir,
                horde,
                args.client_backend,
                fr.measure_front_cycle,
                horde.urls,
                worker_key,
                requester_keys,
                args,
                f"{prefix}-chat-worker",
            )
        report.cpu.append((f"(e) {setup.label}", use.total))
        done = len(window.latencies)
        if not done:
            raise RuntimeError(f"no chat completion came back on {setup.label}")
        rate = rates[setup.key] = done / window.duration
        per_done = window.total / done
        kinds = ", ".join(
            f"{kind} {window.requests.get(kind, 0) / done:.2f}"
            for kind in ("completions", "pop", "submit")
        )
        report.add(
            f"(e) {setup.label}: chat completions completed",
            f"{rate:.1f} /s ({per_done:.2f} HTTP req each: {kinds})",
        )
        report.add(f"(e) {setup.label}: server CPU", cores_row(use, setup.shared))
        p50, p95 = tc.percentile(window.latencies, 50), tc.percentile(window.latencies, 95)
        report.add(f"(e) {setup.label}: sent-to-answered p50 / p95", f"{tc.ms(p50)} / {tc.ms(p95)}")
        report.figures["front_cycle"][setup.key] = {
            "completed_per_s": rate,
            "requests_per_completion": per_done,
            "requests_by_kind": window.requests,
            "server_cores": use.servers,
            "backing_cores": use.backing,
            "client_cores": use.total.client,
            "other_cores": use.total.others,
            "answered_p50_ms": p50 * 1000,
            "answered_p95_ms": p95 * 1000,
        }
    if "pg_processes_2" in rates and "pg_1" in rates:
        scale = rates["pg_processes_2"] / rates["pg_1"]
        report.add(
            "(e) ratio --processes 2 / 1 process (PostgreSQL + Redis)",
            f"{scale:.2f}",
            f">= {TARGET_FRONT_PROCESSES:.1f}",
            scale >= TARGET_FRONT_PROCESSES,
        )
        report.figures["front_cycle"]["ratio_processes_2_1_process"] = scale
    elif not args.processes_available:
        report.add("(e) --processes 2", "not available: hordelite serve has no --processes")
    if "pg_2" in rates and "pg_1" in rates:
        report.add("(e) ratio 2 replicas / 1 process", f"{rates['pg_2'] / rates['pg_1']:.2f}")
        report.figures["front_cycle"]["ratio_2_replicas_1_process"] = rates["pg_2"] / rates["pg_1"]
    if "sqlite" in rates and "pg_1" in rates:
        report.add(
            "(e) ratio 1 process PostgreSQL + Redis / SQLite",
            f"{rates['pg_1'] / rates['sqlite']:.2f}",
        )
    report.figures["front_cycle"]["processes_available"] = args.processes_available


# Command line ---------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument(
        "--phases",
        default="abcde",
        help="which phases to run: any of a, b, c, d, e (default abcde)",
    )
    p.add_argument(
        "--setups",
        default="sqlite,pg_1,pg_2,pg_processes_2",
        help="the configurations of (a) and (e), by key: sqlite, pg_1 (PostgreSQL + Redis), "
        "pg_2 (two replicas), pg_processes_2, pg_only_1 (PostgreSQL, in-process signals); "
        "default all but pg_only_1",
    )
    p.add_argument(
        "--against",
        type=Path,
        help="another hordelite tree (a worktree of an older commit): (a) alternates "
        "between this checkout and it, --rounds times, and prints each tree's ratio "
        "of every configuration to SQLite",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of (a) with --against (default 3)")
    p.add_argument(
        "--postgres",
        default=os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES),
        help=f"PostgreSQL URL; each configuration gets a schema of its own in it "
        f"(default ${POSTGRES_ENV} or {DEFAULT_POSTGRES})",
    )
    p.add_argument(
        "--redis",
        default=os.environ.get(REDIS_ENV, DEFAULT_REDIS),
        help=f"Redis URL; its host and port are used, with --redis-db "
        f"(default ${REDIS_ENV} or {DEFAULT_REDIS})",
    )
    p.add_argument(
        "--redis-db",
        type=int,
        default=5,
        help="Redis logical database of the servers, flushed before each configuration (default 5)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="seconds of the timed run of each configuration in (a) and (e) (default 10)",
    )
    p.add_argument(
        "--requesters",
        type=int,
        default=16,
        help="concurrent requesters in (a) and (e) (default 16)",
    )
    p.add_argument(
        "--workers", type=int, default=4, help="concurrent workers in (a) and (e) (default 4)"
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.05,
        help="seconds a requester waits before each status poll in (a) (default 0.05)",
    )
    p.add_argument(
        "--pop-wait",
        type=float,
        default=5.0,
        help='the workers\' pop "wait" in (a) and (e) (default 5)',
    )
    p.add_argument(
        "--wake-rounds",
        type=int,
        default=50,
        help="rounds in (b), each a cross-replica and a same-replica wake (default 50)",
    )
    p.add_argument(
        "--wake-settle",
        type=float,
        default=0.05,
        help="seconds a pop gets to park on the server before the request in (b) (default 0.05)",
    )
    p.add_argument(
        "--relay-streams", type=int, default=5, help="streams in (c), one at a time (default 5)"
    )
    p.add_argument(
        "--relay-posts", type=int, default=10, help="progress posts per stream in (c) (default 10)"
    )
    p.add_argument(
        "--relay-interval",
        type=float,
        default=0.025,
        help="seconds between a post's answer and the next post in (c) (default 0.025)",
    )
    p.add_argument(
        "--delta-chars", type=int, default=8, help="characters of text per post in (c) (default 8)"
    )
    p.add_argument(
        "--calls", type=int, default=5000, help="calls held waiting in (d) (default 5000)"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=40,
        help="calls served over the replicas before (d) counts connections (default 40)",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=1.0,
        help="seconds after the warm-up before (d)'s first count (default 1)",
    )
    p.add_argument(
        "--hold",
        type=float,
        default=5.0,
        help="seconds (d) keeps sampling once every call is queued (default 5)",
    )
    p.add_argument(
        "--sample-every",
        type=float,
        default=0.5,
        help="seconds between (d)'s counts of Redis connections (default 0.5)",
    )
    p.add_argument(
        "--open-ahead",
        type=int,
        default=64,
        help="calls opened but not yet queued by the servers, at most, in (d) (default 64)",
    )
    p.add_argument(
        "--open-timeout", type=float, default=120.0, help="seconds to open the calls in (d)"
    )
    tc.add_common_arguments(p)
    p.set_defaults(client="lean")  # for tc.print_report
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.processes_available = ("a" in args.phases or "e" in args.phases) and processes_option()
    return tc.run_phases(
        args,
        {
            "a": run_cycle_phase,
            "b": run_wake_phase,
            "c": run_relay_phase,
            "d": run_redis_phase,
            "e": run_front_phase,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
