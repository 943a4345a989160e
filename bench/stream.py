"""Streaming progress through the OpenAI front, against a real `hordelite serve`.

The pieces (servers as child processes, the lean HTTP client, CPU accounting,
the report, profiling) are bench/text_cycle.py's; the chat pop is
bench/chat_cycle.py's; the client that sends what the openai SDK sends, the
server environment and the file descriptor limit are bench/front.py's: all
imported. Each run gets its own ``hordelite serve`` on a fresh SQLite file.

A streamed call: POST /v1/chat/completions with ``"stream": true`` and a plain
body (no tools, no response_format), read as server-sent events by this
process. Its job is popped by a fake worker in this process (a chat pop,
``stream_progress: true`` in the payload), which posts
POST /api/v2/generate/text/progress with a short ``delta.content`` per post,
then submits the whole reply (the posted text plus a tail), so the front
reconciles and ends the stream; every stream's text is checked against the
reply.

Figures, each with its target (issue 5, "Performance"):

(a) Relay latency with pacing off (front.pace_progress = false): the time
    from a worker's progress post being sent to the bytes of its text
    arriving at the streaming client, both taken in this process (one
    clock): ``--latency-streams`` streams one after another, each posting
    ``--latency-posts`` times every ``--latency-interval`` s. A post counts
    as arrived when the client has received text up to its end (robust to
    the relay merging or splitting posts). Target: p50 < 5 ms. The round
    trip of the post itself (sent -> answered) is printed beside it: the
    floor an HTTP request costs here.
(b) ``--streams`` concurrent streamed calls, each job posting a short delta
    (``--delta-chars`` characters) every ``--post-every`` s, posts spread
    evenly over the second: the server's CPU over a ``--window`` s window
    while all of them post, from /proc/<pid>/stat (target < 0.5 cores), next
    to this process's CPU (the 500 streaming clients and the fake workers
    together) and everything else's. Run with pacing off and with pacing on
    (the default configuration), each on a server of its own
    (``--pacing``). The CPU figure is the server's at the offered load only
    if the posts kept pace: a second target checks that the posts sent in
    the window reached 95% of the offered rate (a starved server, or a busy
    machine, falls behind). Also printed: SSE events a second and per post,
    the server's CPU per post (x the offered rate: what the full load would
    take), and post -> arrival of the post's last byte under that load (with
    pacing on this includes the pacing, about one post interval by design).

The table of cores busy (server, this load generator, everything else) comes
with every measurement, as in text_cycle.py: read it first. The exit status
is 1 when a target is missed.

    .venv/bin/python bench/stream.py              # the default run, about 1.5-2 minutes
    .venv/bin/python bench/stream.py --phases b --streams 1000 --pacing off
    .venv/bin/python bench/stream.py --help

HORDELITE_BENCH_PROFILE=DIR profiles each server as text_cycle.py does.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import chat_cycle as cc  # bench/ is the script's folder, so on sys.path
import front as fr
import text_cycle as tc

MODEL = tc.MODEL
COMPLETIONS = "/v1/chat/completions"
PROGRESS = "/generate/text/progress"
SUBMIT = "/generate/text/submit"
# max_tokens of every streamed call: the progress cap is 16 bytes a token.
MAX_TOKENS = 512
# What the worker submits after its posts: the reply extends the relayed text.
TAIL = " [end]"
WORKER = "bench-stream-worker"

TARGET_LATENCY_MS = 5.0
TARGET_SERVER_CORES = 0.5
# (b) measures the server at the offered load only if the posts kept pace.
KEPT_UP = 0.95


def stream_request(tag: str) -> dict[str, Any]:
    """A plain streamed call (its job streams progress); ``tag`` ends its user message."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Stream a reply. {tag}"}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }


# The streaming client ----------------------------------------------------------


class StreamingCall(fr.SdkShapedHttp):
    """One streamed call on a connection of its own: the request as the openai
    SDK sends it, then the SSE body (chunked, as Hypercorn frames a streamed
    answer) read event by event, each with the time its bytes arrived.

    ``text`` is the content received so far and ``arrivals`` the times at
    which it grew, as (length after, time), so a waiter can tell when the
    text reached a given length.
    """

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.text = ""
        self.arrivals: list[tuple[int, float]] = []
        self.events = 0
        self.errors: list[Any] = []
        self.done = False
        self.grew = anyio.Event()
        self.ended = anyio.Event()  # set once the body is read to its end

    async def open(self, body: dict[str, Any], key: str) -> None:
        """Send the call and read the answer's head; raises unless it is 200 SSE."""
        await self.send("POST", COMPLETIONS, body, key)
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            await self._receive()
        lines = self._buffer[:end].decode("latin-1").lower().split("\r\n")
        self._buffer = self._buffer[end + 4 :]
        status = int(lines[0].split(" ", 2)[1])
        headers = dict(line.split(":", 1) for line in lines[1:])
        if status != 200 or headers.get("transfer-encoding", "").strip() != "chunked":
            length = int(headers.get("content-length", "0"))
            while len(self._buffer) < length:
                await self._receive()
            raise RuntimeError(f"the streamed call got HTTP {status}: {self._buffer[:300]!r}")

    async def read(self) -> None:
        """Read events until [DONE] (or the end of the body)."""
        try:
            await self._read()
        finally:
            self.ended.set()

    async def _read(self) -> None:
        async for arrived, data in self._events():
            if data == "[DONE]":
                self.done = True
                return
            event = json.loads(data)
            self.events += 1
            if "error" in event:
                self.errors.append(event["error"])
                continue
            for choice in event.get("choices") or ():
                content = choice["delta"].get("content")
                if content:
                    self.text += content
                    self.arrivals.append((len(self.text), arrived))
                    self.grew.set()
                    self.grew = anyio.Event()

    async def _events(self) -> AsyncIterator[tuple[float, str]]:
        """(arrival time, data) of each SSE event; comments are skipped."""
        pending = b""
        arrived = time.perf_counter()
        last = False  # the body's last (empty) chunk was read
        while True:
            while not last:  # decode every complete chunk in the buffer
                line_end = self._buffer.find(b"\r\n")
                if line_end < 0:
                    break
                size = int(self._buffer[:line_end].split(b";", 1)[0], 16)
                if len(self._buffer) < line_end + 2 + size + 2:
                    break
                start = line_end + 2
                pending += self._buffer[start : start + size]
                self._buffer = self._buffer[start + size + 2 :]
                last = size == 0
            while (sep := pending.find(b"\n\n")) >= 0:
                event, pending = pending[:sep], pending[sep + 2 :]
                for line in event.split(b"\n"):
                    if line.startswith(b"data: "):
                        yield arrived, line[6:].decode()
            if last:
                return
            await self._receive()
            arrived = time.perf_counter()

    def arrival_of(self, length: int) -> float | None:
        """When the received text first reached ``length`` characters."""
        for grown, at in self.arrivals:
            if grown >= length:
                return at
        return None


@dataclasses.dataclass
class Post:
    """One progress post: when it was sent and answered, and where its text ends."""

    sent: float
    answered: float
    end: int


class StreamingJob:
    """A popped streamed job and the worker's side of it: posts, then the submit."""

    def __init__(self, http: tc.LeanHttp, key: str, job: dict[str, Any]) -> None:
        self.http = http  # the connection that popped the job, as a worker keeps it
        self.key = key
        self.job = job
        self.posted = ""
        self.posts: list[Post] = []

    async def post(self, seq: int, content: str) -> None:
        body = {"id": self.job["id"], "seq": seq, "delta": {"content": content}}
        sent = time.perf_counter()
        answer = await tc.expect(200, self.http.call("POST", PROGRESS, body, self.key))
        answered = time.perf_counter()
        if answer != {"accepted_seq": seq, "cancelled": False}:
            raise RuntimeError(f"progress post {seq} answered {answer}")
        self.posted += content
        self.posts.append(Post(sent, answered, len(self.posted)))

    async def submit(self) -> None:
        body = {
            "id": self.job["id"],
            "model_id": self.job["model"],
            "state": "ok",
            "message": {"role": "assistant", "content": self.posted + TAIL},
            "finish_reason": "stop",
        }
        await tc.expect(200, self.http.call("POST", SUBMIT, body, self.key))


def delta(seq: int, chars: int) -> str:
    """A short piece of text, unique within its stream: ``chars`` characters."""
    word = f" w{seq}"
    return (word + "x" * chars)[:chars] if chars >= len(word) else word


async def pop_streamed(http: tc.Http, key: str, name: str) -> dict[str, Any]:
    """A chat pop (chat_cycle's declaration) that must hand out a streamed job."""
    for _ in range(100):
        job = await cc.chat_pop(http, key, name)
        if job["id"] is not None:
            if not job["payload"].get("stream_progress"):
                raise RuntimeError(f"a streamed call's job came without stream_progress: {job}")
            return job
        await anyio.sleep(0.02)
    raise RuntimeError("no streamed job could be popped")


def tag_of(job: dict[str, Any]) -> str:
    return cc.last_user_text(job).rsplit(". ", 1)[1]


def check_stream(call: StreamingCall, job: StreamingJob) -> None:
    if call.errors or not call.done:
        raise RuntimeError(f"a stream ended with {call.errors or 'no [DONE]'}")
    if call.text != job.posted + TAIL:
        raise RuntimeError(f"a stream relayed {call.text!r}, the reply was {job.posted + TAIL!r}")


# (a) relay latency, pacing off ----------------------------------------------------


@dataclasses.dataclass
class Latency:
    relay: list[float] = dataclasses.field(default_factory=list)  # post sent -> text arrived
    post: list[float] = dataclasses.field(default_factory=list)  # post sent -> answered


async def measure_latency(url: str, worker_key: str, key: str, args: argparse.Namespace) -> Latency:
    out = Latency()
    async with tc.lean_clients(tc.LeanHttp, url, 1) as (worker,):
        await cc.chat_pop(worker, worker_key, WORKER)  # check in
        for _ in range(args.latency_streams):
            call = StreamingCall(url)
            tag = f"latency {uuid.uuid4()}"
            try:
                await call.open(stream_request(tag), key)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call.read)
                    job = StreamingJob(
                        worker, worker_key, await pop_streamed(worker, worker_key, WORKER)
                    )
                    if tag_of(job.job) != tag:
                        raise RuntimeError("the popped job is another call's")
                    for seq in range(1, args.latency_posts + 1):
                        await job.post(seq, delta(seq, args.delta_chars))
                        await anyio.sleep(args.latency_interval)
                    # Every post's text has arrived by now (or it is lost).
                    with anyio.fail_after(5):
                        while len(call.text) < len(job.posted):
                            await call.grew.wait()
                    await job.submit()
            finally:
                await call.aclose()
            check_stream(call, job)
            for post in job.posts:
                arrived = call.arrival_of(post.end)
                assert arrived is not None
                out.relay.append(arrived - post.sent)
                out.post.append(post.answered - post.sent)
    return out


def run_latency_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    env = {"HORDELITE_FRONT_PACE_PROGRESS": "false"}
    with fr.server_env(env), tc.running_server(workdir, "latency", args.server_backend) as server:
        worker_key = tc.create_key(server, "bench-worker")
        key = tc.create_key(server, "bench-requester")
        cpu: list[tc.CpuUse] = []
        with tc.cpu_use(server.pid, cpu):
            out = anyio.run(
                measure_latency, server.url, worker_key, key, args, backend=args.client_backend
            )
    report.cpu.append(("(a) relay latency, pacing off", cpu[0]))
    p50 = statistics.median(out.relay)
    report.add(
        f"(a) post sent -> text at client, p50 ({len(out.relay)} posts)",
        tc.ms(p50),
        f"< {TARGET_LATENCY_MS:.0f} ms",
        p50 * 1000 < TARGET_LATENCY_MS,
    )
    report.add(
        "(a) post sent -> text at client, p95 / p99 / max",
        " / ".join(
            tc.ms(v)
            for v in (tc.percentile(out.relay, 95), tc.percentile(out.relay, 99), max(out.relay))
        ),
    )
    report.add(
        "(a) post sent -> post answered, p50 / p95",
        f"{tc.ms(statistics.median(out.post))} / {tc.ms(tc.percentile(out.post, 95))}",
    )
    report.figures["latency"] = {
        "posts": len(out.relay),
        "relay_p50_ms": p50 * 1000,
        "relay_p95_ms": tc.percentile(out.relay, 95) * 1000,
        "relay_p99_ms": tc.percentile(out.relay, 99) * 1000,
        "post_p50_ms": statistics.median(out.post) * 1000,
        "post_p95_ms": tc.percentile(out.post, 95) * 1000,
    }


# (b) many streams posting once a second --------------------------------------------


@dataclasses.dataclass
class Load:
    streams: int
    paced: bool
    open_seconds: float = 0.0
    pop_seconds: float = 0.0
    cpu: tc.CpuUse | None = None
    posts_in_window: int = 0
    events_in_window: int = 0
    relay: list[float] = dataclasses.field(default_factory=list)  # post sent -> last byte
    post: list[float] = dataclasses.field(default_factory=list)
    completed: int = 0
    drain_seconds: float = 0.0


async def measure_load(
    server: tc.Server, worker_key: str, key: str, args: argparse.Namespace, paced: bool
) -> Load:
    url = server.url
    load = Load(args.streams, paced)
    calls: dict[str, StreamingCall] = {}
    jobs: dict[str, StreamingJob] = {}
    slots = anyio.Semaphore(args.connect_concurrency)
    opened = anyio.Event()
    open_count = [0]
    failures: list[BaseException] = []

    async def stream(tag: str) -> None:
        call = calls[tag] = StreamingCall(url)
        try:
            async with slots:
                await call.open(stream_request(tag), key)
            open_count[0] += 1
            if open_count[0] == args.streams:
                opened.set()
            await call.read()
        except Exception as exc:
            failures.append(exc)
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await call.aclose()

    names = [f"bench-stream-worker-{i}" for i in range(args.workers)]
    window_start = window_end = 0.0

    async def work(job: StreamingJob, start: float, stop: float) -> None:
        """Post every ``post_every`` s from ``start`` (a spread offset) until ``stop``."""
        seq = 0
        when = start
        while when < stop:
            await anyio.sleep(max(when - time.perf_counter(), 0))
            seq += 1
            await job.post(seq, delta(seq, args.delta_chars))
            when += args.post_every

    async with contextlib.AsyncExitStack() as stack:
        checkin = await stack.enter_async_context(tc.lean_clients(tc.LeanHttp, url, 1))
        for name in names:
            await cc.chat_pop(checkin[0], worker_key, name)  # check in
        tg = await stack.enter_async_context(anyio.create_task_group())
        began = time.perf_counter()
        for _ in range(args.streams):
            tg.start_soon(stream, f"load {uuid.uuid4()}")
        with anyio.fail_after(args.open_timeout):
            await opened.wait()
        load.open_seconds = time.perf_counter() - began

        # Pop every job: poppers in parallel, worker names taken in turn.
        began = time.perf_counter()
        turn = [0]

        async def popper() -> None:
            # Each job keeps the connection that popped it for its posts (the
            # listen backlog is Hypercorn's 100: 500 connects within the
            # posting second would overflow it on a busy machine).
            http = tc.LeanHttp(url)
            stack.push_async_callback(http.aclose)
            while len(jobs) < args.streams:
                name = names[turn[0] % len(names)]
                turn[0] += 1
                job = await cc.chat_pop(http, worker_key, name)
                if job["id"] is None:
                    await anyio.sleep(0.01)
                    continue
                if not job["payload"].get("stream_progress"):
                    raise RuntimeError(f"a streamed call's job came without stream_progress: {job}")
                jobs[tag_of(job)] = StreamingJob(http, worker_key, job)
                http = tc.LeanHttp(url)
                stack.push_async_callback(http.aclose)

        with anyio.fail_after(args.open_timeout):
            async with anyio.create_task_group() as pops:
                for _ in range(args.pop_concurrency):
                    pops.start_soon(popper)
        load.pop_seconds = time.perf_counter() - began
        if set(jobs) != set(calls):
            raise RuntimeError("the popped jobs are not the open calls' jobs")

        # Every job posts from a random point of the first second on; the
        # window opens once all have posted once.
        first = time.perf_counter() + 0.5
        window_start = first + args.post_every
        window_end = window_start + args.window
        stop = window_end + 0.5 * args.post_every
        use: list[tc.CpuUse] = []
        async with anyio.create_task_group() as posting:
            for job in jobs.values():
                start = first + random.uniform(0, args.post_every)
                posting.start_soon(work, job, start, stop)
            await anyio.sleep(window_start - time.perf_counter())
            events_before = sum(c.events for c in calls.values())
            with tc.cpu_use(server.pid, use):
                await anyio.sleep(window_end - time.perf_counter())
            load.events_in_window = sum(c.events for c in calls.values()) - events_before
        load.cpu = use[0]

        # Submit every reply; every stream must end with exactly it.
        began = time.perf_counter()
        async with anyio.create_task_group() as submits:
            for job in jobs.values():
                submits.start_soon(job.submit)
        with anyio.move_on_after(args.drain_timeout):
            for call in calls.values():
                await call.ended.wait()
        load.drain_seconds = time.perf_counter() - began
        if failures:
            raise RuntimeError(f"{len(failures)} streams failed, the first: {failures[0]!r}")
        for tag, call in calls.items():
            check_stream(call, jobs[tag])
            load.completed += 1
            for post in jobs[tag].posts:
                if window_start <= post.sent < window_end:
                    load.posts_in_window += 1
                    arrived = call.arrival_of(post.end)
                    assert arrived is not None
                    load.relay.append(arrived - post.sent)
                    load.post.append(post.answered - post.sent)
        tg.cancel_scope.cancel()
    return load


def run_load_phase(workdir: Path, args: argparse.Namespace, report: tc.Report, paced: bool) -> None:
    client_limit = fr.raise_fd_limit(3 * args.streams + 200)
    env = {
        "HORDELITE_FRONT_PACE_PROGRESS": "true" if paced else "false",
        "HORDELITE_FRONT_MAX_OPEN_CALLS": args.streams + 100,
        "HORDELITE_FRONT_MAX_OPEN_PER_SOURCE": args.streams + 100,
        # One bench user stands for many users: no in-flight limit.
        "HORDELITE_HORDE_CONCURRENCY": 0,
    }
    label = "pacing on" if paced else "pacing off"
    name = f"load-{'paced' if paced else 'unpaced'}"
    with fr.server_env(env), tc.running_server(workdir, name, args.server_backend) as server:
        server_limit = fr.fd_limit_of(server.pid)
        worker_key = tc.create_key(server, "bench-worker")
        key = tc.create_key(server, "bench-requester")
        try:
            load = anyio.run(
                measure_load, server, worker_key, key, args, paced, backend=args.client_backend
            )
        except BaseException:
            fr.print_log_tail(workdir / f"{name}.log")
            raise
    assert load.cpu is not None
    n = load.streams
    report.cpu.append((f"(b) {n} streams, {label}", load.cpu))
    report.add(
        f"(b) {label}: {n} streams opened / jobs popped",
        f"in {load.open_seconds:.1f} s / {load.pop_seconds:.1f} s",
    )
    offered = n / args.post_every
    posted = load.posts_in_window / args.window
    events = load.events_in_window / args.window
    report.add(
        f"(b) {label}: posts sent in the window / offered",
        f"{posted:.0f} /s / {offered:.0f} /s",
        f">= {KEPT_UP:.0%}",
        posted >= KEPT_UP * offered,
    )
    report.add(
        f"(b) {label}: SSE events received",
        f"{events:.0f} /s ({events / max(posted, 1e-9):.1f} per post)",
    )
    report.add(
        f"(b) {label}: server CPU over {args.window:.0f} s",
        f"{load.cpu.server:.2f} cores (client {load.cpu.client:.2f}, others {load.cpu.others:.2f})",
        f"< {TARGET_SERVER_CORES} cores",
        load.cpu.server < TARGET_SERVER_CORES,
    )
    per_post = load.cpu.server * load.cpu.wall / max(load.posts_in_window, 1)
    report.add(
        f"(b) {label}: server CPU per post (post + relay)",
        f"{tc.ms(per_post)} (x offered rate: {per_post * offered:.2f} cores)",
    )
    report.add(
        f"(b) {label}: post sent -> its last byte at client, p50 / p95",
        f"{tc.ms(statistics.median(load.relay))} / {tc.ms(tc.percentile(load.relay, 95))}",
    )
    report.add(
        f"(b) {label}: post sent -> answered, p50 / p95",
        f"{tc.ms(statistics.median(load.post))} / {tc.ms(tc.percentile(load.post, 95))}",
    )
    report.add(
        f"(b) {label}: streams ended with the whole reply",
        f"{load.completed} of {n} (drained in {load.drain_seconds:.1f} s)",
        "all",
        load.completed == n,
    )
    report.add(f"(b) {label}: fd limits server / client", f"{server_limit} / {client_limit}")
    report.figures[f"load_{'paced' if paced else 'unpaced'}"] = {
        "streams": n,
        "server_cores": load.cpu.server,
        "client_cores": load.cpu.client,
        "other_cores": load.cpu.others,
        "posts_per_s": posted,
        "offered_posts_per_s": offered,
        "events_per_s": events,
        "server_cpu_ms_per_post": per_post * 1000,
        "relay_p50_ms": statistics.median(load.relay) * 1000,
        "relay_p95_ms": tc.percentile(load.relay, 95) * 1000,
        "post_p50_ms": statistics.median(load.post) * 1000,
        "completed": load.completed,
    }


# Command line ---------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--phases", default="ab", help="which phases to run: any of a, b (default ab)")
    p.add_argument(
        "--latency-streams", type=int, default=10, help="streams in (a), one at a time (default 10)"
    )
    p.add_argument(
        "--latency-posts",
        type=int,
        default=40,
        help="progress posts per stream in (a) (default 40)",
    )
    p.add_argument(
        "--latency-interval",
        type=float,
        default=0.025,
        help="seconds between a post's answer and the next post in (a) (default 0.025)",
    )
    p.add_argument(
        "--delta-chars", type=int, default=8, help="characters of text per post (default 8)"
    )
    p.add_argument(
        "--streams", type=int, default=500, help="concurrent streamed calls in (b) (default 500)"
    )
    p.add_argument(
        "--post-every",
        type=float,
        default=1.0,
        help="seconds between a job's posts in (b) (default 1)",
    )
    p.add_argument(
        "--window",
        type=float,
        default=15.0,
        help="seconds of (b) over which the CPU is measured (default 15)",
    )
    p.add_argument(
        "--pacing",
        choices=["off", "on", "both"],
        default="both",
        help="front.pace_progress of (b)'s server: off, on (the default configuration) or both, "
        "each on its own server (default both)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=50,
        help="worker names the jobs of (b) are popped under (default 50)",
    )
    p.add_argument(
        "--connect-concurrency",
        type=int,
        default=64,
        help="calls connecting and opening at once in (b) (default 64)",
    )
    p.add_argument(
        "--pop-concurrency", type=int, default=8, help="pops in flight at once in (b) (default 8)"
    )
    p.add_argument(
        "--open-timeout",
        type=float,
        default=120.0,
        help="seconds to open the calls, and to pop them",
    )
    p.add_argument(
        "--drain-timeout", type=float, default=60.0, help="seconds for every stream to end in (b)"
    )
    tc.add_common_arguments(p)
    p.set_defaults(client="lean")  # for tc.print_report
    return p


def main(argv: list[str] | None = None) -> int:
    def load(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
        for paced in {"off": (False,), "on": (True,), "both": (False, True)}[args.pacing]:
            run_load_phase(workdir, args, report, paced)

    return tc.run_phases(parser().parse_args(argv), {"a": run_latency_phase, "b": load})


if __name__ == "__main__":
    sys.exit(main())
