"""Many open connections against a real `hordelite serve` (issue 9, "Performance").

The pieces (the server as a child process, the lean HTTP client, CPU
accounting, the report) are bench/text_cycle.py's, the chat request and pop
bench/chat_cycle.py's, the server environment and the file descriptor limit
bench/front.py's; all imported. The server gets a fresh SQLite file.

What it does, on loopback only, every loop bounded in count and time:

1. A chat worker checks in once, declaring the bench's chat model, and never
   pops again: chat calls for that model wait (front.timeout and
   front.no_worker_grace are an hour, no in-flight limit, front caps above
   the calls). A warm-up opens and closes ``--warmup`` calls and pops.
2. Baseline: a probe, on its own thread and connection, sends GET
   /api/v2/status/heartbeat every ``--beat-interval`` for ``--baseline``
   seconds.
3. ``--calls`` non-streamed POST /v1/chat/completions (they wait) and
   ``--pops`` POST /api/v2/generate/text/pop with ``"wait"`` ``--pop-wait``
   for a model nobody requests (they wait the whole long-poll), interleaved,
   one connection each, opened within ``--open-seconds``. The probe goes on.
4. Once every pop is answered, every call's client hangs up at once; the
   probe goes on through that mass disconnect, until every request of a call
   is cancelled (or ``--cancel-timeout``).
5. Then the connections are gone: the server's memory after.

Figures and targets:

- the probe's p99 while the connections are open: < 100 ms (also shown:
  p50, max, during the disconnect, and each over the baseline);
- how late each pop is answered, past its ``wait``: p99 and max within 1 s,
  every pop answered;
- connections the server held at once (its open socket descriptors, from
  /proc, peak), and the listen queue's peak;
- requests left waiting after their calls' clients hung up: 0;
- the server's VmRSS before, with the connections open, and after they
  close: after within 10% of before;
- errors in the server's log (e.g. trio.BusyResourceError): 0.

The table of cores busy (server, this load generator, everything else)
comes with every window, as in text_cycle.py: read it first. On a shared
machine the probe's figures move with the others' load.

    .venv/bin/python bench/connections.py          # the default run, about 1.5 minutes
    .venv/bin/python bench/connections.py --calls 200 --pops 200 --pop-wait 10
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import anyio.to_thread
import chat_cycle as cc  # bench/ is the script's folder, so on sys.path
import front as fr
import text_cycle as tc
from sqlalchemy import Connection, func, select

from hordelite.config import load_config
from hordelite.storage.database import Database
from hordelite.storage.schema import requests

COMPLETIONS = "/v1/chat/completions"
TEXT_MODEL = "bench-nobody-asks-for-this"

TARGET_BEAT_P99 = 0.100  # seconds
TARGET_POP_LATE = 1.0  # seconds
TARGET_RSS_BACK = 1.10  # after / before


# The probe: another client's heartbeat, on its own thread ---------------------------


class Probe:
    """GET /api/v2/status/heartbeat every ``interval`` on a keep-alive
    connection of its own, in a thread (blocking sockets), so that the load
    generator's event loop does not delay it; latencies go to the current
    window's list. A reconnect (the server closed the connection) counts in
    the latency of the request that needed it."""

    def __init__(self, url: str, interval: float) -> None:
        parts = urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.interval = interval
        self.windows: dict[str, list[float]] = {}
        self.window = ""
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat-probe", daemon=True)
        self._sock: socket.socket | None = None

    def start(self, window: str) -> None:
        self.switch(window)
        self._thread.start()

    def switch(self, window: str) -> None:
        self.windows.setdefault(window, [])
        self.window = window

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        request = b"GET /api/v2/status/heartbeat HTTP/1.1\r\nhost: bench\r\n\r\n"
        while not self._stop.is_set():
            # A beat counts in the window it was sent in.
            window, started = self.window, time.perf_counter()
            try:
                self._beat(request)
            except OSError:
                self.errors += 1
                self._close()
            else:
                self.windows[window].append(time.perf_counter() - started)
            left = self.interval - (time.perf_counter() - started)
            if left > 0:
                self._stop.wait(left)
        self._close()

    def _beat(self, request: bytes) -> None:
        if self._sock is None:
            self._sock = socket.create_connection(self.address, timeout=60)
        self._sock.sendall(request)
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            buffer += self._recv()
        head, body = buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").lower().split("\r\n")
        headers = dict(line.split(":", 1) for line in lines[1:])
        length = int(headers["content-length"])
        while len(body) < length:
            body += self._recv()
        if not lines[0].split()[1] == "200":
            raise OSError(f"heartbeat answered {lines[0]}")
        if headers.get("connection", "").strip() == "close":
            self._close()

    def _recv(self) -> bytes:
        assert self._sock is not None
        data = self._sock.recv(65536)
        if not data:
            raise OSError("the server closed the probe's connection mid-answer")
        return data

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


# The server, seen from /proc -------------------------------------------------------


def open_sockets(pid: int) -> int:
    """Socket descriptors the server process holds (its connections, its
    listening socket and its database's, if any)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd).startswith("socket:"):
                count += 1
    return count


def listen_queue(port: int) -> int:
    """Connections waiting in the listen socket's accept queue on ``port``."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return int(fields[4].split(":")[1], 16)
    return 0


def count_waiting_chat(conn: Connection) -> int:
    query = (
        select(func.count())
        .select_from(requests)
        .where(requests.c.state == "waiting", requests.c.kind == "chat")
    )
    return int(conn.execute(query).scalar_one())


# The connections -----------------------------------------------------------------


def text_pop(name: str, wait: float) -> dict[str, Any]:
    return {**tc.pop_body(name, wait), "models": [TEXT_MODEL]}


@dataclasses.dataclass
class Opened:
    """The many connections of one run."""

    pops: int = 0
    pops_ended: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    calls: list[fr.SdkShapedHttp] = dataclasses.field(default_factory=list)
    connect_errors: dict[str, int] = dataclasses.field(default_factory=dict)
    early_answers: dict[int, int] = dataclasses.field(default_factory=dict)
    pop_late: list[float] = dataclasses.field(default_factory=list)
    pop_errors: dict[str, int] = dataclasses.field(default_factory=dict)

    def failed(self, into: dict[str, int], exc: BaseException) -> None:
        name = type(exc).__name__
        into[name] = into.get(name, 0) + 1

    def pop_ended(self) -> None:
        if len(self.pop_late) + sum(self.pop_errors.values()) >= self.pops:
            self.pops_ended.set()


async def open_call(http: fr.SdkShapedHttp, key: str, opened: Opened) -> None:
    """A chat call that waits; its answer, if one comes before the hang-up, is counted."""
    try:
        await http.send("POST", COMPLETIONS, cc.chat_request(f"held {uuid.uuid4()}"), key)
    except OSError as exc:
        opened.failed(opened.connect_errors, exc)
        return
    opened.calls.append(http)
    with contextlib.suppress(Exception):
        status, _ = await http.receive()
        opened.early_answers[status] = opened.early_answers.get(status, 0) + 1


async def open_pop(url: str, worker_key: str, name: str, wait: float, opened: Opened) -> None:
    http = tc.LeanHttp(url)
    try:
        sent = time.perf_counter()
        answer = await tc.expect(
            200, http.call("POST", "/generate/text/pop", text_pop(name, wait), worker_key)
        )
        if answer["id"] is not None:
            raise RuntimeError(f"a pop got a job nobody asked for: {answer}")
        opened.pop_late.append(time.perf_counter() - sent - wait)
    except (OSError, RuntimeError, ValueError) as exc:
        opened.failed(opened.pop_errors, exc)
    finally:
        opened.pop_ended()
        await http.aclose()


async def open_and_hold(
    server: tc.Server,
    worker_key: str,
    key: str,
    calls: int,
    pops: int,
    wait: float,
    seconds: float,
    names: int,
) -> tuple[Opened, float]:
    """Open ``calls`` calls and ``pops`` pops, interleaved, spread evenly over
    ``seconds``; hold them until every pop is answered (or a minute past its
    wait). Returns them (the calls still open) and the seconds opening took."""
    opened = Opened(pops=pops)
    total = calls + pops
    made_calls = made_pops = 0
    async with anyio.create_task_group() as tg:
        start = time.perf_counter()
        for i in range(total):
            await anyio.sleep(max(start + seconds * i / total - time.perf_counter(), 0))
            # Interleaved in proportion, so both kinds open over the whole spread.
            if made_pops < pops and (made_calls >= calls or made_pops * calls <= made_calls * pops):
                name = f"bench-pop-{made_pops % names}"
                tg.start_soon(open_pop, server.url, worker_key, name, wait, opened)
                made_pops += 1
            else:
                tg.start_soon(open_call, fr.SdkShapedHttp(server.url), key, opened)
                made_calls += 1
        took = time.perf_counter() - start
        # The pops end by themselves; the calls wait until hung up.
        with anyio.move_on_after(wait + seconds + 60):
            await opened.pops_ended.wait()
        tg.cancel_scope.cancel()
    return opened, took


# The run ---------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    rss_before_kb: int = 0
    rss_open_kb: int = 0
    rss_after_kb: int = 0
    rss_second_kb: int = 0  # after a second identical burst
    sockets_idle: int = 0
    sockets_peak: int = 0
    listen_queue_peak: int = 0
    open_seconds: float = 0.0
    hang_up_to_cancelled: float = 0.0
    left_waiting: int = 0
    beats: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    probe_errors: int = 0
    opened: Opened = dataclasses.field(default_factory=Opened)
    cpu: dict[str, tc.CpuUse] = dataclasses.field(default_factory=dict)


async def until_connections_gone(server: tc.Server, idle: int, settle: float) -> None:
    """Until the server holds no more sockets than ``idle`` (at most 30 s), then ``settle`` s."""
    with anyio.move_on_after(30):
        while True:
            if open_sockets(server.pid) <= idle:
                break
            await anyio.sleep(0.2)
    await anyio.sleep(settle)


async def measure(
    server: tc.Server, worker_key: str, key: str, db: Database, args: argparse.Namespace
) -> Run:
    run = Run()
    port = urlsplit(server.url).port or 80
    async with tc.lean_clients(tc.LeanHttp, server.url, 1) as (worker,):
        await cc.chat_pop(worker, worker_key, "bench-chat-worker")  # online; never pops again

    async def until_cancelled(deadline: float) -> int:
        """Requests of chat calls still waiting, polled until none or ``deadline``."""
        while True:
            waiting = await anyio.to_thread.run_sync(db.run_sync, count_waiting_chat, False)
            if waiting == 0 or time.monotonic() > deadline:
                return int(waiting)
            await anyio.sleep(0.1)

    # Warm-up: the first calls and pops allocate what later ones reuse.
    warm, _ = await open_and_hold(
        server, worker_key, key, args.warmup, args.warmup, 1.0, 0.5, args.pop_workers
    )
    for http in warm.calls:
        await http.aclose()
    await until_cancelled(time.monotonic() + args.cancel_timeout)

    probe = Probe(server.url, args.beat_interval)
    probe.start("baseline")
    try:
        cpu: list[tc.CpuUse] = []
        with tc.cpu_use(server.pid, cpu):
            await anyio.sleep(args.baseline)
        run.cpu["baseline"] = cpu[-1]
        run.sockets_idle = open_sockets(server.pid)
        run.rss_before_kb = fr.vm_rss_kb(server.pid)

        probe.switch("open")
        sampling = True

        async def sample() -> None:
            while sampling:
                run.sockets_peak = max(run.sockets_peak, open_sockets(server.pid))
                run.listen_queue_peak = max(run.listen_queue_peak, listen_queue(port))
                run.rss_open_kb = max(run.rss_open_kb, fr.vm_rss_kb(server.pid))
                await anyio.sleep(0.2)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            with tc.cpu_use(server.pid, cpu):
                opened, run.open_seconds = await open_and_hold(
                    server,
                    worker_key,
                    key,
                    args.calls,
                    args.pops,
                    args.pop_wait,
                    args.open_seconds,
                    args.pop_workers,
                )
            run.cpu["open"] = cpu[-1]
            sampling = False
        run.opened = opened

        # Every call's client hangs up at once.
        probe.switch("disconnect")
        with tc.cpu_use(server.pid, cpu):
            hung_up = time.monotonic()
            for http in opened.calls:
                await http.aclose()
            run.left_waiting = await until_cancelled(hung_up + args.cancel_timeout)
            run.hang_up_to_cancelled = time.monotonic() - hung_up
            await anyio.sleep(max(hung_up + args.hang_up_window - time.monotonic(), 0))
        run.cpu["disconnect"] = cpu[-1]

        probe.switch("after")
        await until_connections_gone(server, run.sockets_idle, args.settle)
        run.rss_after_kb = fr.vm_rss_kb(server.pid)

        # The same burst again (short pops): memory kept past the first that
        # the second does not add to is reused, not leaked.
        again, _ = await open_and_hold(
            server,
            worker_key,
            key,
            args.calls,
            args.pops,
            min(args.pop_wait, 5.0),
            args.open_seconds,
            args.pop_workers,
        )
        for http in again.calls:
            await http.aclose()
        await until_cancelled(time.monotonic() + args.cancel_timeout)
        await until_connections_gone(server, run.sockets_idle, args.settle)
        run.rss_second_kb = fr.vm_rss_kb(server.pid)
    finally:
        await anyio.to_thread.run_sync(probe.stop)
    run.beats = probe.windows
    run.probe_errors = probe.errors
    return run


def beat_row(beats: list[float], baseline: list[float]) -> str:
    if len(beats) < 2:
        return f"{len(beats)} heartbeat(s) answered" + (f", {tc.ms(beats[0])}" if beats else "")
    p50, p99, top = tc.percentile(beats, 50), tc.percentile(beats, 99), max(beats)
    b99 = tc.percentile(baseline, 99)
    return (
        f"p50 {tc.ms(p50)}, p99 {tc.ms(p99)} ({p99 / b99:.1f}x baseline), "
        f"max {tc.ms(top)}, n={len(beats)}"
    )


def run_connections_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    client_limit = fr.raise_fd_limit(args.calls + args.pops + 1000)
    env = {
        "HORDELITE_FRONT_TIMEOUT": 3600,
        "HORDELITE_FRONT_NO_WORKER_GRACE": 3600,
        "HORDELITE_FRONT_MAX_OPEN_CALLS": args.calls + 1000,
        "HORDELITE_FRONT_MAX_OPEN_PER_SOURCE": args.calls + 1000,
        # One bench user stands for many users: no in-flight limit.
        "HORDELITE_HORDE_CONCURRENCY": 0,
    }
    with (
        fr.server_env(env),
        tc.running_server(workdir, "connections", args.server_backend) as server,
    ):
        server_limit = fr.fd_limit_of(server.pid)
        worker_key = tc.create_key(server, "bench-worker")
        key = tc.create_key(server, "bench-requester")
        db = Database(load_config(server.config).storage.database, 1)
        try:
            run = anyio.run(measure, server, worker_key, key, db, args, backend=args.client_backend)
        except BaseException:
            fr.print_log_tail(workdir / "connections.log")
            raise
        finally:
            db.dispose()
    log = (workdir / "connections.log").read_text(errors="replace")
    log_errors = sum(1 for line in log.splitlines() if " ERROR " in line)
    if log_errors:
        fr.print_log_tail(workdir / "connections.log")

    n, o = args.calls + args.pops, run.opened
    report.cpu += [
        ("baseline (probe only)", run.cpu["baseline"]),
        (f"{n:,} connections opened and held", run.cpu["open"]),
        (f"{len(o.calls):,} calls hung up", run.cpu["disconnect"]),
    ]
    report.add(
        "connections opened",
        f"{args.calls:,} calls + {args.pops:,} pops in {run.open_seconds:.1f} s"
        + (f"; connect errors {o.connect_errors}" if o.connect_errors else ""),
    )
    held = run.sockets_peak - run.sockets_idle
    report.add(
        "server held at once (socket descriptors, peak)",
        f"{held:,} of {n:,}; listen queue peak {run.listen_queue_peak}",
        f"{n:,}",
        held >= n,
    )
    baseline = run.beats.get("baseline", [])
    report.add("heartbeat, baseline", beat_row(baseline, baseline))
    open_beats = run.beats.get("open", [])
    p99 = tc.percentile(open_beats, 99) if len(open_beats) > 1 else float("inf")
    report.add(
        "heartbeat while they are open",
        beat_row(open_beats, baseline),
        f"p99 < {TARGET_BEAT_P99 * 1000:.0f} ms",
        p99 < TARGET_BEAT_P99,
    )
    report.add(
        "heartbeat during the mass hang-up", beat_row(run.beats.get("disconnect", []), baseline)
    )
    late = o.pop_late
    answered = len(late)
    if answered > 1:
        late99, worst = tc.percentile(late, 99), max(late)
        report.add(
            f"pop answered past its wait ({args.pop_wait:.0f} s)",
            f"p50 {tc.ms(tc.percentile(late, 50))}, p99 {tc.ms(late99)}, max {tc.ms(worst)}; "
            f"{answered:,} of {args.pops:,} answered"
            + (f"; errors {o.pop_errors}" if o.pop_errors else ""),
            f"max <= {TARGET_POP_LATE:.0f} s, all answered",
            worst <= TARGET_POP_LATE and answered == args.pops,
        )
    else:
        report.add("pop answered past its wait", f"{answered} answered", "all", False)
    if o.early_answers:
        report.add("calls answered before the hang-up", json.dumps(o.early_answers))
    report.add(
        "requests left waiting after their clients hung up",
        f"{run.left_waiting} of {len(o.calls):,} (all cancelled in "
        f"{run.hang_up_to_cancelled:.1f} s)",
        "0",
        run.left_waiting == 0,
    )
    back = run.rss_after_kb / run.rss_before_kb
    report.add(
        "server VmRSS before / open / after",
        " / ".join(
            f"{kb / 1024:.1f}" for kb in (run.rss_before_kb, run.rss_open_kb, run.rss_after_kb)
        )
        + f" MiB; after / before {back:.2f}",
        f"after <= {TARGET_RSS_BACK:.2f} x before",
        back <= TARGET_RSS_BACK,
    )
    report.add(
        "server VmRSS after the same burst again",
        f"{run.rss_second_kb / 1024:.1f} MiB; x{run.rss_second_kb / run.rss_after_kb:.2f} of "
        "after the first (near 1: the first burst's memory is reused, not leaked)",
    )
    report.add("errors in the server's log", str(log_errors), "0", log_errors == 0)
    report.add(
        "fd limits server / client; probe errors",
        f"{server_limit} / {client_limit}; {run.probe_errors}",
    )
    report.figures["connections"] = {
        **{k: v for k, v in dataclasses.asdict(run).items() if k not in ("cpu", "beats", "opened")},
        "beats_p99_ms": {
            name: tc.percentile(b, 99) * 1000 for name, b in run.beats.items() if len(b) > 1
        },
        "beats_max_ms": {name: max(b) * 1000 for name, b in run.beats.items() if b},
        "pop_late_p99_ms": tc.percentile(late, 99) * 1000 if answered > 1 else None,
        "pop_late_max_ms": max(late) * 1000 if late else None,
        "pops_answered": answered,
        "connect_errors": o.connect_errors,
        "pop_errors": o.pop_errors,
        "log_errors": log_errors,
    }


# Command line ----------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--phases", default="a", help="which phases to run: a (the only one)")
    p.add_argument("--calls", type=int, default=1000, help="waiting OpenAI calls (default 1000)")
    p.add_argument("--pops", type=int, default=1000, help="long-polled pops (default 1000)")
    p.add_argument(
        "--pop-workers",
        type=int,
        default=1000,
        help="worker names the pops are spread over (default 1000: one worker each)",
    )
    p.add_argument(
        "--pop-wait", type=float, default=30.0, help='the pops\' "wait" in seconds (default 30)'
    )
    p.add_argument(
        "--open-seconds",
        type=float,
        default=2.0,
        help="seconds over which the connections are opened (default 2)",
    )
    p.add_argument(
        "--beat-interval",
        type=float,
        default=0.02,
        help="seconds between the probe's heartbeats (default 0.02)",
    )
    p.add_argument(
        "--baseline", type=float, default=5.0, help="seconds of baseline probing (default 5)"
    )
    p.add_argument(
        "--warmup", type=int, default=100, help="calls and pops of the warm-up (default 100)"
    )
    p.add_argument(
        "--cancel-timeout",
        type=float,
        default=30.0,
        help="seconds the hung-up calls' requests get to be cancelled (default 30)",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="seconds after the last connection closed before the memory is read (default 2)",
    )
    p.add_argument(
        "--hang-up-window",
        type=float,
        default=3.0,
        help="seconds the probe runs after the hang-up, at least (default 3)",
    )
    tc.add_common_arguments(p)
    p.set_defaults(client="lean")  # the report's header names it
    return p


def main(argv: list[str] | None = None) -> int:
    # The probe's thread waits less for the GIL held by the load generator.
    sys.setswitchinterval(0.001)
    return tc.run_phases(parser().parse_args(argv), {"a": run_connections_phase})


if __name__ == "__main__":
    sys.exit(main())
