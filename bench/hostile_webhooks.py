"""Webhook delivery under hostile receivers, black-box on ``hordelite serve``
(issue 35, finding 4).

Each run starts ``hordelite serve`` on a fresh SQLite file with
``[webhooks] call_private = true`` (the receivers are on loopback), fake
workers that pop and submit at once, and receivers of its own:

(a) ``fair``: a good receiver that answers 200 at once, and a hanging one
    that reads the call and never answers. An anonymous sender posts
    ``--hang-per-minute`` requests a minute with webhooks to the hanging
    receiver, while ``--good-users`` registered users post
    ``--good-per-second`` requests a second in all with webhooks to the good
    one (of them ``--hang-share`` to the hanging one), for ``--duration``
    seconds. Figure: the delay of each good webhook,
    from its request's end (the worker's submit answered) to its arrival,
    p50 and p99, in all and per 30 s of the run (a delay that grows without
    limit shows as a rising median). Target: p99 under 5 s.
(b) ``cpu``: ``--count`` requests with webhooks to the good receiver, and
    as many without, on servers of their own; figure: the server's CPU
    seconds from the first submit until every webhook arrived (or every
    request ended, without), what one call costs, and the p99 of a
    heartbeat probed every 50 ms meanwhile.

With ``--baseline DIR`` (another hordelite tree, e.g. ``git archive`` of
main) each figure is measured on both trees in the same run, and their ratio
printed.

    .venv/bin/python bench/hostile_webhooks.py                 # both, this tree
    .venv/bin/python bench/hostile_webhooks.py fair --baseline /tmp/main
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import text_cycle as tc  # bench/ is the script's folder, so on sys.path
from _common import process_cpu

ANONYMOUS = "0000000000"
WINDOW = 30.0


@dataclasses.dataclass
class Receiver:
    """A webhook receiver on 127.0.0.1: records when each call arrived, by
    the body's ``id`` (the generation's, which is the worker's job id);
    ``hang``: reads the call and never answers."""

    hang: bool
    arrived: dict[str, float] = dataclasses.field(default_factory=dict)
    headers: list[dict[str, str]] = dataclasses.field(default_factory=list)
    calls: int = 0
    url: str = ""

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            while True:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = await stream.receive()
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {
                    k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])
                }
                length = int(headers.get("content-length", "0"))
                while len(body) < length:
                    body += await stream.receive()
                self.calls += 1
                if self.hang:
                    await anyio.sleep_forever()
                self.headers.append(headers)
                key = json.loads(body).get("id") or json.loads(body)["request"]
                self.arrived.setdefault(str(key), time.perf_counter())
                await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")


@contextlib.asynccontextmanager
async def receiving(port: int, hang: bool) -> AsyncIterator[Receiver]:
    receiver = Receiver(hang)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
    receiver.url = f"http://127.0.0.1:{port}/hook"

    async def serve_one(stream: anyio.abc.SocketStream) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            await receiver.handle(stream)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve_one)
        try:
            yield receiver
        finally:
            tg.cancel_scope.cancel()


@dataclasses.dataclass
class Workers:
    """Fake workers that pop and submit at once; ``ended`` holds when each
    job's submit was answered (its request ended then)."""

    ended: dict[str, float] = dataclasses.field(default_factory=dict)

    async def run(self, client: httpx.AsyncClient, key: str, name: str) -> None:
        while True:
            try:
                await self.serve_one(client, key, name)
            except httpx.TransportError:
                continue  # a kept-alive connection the server closed meanwhile

    async def serve_one(self, client: httpx.AsyncClient, key: str, name: str) -> None:
        r = await client.post(
            "/api/v2/generate/text/pop", headers={"apikey": key}, json=tc.pop_body(name, 2)
        )
        job = r.json()
        if r.status_code != 200 or not job.get("id"):
            return
        r = await client.post(
            "/api/v2/generate/text/submit",
            headers={"apikey": key},
            json=tc.submit_body(job["id"]),
        )
        self.ended[job["id"]] = time.perf_counter()


async def submit(client: httpx.AsyncClient, key: str, webhook: str | None) -> None:
    body = tc.text_request(tc.MODEL)
    if webhook:
        body["webhook"] = webhook
    for _ in range(3):  # a kept-alive connection the server closed meanwhile: again
        try:
            r = await client.post("/api/v2/generate/text/async", headers={"apikey": key}, json=body)
            break
        except httpx.TransportError:
            continue
    else:
        print("  submit failed three times", file=sys.stderr)
        return
    if r.status_code != 202:
        print(f"  submit refused: {r.status_code} {r.text[:200]}", file=sys.stderr)


async def paced(period: float, until: float, send: Callable[[], Any]) -> None:
    """Call ``send`` (without waiting for it) every ``period`` seconds until ``until``."""
    async with anyio.create_task_group() as tg:
        at = time.perf_counter()
        while at < until:
            tg.start_soon(send)
            at += period
            await anyio.sleep(max(at - time.perf_counter(), 0))


def server_config(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    return {"webhooks": {"call_private": True}, "server": {"port": args.port}}


async def run_fair(server: tc.Server, args: argparse.Namespace) -> list[tuple[float, float]]:
    """(a): (submit offset, delay) of each good webhook that arrived."""
    worker_key = tc.create_key(server, "bench-worker")
    good_keys = [tc.create_key(server, f"bench-good-{i}") for i in range(args.good_users)]
    workers = Workers()
    sent = [0]
    limits = httpx.Limits(max_connections=200)
    async with (
        receiving(args.port + 5, hang=True) as hanging,
        receiving(args.port + 6, hang=False) as good,
        httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client,
        anyio.create_task_group() as tg,
    ):
        for i in range(args.workers):
            tg.start_soon(workers.run, client, worker_key, f"w{i}")
        start = time.perf_counter()
        until = start + args.duration
        turn = iter(range(10**9))

        every = round(1 / args.hang_share) if args.hang_share else 0

        async def good_one() -> None:
            n = next(turn)
            if every and n % every == every - 1:  # one of theirs that hangs
                await submit(client, good_keys[n % len(good_keys)], hanging.url)
                return
            sent[0] += 1
            await submit(client, good_keys[n % len(good_keys)], good.url)

        async def hanging_one() -> None:
            await submit(client, ANONYMOUS, hanging.url)

        async with anyio.create_task_group() as senders:
            if args.hang_per_minute:
                senders.start_soon(paced, 60 / args.hang_per_minute, until, hanging_one)
            senders.start_soon(paced, 1 / args.good_per_second, until, good_one)
        # The good webhooks still owed once the senders stop: waited for a while.
        with anyio.move_on_after(args.drain):
            while True:
                if len(good.arrived) >= sent[0]:
                    break
                await anyio.sleep(0.5)
        tg.cancel_scope.cancel()
    delays = [
        (workers.ended[job] - start, arrived - workers.ended[job])
        for job, arrived in good.arrived.items()
        if job in workers.ended
    ]
    print(
        f"  {server.name}: hanging receiver called {hanging.calls} times, "
        f"{len(delays)} good webhooks arrived of {sent[0]} sent"
    )
    if good.headers:
        shown = {k: v for k, v in good.headers[0].items() if k.startswith(("webhook", "x-"))}
        print(f"  headers a receiver sees: {shown}")
    return delays


def describe(delays: list[tuple[float, float]], duration: float) -> tuple[float, float]:
    values = sorted(d for _, d in delays)
    if not values:
        print("    no good webhook arrived")
        return float("inf"), float("inf")
    p50, p99 = tc.percentile(values, 50), tc.percentile(values, 99)
    print(f"    good webhook delay: p50 {p50:.2f} s, p99 {p99:.2f} s, max {values[-1]:.2f} s")
    windows = []
    for w in range(int(duration // WINDOW) + 1):
        inside = [d for t, d in delays if w * WINDOW <= t < (w + 1) * WINDOW]
        if inside:
            windows.append(f"{statistics.median(inside):.1f}")
    print(f"    median delay per {WINDOW:.0f} s of the run: {', '.join(windows)} s")
    return p50, p99


async def run_cpu(server: tc.Server, args: argparse.Namespace, webhooks: bool) -> float:
    """(b): the server's CPU seconds for ``--count`` requests (with webhooks or not)."""
    worker_key = tc.create_key(server, "bench-worker")
    # A user may have 30 requests in flight: 25 from each key.
    keys = [tc.create_key(server, f"bench-requester-{i}") for i in range(-(-args.count // 25))]
    workers = Workers()
    async with (
        receiving(args.port + 7, hang=False) as good,
        httpx.AsyncClient(base_url=server.url, timeout=60) as client,
        anyio.create_task_group() as tg,
    ):
        cpu = process_cpu(server.pid)
        beats: list[float] = []
        tg.start_soon(heartbeats, server.url, beats)
        for i in range(args.workers):
            tg.start_soon(workers.run, client, worker_key, f"w{i}")
        for start in range(0, args.count, 25):
            async with anyio.create_task_group() as batch:
                for _ in range(min(25, args.count - start)):
                    batch.start_soon(
                        submit, client, keys[start // 25], good.url if webhooks else None
                    )
        with anyio.move_on_after(120):
            while True:
                if (len(good.arrived) if webhooks else len(workers.ended)) >= args.count:
                    break
                await anyio.sleep(0.1)
        cpu = process_cpu(server.pid) - cpu
        tg.cancel_scope.cancel()
    done = len(good.arrived) if webhooks else len(workers.ended)
    beat = tc.percentile(sorted(beats), 99) * 1000 if beats else float("nan")
    print(
        f"  {server.name}: {done} of {args.count} {'webhooks' if webhooks else 'requests'}, "
        f"{cpu:.1f} s of server CPU, heartbeat p99 {beat:.0f} ms ({len(beats)} probes)"
    )
    return cpu


async def heartbeats(url: str, into: list[float]) -> None:
    """The time of a heartbeat every 50 ms, on a connection of its own: how
    long the server's loop keeps a cheap request waiting."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as probe:
        while True:
            start = time.perf_counter()
            with contextlib.suppress(httpx.TransportError):
                await probe.get("/api/v2/status/heartbeat")
                into.append(time.perf_counter() - start)
            await anyio.sleep(0.05)


def trees(args: argparse.Namespace) -> list[tuple[str, Path | None]]:
    return ([("baseline", args.baseline)] if args.baseline else []) + [("this tree", None)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", nargs="?", choices=("fair", "cpu", "both"), default="both")
    parser.add_argument("--baseline", type=Path, help="another hordelite tree to compare with")
    parser.add_argument("--port", type=int, default=7130, help="the server's; receivers +5..+7")
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--drain", type=float, default=60.0, help="wait for owed good webhooks")
    parser.add_argument("--hang-per-minute", type=float, default=10.0)
    parser.add_argument("--good-per-second", type=float, default=2.0)
    parser.add_argument("--good-users", type=int, default=4)
    parser.add_argument(
        "--hang-share", type=float, default=0.0, help="of the users' own webhooks, hanging"
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--count", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hostile-webhooks-") as tmp:
        workdir = Path(tmp)
        if args.phase in ("fair", "both"):
            print(
                f"(a) good webhooks ({args.good_per_second}/s from {args.good_users} users) "
                f"while an anonymous sender's {args.hang_per_minute}/min hang and "
                f"{args.hang_share:.0%} of the users' own, {args.duration} s"
            )
            p99s = {}
            for name, source in trees(args):
                tag = name.replace(" ", "-")
                with tc.running_server(
                    workdir, f"fair-{tag}", "trio", extra=server_config(args), source=source
                ) as server:
                    delays = anyio.run(run_fair, server, args)
                p99s[name] = describe(delays, args.duration)[1]
            if args.baseline:
                print(f"    p99 this tree / baseline: {p99s['this tree'] / p99s['baseline']:.3f}")
        if args.phase in ("cpu", "both"):
            print(f"(b) server CPU for {args.count} requests with instant webhooks, and without")
            for name, source in trees(args):
                tag = name.replace(" ", "-")
                cpu = {}
                for webhooks in (False, True):
                    with tc.running_server(
                        workdir,
                        f"cpu-{tag}-{int(webhooks)}",
                        "trio",
                        extra=server_config(args),
                        source=source,
                    ) as server:
                        cpu[webhooks] = anyio.run(run_cpu, server, args, webhooks)
                extra_ms = (cpu[True] - cpu[False]) / args.count * 1000
                print(
                    f"    {name}: {cpu[True]:.1f} s with webhooks, {cpu[False]:.1f} s without "
                    f"(x{cpu[True] / cpu[False]:.2f}); {extra_ms:.1f} ms of CPU per webhook"
                )


if __name__ == "__main__":
    main()
