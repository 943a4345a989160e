"""Throughput of hordelite's chat cycle next to its text cycle, and the chat pop against a deep queue.

The pieces (servers as child processes, the lean HTTP client, CPU accounting,
the report, profiling) are bench/text_cycle.py's, imported; see its docstring
and bench/README.md. Each timed run gets its own ``hordelite serve`` on a
fresh SQLite file.

Figures, each with its target (issue 3, "Performance"):

(a) Completed cycles per second with ``--requesters`` clients and
    ``--workers`` workers for ``--duration`` seconds, text and chat runs
    alternated ``--rounds`` times (text, chat, text, chat, ...) so that a
    change in the machine's load falls on both. The text cycle is
    text_cycle.py's (a). The chat cycle: POST /generate/chat/async with a
    strict json_schema response_format (a small closed object) under
    conformance strict; workers long-poll POST /generate/text/pop declaring
    chat (json_schema, structured_output_enforced, prompt_overflow_refused)
    and submit a structured reply whose content is JSON matching the schema,
    with the job's model as model_id; the requester polls GET
    /generate/chat/status/{id} every ``--poll-interval`` until done.
    Target: chat cycles/s >= 0.70 x text cycles/s. Each kind also shows the
    server's CPU per cycle and per request, and the ratio of the CPU per
    cycle: the rate ratio of a saturated server core, steadier than the
    rates on a machine where other load comes and goes.
(b) p50 of a pop without wait by a chat-only worker (prompt_jobs false, so
    only the chat path is timed) with 100 and with 100,000 waiting chat
    requests for its model that need a feature it does not declare (tools).
    One request is submitted over HTTP (it creates its queue class); the rest
    are copies of its requests and queue rows written into the database.
    Each size has a server of its own, both running at once, and the pops
    take them in turn in blocks of ten, so that a change in the machine's
    load falls on both sizes. Target: p50 at 100,000 <= 2 x p50 at 100.

    .venv/bin/python bench/chat_cycle.py              # the default run, about 1.5 minutes
    .venv/bin/python bench/chat_cycle.py --help

HORDELITE_BENCH_PROFILE=DIR profiles each server as text_cycle.py does.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import text_cycle as tc  # bench/ is the script's folder, so on sys.path

from hordelite.config import load_config
from hordelite.contract.limits import SKIPPED_SAMPLE
from hordelite.storage.database import Database

MODEL = tc.MODEL
TARGET_CHAT_RATIO = 0.70
TARGET_POP_GROWTH = tc.TARGET_POP_GROWTH

# What the cycle's chat worker declares: exactly what its requests need.
CHAT_FEATURES = ["json_schema", "structured_output_enforced", "prompt_overflow_refused"]
CHAT_LIMITS = {"max_context_length": 4096, "max_length": 512}

# A strict schema (every object closed, every property required), as OpenAI's
# strict mode wants it; the worker's reply must match it.
SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"type": "string", "enum": ["red", "green", "blue"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "request": {"type": "string"},
    },
    "required": ["colour", "confidence", "request"],
    "additionalProperties": False,
}

# In (b): a tool the pop's worker does not declare, so no request is covered.
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather at a place.",
        "parameters": {
            "type": "object",
            "properties": {"place": {"type": "string"}},
            "required": ["place"],
        },
    },
}


def chat_request(tag: str) -> dict[str, Any]:
    """A strict chat request whose reply must match SCHEMA; ``tag`` ends its user message."""
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Answer with one JSON object."},
            {"role": "user", "content": f"Name a colour. {tag}"},
        ],
        "max_tokens": 32,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "colour", "strict": True, "schema": SCHEMA},
        },
        "horde": {"conformance": "strict"},
    }


def tools_request() -> dict[str, Any]:
    """A chat request that needs the tools capability (and prompt_overflow_refused)."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Lisbon?"}],
        "max_tokens": 32,
        "tools": [TOOL],
        "horde": {"conformance": "strict"},
    }


def chat_pop_body(name: str, wait: float = 0, prompt_jobs: bool = True) -> dict[str, Any]:
    body = {
        **tc.pop_body(name, wait),
        "chat_jobs": True,
        "chat_features": CHAT_FEATURES,
        "chat_limits": CHAT_LIMITS,
        "model_id": MODEL,
        "image_transports": [],
    }
    if not prompt_jobs:
        body["prompt_jobs"] = False
    return body


def last_user_text(job: dict[str, Any]) -> str:
    """The text of the job's last user message (a string or text parts)."""
    message = next(m for m in reversed(job["payload"]["messages"]) if m["role"] == "user")
    content = message["content"]
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if part.get("type") == "text")
    return str(content)


def chat_reply(job: dict[str, Any], tag: str) -> dict[str, Any]:
    """The structured submit of a chat job: JSON content matching SCHEMA."""
    content = json.dumps({"colour": "blue", "confidence": 0.9, "request": tag})
    return {
        "id": job["id"],
        "model_id": job["model"],
        "state": "ok",
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
        "prompt_tokens": 24,
        "completion_tokens": 12,
    }


async def post_chat(http: tc.Http, key: str, body: dict[str, Any]) -> str:
    answer = await tc.expect(202, http.call("POST", "/generate/chat/async", body, key))
    return str(answer["id"])


async def chat_pop(
    http: tc.Http, key: str, name: str, wait: float = 0, prompt_jobs: bool = True
) -> dict[str, Any]:
    body = chat_pop_body(name, wait, prompt_jobs)
    answer: dict[str, Any] = await tc.expect(
        200, http.call("POST", "/generate/text/pop", body, key)
    )
    return answer


# (a) the chat cycle -----------------------------------------------------------


async def measure_chat_cycle(
    url: str, worker_key: str, requester_keys: list[str], args: argparse.Namespace
) -> tc.Window:
    """text_cycle.measure_cycle's loop with chat requests, chat pops and structured submits."""
    window = tc.Window(args.duration)

    async def requester(http: tc.Http, key: str) -> None:
        while True:
            # A tag of its own lets the worker tell when this request was sent.
            tag = f"bench request {uuid.uuid4()}"
            sent = window.sent[tag] = time.perf_counter()
            path = f"/generate/chat/status/{await post_chat(http, key, chat_request(tag))}"
            window.count("async")
            while True:
                await anyio.sleep(args.poll_interval)
                status = await tc.expect(200, http.call("GET", path))
                if not window.count("status"):
                    return
                if status["faulted"]:
                    raise RuntimeError(f"a chat request faulted: {status}")
                if status["done"]:
                    window.latencies.append(time.perf_counter() - sent)
                    break

    async def worker(http: tc.Http, name: str) -> None:
        while True:
            job = await chat_pop(http, worker_key, name, args.pop_wait)
            window.count("pop")
            if job["id"] is None:
                continue
            if not job.get("chat"):
                raise RuntimeError(f"a chat worker got a job that is not chat: {job}")
            tag = last_user_text(job).rsplit(". ", 1)[1]
            body = chat_reply(job, tag)
            await tc.expect(200, http.call("POST", "/generate/text/submit", body, worker_key))
            if window.count("submit"):
                window.done.append(time.perf_counter() - window.sent.pop(tag))

    async with tc.open_clients(args.client, url, args.requesters + args.workers) as clients:
        workers, requesters = clients[: args.workers], clients[args.workers :]
        names = [f"bench-chat-worker-{i}" for i in range(args.workers)]
        for http, name in zip(workers, names, strict=True):
            # Check in first: a chat request for a model without a chat worker is refused.
            await chat_pop(http, worker_key, name)
        tasks: list[tc.Task] = [
            functools.partial(worker, http, name) for http, name in zip(workers, names, strict=True)
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
    """One timed run of the ``kind`` ("text" or "chat") cycle on a server of its own."""
    with tc.running_server(workdir, f"cycle-{kind}-{round_}", args.server_backend) as server:
        worker_key = tc.create_key(server, "bench-workers")
        requester_keys = [
            tc.create_key(server, f"bench-requester-{i}") for i in range(args.requesters)
        ]
        measure = tc.measure_cycle if kind == "text" else measure_chat_cycle
        cpu: list[tc.CpuUse] = []
        with tc.cpu_use(server.pid, cpu):
            window = anyio.run(
                measure, server.url, worker_key, requester_keys, args, backend=args.client_backend
            )
    if not window.latencies:
        raise RuntimeError(f"no {kind} request completed its cycle")
    return window, cpu[0]


def run_cycle_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    windows: dict[str, list[tc.Window]] = {"text": [], "chat": []}
    # Server CPU seconds per kind: the cost of a cycle, less swayed by other load than its rate.
    server_cpu = {"text": 0.0, "chat": 0.0}
    for round_ in range(1, args.rounds + 1):
        for kind in ("text", "chat"):
            window, use = run_cycle(workdir, args, kind, round_)
            windows[kind].append(window)
            server_cpu[kind] += use.server * use.wall
            report.cpu.append((f"(a) {kind} cycle, round {round_}", use))
    rates: dict[str, float] = {}
    cycles_of: dict[str, int] = {}
    for kind, runs in windows.items():
        cycles = cycles_of[kind] = sum(len(w.latencies) for w in runs)
        seconds = sum(w.duration for w in runs)
        requests: dict[str, int] = {}
        for w in runs:
            for name, count in w.requests.items():
                requests[name] = requests.get(name, 0) + count
        total = sum(requests.values())
        rate = rates[kind] = cycles / seconds
        done = [d for w in runs for d in w.done]
        seen = [s for w in runs for s in w.latencies]
        per_round = ", ".join(f"{len(w.latencies) / w.duration:.1f}" for w in runs)
        report.add(f"(a) {kind} cycles completed", f"{rate:.1f} /s (rounds: {per_round})")
        kinds = ", ".join(
            f"{name} {requests.get(name, 0) / cycles:.2f}"
            for name in ("async", "pop", "submit", "status")
        )
        report.add(f"(a) {kind} HTTP requests per cycle", f"{total / cycles:.2f} ({kinds})")
        report.add(f"(a) {kind} cycle HTTP rate", f"{total / seconds:.0f} req/s")
        cpu_cycle, cpu_request = server_cpu[kind] / cycles, server_cpu[kind] / total
        report.add(
            f"(a) {kind} server CPU per cycle / per request",
            f"{tc.ms(cpu_cycle)} / {tc.ms(cpu_request)}",
        )
        p50, p95 = tc.percentile(done, 50), tc.percentile(done, 95)
        report.add(f"(a) {kind} submit-to-done p50 / p95", f"{tc.ms(p50)} / {tc.ms(p95)}")
        report.add(
            f"(a) {kind} submit-to-seen-done p50 / p95",
            f"{tc.ms(tc.percentile(seen, 50))} / {tc.ms(tc.percentile(seen, 95))}",
        )
        report.figures[f"{kind}_cycle"] = {
            "cycles_per_s": rate,
            "cycles_per_s_by_round": [len(w.latencies) / w.duration for w in runs],
            "http_rps": total / seconds,
            "requests_per_cycle": total / cycles,
            "requests_by_kind": requests,
            "server_cpu_ms_per_cycle": cpu_cycle * 1000,
            "server_cpu_ms_per_request": cpu_request * 1000,
            "latency_p50_ms": p50 * 1000,
            "latency_p95_ms": p95 * 1000,
        }
    # What the rate ratio would be on a saturated server core with the same
    # requests per cycle: steadier than the rates when other load comes and goes.
    cpu_ratio = (server_cpu["text"] / cycles_of["text"]) / (server_cpu["chat"] / cycles_of["chat"])
    report.add("(a) ratio text / chat server CPU per cycle", f"{cpu_ratio:.2f}")
    report.figures["text_chat_cpu_per_cycle_ratio"] = cpu_ratio
    ratio = rates["chat"] / rates["text"]
    report.add(
        "(a) ratio chat / text cycles per second",
        f"{ratio:.2f}",
        f">= {TARGET_CHAT_RATIO:.2f}",
        ratio >= TARGET_CHAT_RATIO,
    )
    report.figures["chat_text_ratio"] = ratio


# (b) chat pops against a deep queue it cannot serve ----------------------------

# Timed pops on one server before the next server's turn in (b).
POP_BLOCK = 10


class ChatQueueCopier:
    """Copies of one waiting chat request, written into the server's database.

    The template goes through the real submit (POST /generate/chat/async), which
    also stores its (model, kind, features) row in queue_classes; its copies
    share that class, so their requests and queue rows are all they need
    (text_cycle._copy_request, with a later creation time and priority each).
    """

    def __init__(self, config: Path) -> None:
        self.db = Database(load_config(config).storage.database, 1)
        self.template = ""
        self.size = 0

    def fill_to(self, size: int, batch: int = 10_000) -> None:
        while self.size < size:
            count = min(batch, size - self.size)
            self.db.run_sync(tc._copy_request, True, self.template, count, self.size)
            self.size += count

    def close(self) -> None:
        self.db.dispose()


@dataclasses.dataclass
class PopTarget:
    """One queue size of (b): its server, keys, copier and what was measured."""

    size: int
    server: tc.Server
    worker_key: str
    requester_key: str
    copier: ChatQueueCopier
    latencies: list[float] = dataclasses.field(default_factory=list)
    cpu: list[tc.CpuUse] = dataclasses.field(default_factory=list)


async def measure_chat_pops(targets: list[PopTarget], args: argparse.Namespace) -> None:
    """Fill each target's queue, then time pops in blocks of POP_BLOCK, taking
    the servers in turn, so that other load on the machine falls on every size.

    Each size gets ``args.pops`` pops, or fewer (at least MIN_POPS) once
    ``args.pop_budget`` seconds per size have passed.
    """
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for target in targets:
            (http,) = await stack.enter_async_context(
                tc.open_clients(args.client, target.server.url, 1)
            )
            clients.append(http)
            await chat_pop(http, target.worker_key, "bench-popper", prompt_jobs=False)  # check in
            body = tools_request()
            target.copier.template = await post_chat(http, target.requester_key, body)
            target.copier.size = 1
            await anyio.to_thread.run_sync(target.copier.fill_to, target.size)
        budget_end = time.perf_counter() + args.pop_budget * len(targets)

        def more(target: PopTarget) -> bool:
            timed = len(target.latencies)
            return timed < args.pops and (timed < tc.MIN_POPS or time.perf_counter() < budget_end)

        while any(more(t) for t in targets):
            for target, http in zip(targets, clients, strict=True):
                with tc.cpu_use(target.server.pid, target.cpu):
                    for _ in range(POP_BLOCK):
                        if not more(target):
                            break
                        start = time.perf_counter()
                        job = await chat_pop(
                            http, target.worker_key, "bench-popper", prompt_jobs=False
                        )
                        target.latencies.append(time.perf_counter() - start)
                        # The pop saw the queue: its sample of the best waiting
                        # requests was all passed over for the undeclared feature.
                        seen = job["skipped"].get("chat_features", 0)
                        if job["id"] is not None or seen != min(target.size, SKIPPED_SAMPLE):
                            raise RuntimeError(
                                f"a pop with {target.size} waiting requests answered {job}"
                            )


def total_cpu(uses: list[tc.CpuUse]) -> tc.CpuUse:
    """Several measurements as one: cores busy on average over their summed wall time."""
    wall = sum(u.wall for u in uses)
    return tc.CpuUse(
        wall,
        sum(u.server * u.wall for u in uses) / wall,
        sum(u.client * u.wall for u in uses) / wall,
        sum(u.others * u.wall for u in uses) / wall,
    )


def run_pop_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    targets: list[PopTarget] = []
    with contextlib.ExitStack() as stack:
        for size in args.queue_sizes:
            server = stack.enter_context(
                tc.running_server(workdir, f"pop-chat-{size}", args.server_backend)
            )
            copier = ChatQueueCopier(server.config)
            stack.callback(copier.close)
            worker_key = tc.create_key(server, "bench-worker")
            requester_key = tc.create_key(server, "bench-requester")
            targets.append(PopTarget(size, server, worker_key, requester_key, copier))
        anyio.run(measure_chat_pops, targets, args, backend=args.client_backend)
    label = "need tools"
    medians: dict[int, float] = {}
    for target in targets:
        use = total_cpu(target.cpu)
        report.cpu.append((f"(b) chat pops, {target.size:,} {label}", use))
        pops = len(target.latencies)
        median = medians[target.size] = statistics.median(target.latencies)
        p95 = tc.percentile(target.latencies, 95)
        report.add(
            f"(b) chat pop p50 (p95), {target.size:,} waiting {label}",
            f"{tc.ms(median)} ({tc.ms(p95)}, {pops} pops)",
        )
        report.add(
            f"(b) server CPU per pop, {target.size:,} waiting",
            tc.ms(use.server * use.wall / pops),
        )
    small, large = min(medians), max(medians)
    growth = medians[large] / medians[small]
    report.add(
        f"(b) chat pop p50 growth {small:,} -> {large:,}",
        f"x {growth:.2f}",
        f"<= x {TARGET_POP_GROWTH:.1f}",
        growth <= TARGET_POP_GROWTH,
    )
    report.figures["chat_pop_p50_ms"] = {str(s): m * 1000 for s, m in medians.items()}
    report.figures["chat_pop_growth"] = growth


# Command line -----------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--phases", default="ab", help="which phases to run: any of a, b (default ab)")
    p.add_argument(
        "--duration",
        type=float,
        default=8.0,
        help="seconds of each timed cycle run in (a) (default 8)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="text and chat runs in (a), alternated, each on a fresh server (default 3)",
    )
    p.add_argument(
        "--requesters", type=int, default=16, help="concurrent requesters in (a) (default 16)"
    )
    p.add_argument("--workers", type=int, default=4, help="concurrent workers in (a) (default 4)")
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.05,
        help="seconds a requester waits before each status poll in (a) (default 0.05)",
    )
    p.add_argument(
        "--pop-wait", type=float, default=5.0, help='the workers\' pop "wait" in (a) (default 5)'
    )
    p.add_argument(
        "--queue-sizes",
        type=tc._sizes,
        default=[100, 100_000],
        help="waiting chat requests in (b), smallest first (default 100,100000)",
    )
    p.add_argument(
        "--pops", type=int, default=200, help="timed pops per queue size in (b) (default 200)"
    )
    p.add_argument(
        "--pop-budget",
        type=float,
        default=10.0,
        help=f"seconds of timed pops per queue size in (b), at least {tc.MIN_POPS} pops (default 10)",
    )
    p.add_argument(
        "--client",
        choices=["lean", "httpx"],
        default="lean",
        help="HTTP client: lean (the bench's minimal keep-alive client, the default) or httpx",
    )
    tc.add_common_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return tc.run_phases(parser().parse_args(argv), {"a": run_cycle_phase, "b": run_pop_phase})


if __name__ == "__main__":
    sys.exit(main())
