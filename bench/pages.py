"""What pages polled against a large pool cost the rest of the horde (decision 0048).

A real ``hordelite serve`` child (text_cycle.py's server, a fresh SQLite file)
holds ``--workers`` (400) workers of ``--models`` (100) models each, checked
in by their pops (made-up model names, ~15 characters), and ``--requests``
(220) requests queued, each naming one worker's models. Then, in the same
run:

- baseline: a prober reads GET /api/v2/status/heartbeat every ~10 ms for
  ``--seconds`` (5) with nothing else running;
- pollers: the same prober while ``--pollers`` (4) clients poll the pages
  back to back, each on its own keep-alive connection: GET /, GET /metrics
  and the dashboard's JSON route (GET /dashboard/pool; a tree without it is
  polled on the routes its dashboard script read, GET
  /api/v2/status/models?chat=true and GET /api/v2/workers).

Printed: heartbeat p50/p99/max for both, the ratio of the p99s, the pages'
sizes and the rate the pollers got them at, and the cores the server kept
busy. Target: heartbeat p99 with the pollers < 50 ms.

``--base TREE`` runs the same against another hordelite tree (a git
worktree, the server run with ``PYTHONPATH`` set to it) first, in the same
run, and prints its figures and the ratio of this tree's to them:

    git worktree add --detach ../base 69caed8
    .venv/bin/python bench/pages.py --base ../base        # about 2 minutes
    .venv/bin/python bench/pages.py --seconds 10

The exit status is 1 when this tree misses the target.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import anyio
import text_cycle as tc  # bench/ is the script's folder, so on sys.path

TARGET_HEARTBEAT_P99 = 0.050  # seconds
HEARTBEAT_PERIOD = 0.010  # one read started every 10 ms (or at once when late)
REQUESTERS = 11  # keys the requests are spread over (each under its concurrency)
POPPERS = 8  # connections the pops are sent on
# The registration caps lifted: the pool is the worst the wire allows.
UNCAPPED = {"budgets": {"workers_per_user": 0, "models_per_worker": 100}}
JSON_ROUTES = ["/dashboard/pool"]
# What a dashboard without /dashboard/pool polled instead.
OLD_JSON_ROUTES = ["/api/v2/status/models?chat=true", "/api/v2/workers"]


class RawHttp(tc.LeanHttp):
    """The lean client with a GET of any path, answering its status and body bytes."""

    async def get(self, path: str) -> tuple[int, bytes]:
        stream = await self._connection()
        head = (
            f"GET {path} HTTP/1.1\r\nhost: {self._host}\r\nclient-agent: {tc.CLIENT_AGENT}\r\n\r\n"
        )
        await stream.send(head.encode())
        status, answer = await self._read_answer()
        self._last_used = time.monotonic()
        return status, answer


def model_name(i: int, j: int) -> str:
    return f"made-up-{i:03d}-{j:02d}"


async def fill(
    server: tc.Server, owner: str, requesters: list[str], args: argparse.Namespace
) -> None:
    """The pool's workers (their pops) and the queued requests."""

    async def pops(http: tc.Http, first: int) -> None:
        for i in range(first, args.workers, POPPERS):
            body = {
                **tc.pop_body(f"bench-worker-{i:03d}"),
                "models": [model_name(i, j) for j in range(args.models)],
            }
            await tc.expect(200, http.call("POST", "/generate/text/pop", body, owner))

    async with tc.open_clients("lean", server.url, POPPERS) as clients:
        async with anyio.create_task_group() as tg:
            for k, http in enumerate(clients):
                tg.start_soon(pops, http, k)
        for n in range(args.requests):
            body = {
                **tc.text_request(model_name(0, 0)),
                "models": [model_name(n % args.workers, j) for j in range(args.models)],
            }
            await tc.post_text(clients[n % POPPERS], requesters[n % len(requesters)], body)


async def read_heartbeats(http: tc.Http, until: anyio.Event, into: list[float]) -> None:
    """GET /status/heartbeat every HEARTBEAT_PERIOD (at once when late) until ``until``."""
    next_start = time.perf_counter()
    while not until.is_set():
        start = time.perf_counter()
        await tc.expect(200, http.call("GET", "/status/heartbeat"))
        into.append(time.perf_counter() - start)
        next_start = max(next_start + HEARTBEAT_PERIOD, time.perf_counter())
        await anyio.sleep(max(next_start - time.perf_counter(), 0.0))


@dataclasses.dataclass
class Polled:
    """What the pollers got: answers and bytes by path."""

    answers: dict[str, int] = dataclasses.field(default_factory=dict)
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)


async def poll(http: RawHttp, paths: list[str], until: anyio.Event, polled: Polled) -> None:
    while not until.is_set():
        for path in paths:
            status, body = await http.get(path)
            if status != 200:
                raise RuntimeError(f"GET {path} answered {status}")
            polled.answers[path] = polled.answers.get(path, 0) + 1
            polled.sizes[path] = len(body)


@dataclasses.dataclass
class Run:
    pollers: int
    baseline: list[float]
    during: list[float]
    polled: Polled
    seconds: float
    cpu: tc.CpuUse


async def measure(server: tc.Server, paths: list[str], args: argparse.Namespace) -> Run:
    async with tc.open_clients("lean", server.url, 1) as (prober,):
        baseline: list[float] = []
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_heartbeats, prober, done, baseline)
            await anyio.sleep(args.seconds)
            done.set()
        pollers = [RawHttp(server.url) for _ in range(args.pollers)]
        polled = Polled()
        during: list[float] = []
        cpu: list[tc.CpuUse] = []
        try:
            for http in pollers:  # connected (and each page read once) before the timing
                for path in paths:
                    await http.get(path)
            done = anyio.Event()
            with tc.cpu_use(server.pid, cpu):
                async with anyio.create_task_group() as tg:
                    for http in pollers:
                        tg.start_soon(poll, http, paths, done, polled)
                    tg.start_soon(read_heartbeats, prober, done, during)
                    await anyio.sleep(args.seconds)
                    done.set()
        finally:
            for http in pollers:
                await http.aclose()
    return Run(args.pollers, baseline, during, polled, args.seconds, cpu[0])


def run_tree(workdir: Path, name: str, source: Path | None, args: argparse.Namespace) -> Run:
    with tc.running_server(
        workdir, name, args.server_backend, extra=UNCAPPED, source=source
    ) as server:
        owner = tc.create_key(server, "bench-owner")
        requesters = [tc.create_key(server, f"bench-requester-{k}") for k in range(REQUESTERS)]
        start = time.perf_counter()
        anyio.run(fill, server, owner, requesters, args, backend=args.client_backend)
        print(
            f"{name}: {args.workers} workers x {args.models} models and {args.requests} requests "
            f"queued in {time.perf_counter() - start:.1f} s",
            flush=True,
        )
        old = source is not None and not _has_pool_route(source)
        paths = ["/", "/metrics", *(OLD_JSON_ROUTES if old else JSON_ROUTES)]
        return anyio.run(measure, server, paths, args, backend=args.client_backend)


def _has_pool_route(source: Path) -> bool:
    return "/dashboard/pool" in (source / "hordelite" / "api" / "dashboard.py").read_text()


def p99(values: list[float]) -> float:
    return tc.percentile(values, 99)


def report_run(report: tc.Report, name: str, run: Run, target: bool) -> None:
    base, during = run.baseline, run.during
    report.add(
        f"{name}: heartbeat p50 / p99 / max, no pollers",
        f"{tc.ms(statistics.median(base))} / {tc.ms(p99(base))} / {tc.ms(max(base))} ({len(base)} reads)",
    )
    report.add(
        f"{name}: heartbeat p50 / max, {run.pollers} pollers",
        f"{tc.ms(statistics.median(during))} / {tc.ms(max(during))} ({len(during)} reads)",
    )
    report.add(
        f"{name}: heartbeat p99 with the pollers (x no pollers)",
        f"{tc.ms(p99(during))} (x{p99(during) / p99(base):.1f})",
        f"< {tc.ms(TARGET_HEARTBEAT_P99)}" if target else "",
        p99(during) < TARGET_HEARTBEAT_P99 if target else None,
    )
    for path, size in run.polled.sizes.items():
        rate = run.polled.answers.get(path, 0) / run.seconds
        report.add(f"{name}: GET {path}: size, answers/s", f"{size / 1024:,.1f} KB, {rate:.1f}/s")
    report.cpu.append((f"{name}: pollers", run.cpu))
    report.figures[name] = {
        "heartbeat_idle_p50_ms": statistics.median(base) * 1000,
        "heartbeat_idle_p99_ms": p99(base) * 1000,
        "heartbeat_idle_max_ms": max(base) * 1000,
        "heartbeat_p50_ms": statistics.median(during) * 1000,
        "heartbeat_p99_ms": p99(during) * 1000,
        "heartbeat_max_ms": max(during) * 1000,
        "sizes": run.polled.sizes,
        "answers_per_second": {p: n / run.seconds for p, n in run.polled.answers.items()},
        "server_cores": run.cpu.server,
    }


def run_pages(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    runs: dict[str, Run] = {}
    if args.base is not None:
        runs["baseline tree"] = run_tree(workdir, "base", args.base.resolve(), args)
        report_run(report, "baseline tree", runs["baseline tree"], target=False)
    runs["this tree"] = run_tree(workdir, "pages", None, args)
    report_run(report, "this tree", runs["this tree"], target=True)
    if args.base is not None:
        before, after = runs["baseline tree"], runs["this tree"]
        report.add(
            "heartbeat p99 with the pollers, this tree / baseline tree",
            f"{p99(after.during) / p99(before.during):.3f}",
        )
        for path in ("/", "/metrics"):
            report.add(
                f"GET {path} size, this tree / baseline tree",
                f"{after.polled.sizes[path] / before.polled.sizes[path]:.4f}",
            )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--workers", type=int, default=400, help="workers in the pool")
    p.add_argument("--models", type=int, default=100, help="models each worker declares")
    p.add_argument("--requests", type=int, default=220, help="requests queued")
    p.add_argument("--pollers", type=int, default=4, help="clients polling the pages")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds of each measurement")
    p.add_argument("--base", type=Path, help="a baseline hordelite tree to run first")
    p.set_defaults(client="lean", phases="p")
    tc.add_common_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.base is not None and not (args.base / "hordelite" / "api").is_dir():
        parser().error(f"--base {args.base} is not a hordelite tree")
    return tc.run_phases(args, {"p": run_pages})


if __name__ == "__main__":
    sys.exit(main())
