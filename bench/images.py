"""What images cost: normalising one part, a burst of image submits, and a pop that hands images out.

(a) ``hordelite.contract.image_normalise.normalise`` runs once per image part at
    submit, in a worker thread. This generates one photo-like 4-megapixel
    image (2309x1732, 4:3: gradients with noise, so neither encoder gets a
    flat picture for free), encodes it as JPEG (quality 90) and as PNG, and
    times ``normalise`` on each: decode, EXIF orientation, RGB, the long side
    bounded to 2048 px with LANCZOS, JPEG encode. Prints the p50 and the
    fastest run in milliseconds over ``--runs`` (10) after one untimed run,
    and the JPEG/PNG ratio of the p50s from the same run. A few seconds.

The next two run against a real ``hordelite serve`` child on a fresh SQLite
file (text_cycle.py's server, lean client and CPU table), with a chat worker
declaring ``vision`` and the ``url`` transport checked in first (one pop).

(b) The server stays responsive while it takes images in: ``--burst`` (20)
    chat requests, each carrying (a)'s PNG as a data URL (built and encoded
    as JSON once, sent as bytes), are sent at once on connections of their
    own (POST /api/v2/generate/chat/async), while another connection reads
    GET /api/v2/status/heartbeat every ~10 ms. Heartbeat p50/p99/max from
    sending to answer during the burst, next to the p99 of the same reads
    over ``--baseline`` (2) seconds on the idle server just before.
    Target: p99 during the burst < 50 ms.
(c) What images add to a pop by a ``url`` worker (a signed URL per image,
    built after the pop's transaction): chat requests with one small image
    (256x256 JPEG data URL) and without, submitted untimed in blocks of
    POP_BLOCK, each block then taken by timed pops without wait (one job
    each, the jobs submitted untimed after the block), the two kinds alternated until each has
    ``--pops`` (200) timed pops, so other load on the machine falls on both.
    Each image job is checked to carry a signed URL, each other none.
    Target: p50 with images / p50 without <= 1.2.

    .venv/bin/python bench/images.py                 # all three, under a minute
    .venv/bin/python bench/images.py --phases bc --pops 100

The exit status is 1 when a target of (b) or (c) is missed.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import chat_cycle as cc  # bench/ is the script's folder, so on sys.path
import PIL
import text_cycle as tc
from PIL import Image

from hordelite.contract.image_normalise import normalise

WIDTH, HEIGHT = 2309, 1732  # 4.0 megapixels
SMALL = 256  # side of (c)'s image

TARGET_HEARTBEAT_P99 = 0.050  # (b), seconds
TARGET_POP_RATIO = 1.2  # (c)
HEARTBEAT_PERIOD = 0.010  # (b): one read started every 10 ms (or at once when late)
POP_BLOCK = 20  # (c): requests of one kind queued, then popped, before the other kind

# The chat worker of (b) and (c): it can see images and takes them by URL.
VISION_FEATURES = [*cc.CHAT_FEATURES, "vision"]


def photo_like() -> Image.Image:
    red = Image.linear_gradient("L").resize((WIDTH, HEIGHT))
    green = Image.effect_noise((WIDTH, HEIGHT), 48)
    blue = Image.radial_gradient("L").resize((WIDTH, HEIGHT))
    return Image.merge("RGB", (red, green, blue))


def encoded(img: Image.Image, fmt: str, **params: object) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **params)
    return out.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


# (a) normalise one part ----------------------------------------------------------


def time_ms(data: bytes, runs: int) -> list[float]:
    normalise(data)  # untimed: plugin imports, first allocations
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        normalise(data)
        times.append((time.perf_counter() - start) * 1000)
    return times


def run_normalise_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    img = photo_like()
    inputs = {
        "JPEG q90": encoded(img, "JPEG", quality=90),
        "PNG": encoded(img, "PNG"),
    }
    print(
        f"(a) Pillow {PIL.__version__}, Python {platform.python_version()}, "
        f"{WIDTH}x{HEIGHT} ({WIDTH * HEIGHT / 1e6:.1f} MP), {args.runs} runs each"
    )
    print(f"{'input':<10} {'bytes':>10} {'p50 ms':>8} {'min ms':>8} {'output bytes':>13}")
    p50 = {}
    for name, data in inputs.items():
        times = time_ms(data, args.runs)
        p50[name] = statistics.median(times)
        out = len(normalise(data).jpeg)
        print(f"{name:<10} {len(data):>10,} {p50[name]:>8.1f} {min(times):>8.1f} {out:>13,}")
    print(f"ratio JPEG/PNG (p50): {p50['JPEG q90'] / p50['PNG']:.2f}")
    report.figures["normalise_p50_ms"] = p50


# The server's side: a vision worker, image requests ----------------------------


class PreEncodedHttp(tc.LeanHttp):
    """The lean client with a POST of a body already encoded, so that sending
    one 10 MB JSON body costs this process no json.dumps."""

    async def post_encoded(self, path: str, payload: bytes, apikey: str) -> tuple[int, Any]:
        stream = await self._connection()
        head = (
            f"POST /api/v2{path} HTTP/1.1\r\nhost: {self._host}\r\n"
            f"apikey: {apikey}\r\nclient-agent: {tc.CLIENT_AGENT}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
        )
        await stream.send(head.encode())
        await stream.send(payload)
        status, answer = await self._read_answer()
        self._last_used = time.monotonic()
        return status, json.loads(answer)


def vision_pop_body(name: str) -> dict[str, Any]:
    return {
        **cc.chat_pop_body(name),
        "chat_features": VISION_FEATURES,
        "image_transports": ["url"],
    }


async def vision_pop(http: tc.Http, key: str, name: str) -> dict[str, Any]:
    answer: dict[str, Any] = await tc.expect(
        200, http.call("POST", "/generate/text/pop", vision_pop_body(name), key)
    )
    return answer


def image_request(tag: str, image: str | None) -> dict[str, Any]:
    """A chat request whose user message is ``tag``, with the image data URL when given."""
    content: list[dict[str, Any]] = [{"type": "text", "text": tag}]
    if image is not None:
        content.append({"type": "image_url", "image_url": {"url": image}})
    return {"model": tc.MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 32}


def image_urls(job: dict[str, Any]) -> list[str]:
    return [
        part["image_url"]["url"]
        for message in job["payload"]["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part.get("type") == "image_url"
    ]


# (b) heartbeat during a burst of image submits -----------------------------------


async def read_heartbeats(http: tc.Http, until: anyio.Event, into: list[float]) -> None:
    """GET /status/heartbeat every HEARTBEAT_PERIOD (at once when late) until ``until``."""
    next_start = time.perf_counter()
    while not until.is_set():
        start = time.perf_counter()
        await tc.expect(200, http.call("GET", "/status/heartbeat"))
        into.append(time.perf_counter() - start)
        next_start = max(next_start + HEARTBEAT_PERIOD, time.perf_counter())
        await anyio.sleep(max(next_start - time.perf_counter(), 0.0))


async def measure_burst(
    server: tc.Server, worker_key: str, keys: list[str], payload: bytes, args: argparse.Namespace
) -> dict[str, Any]:
    url = server.url
    async with tc.open_clients("lean", url, 2) as (worker, prober):
        await vision_pop(worker, worker_key, "bench-vision-worker")  # check in
        baseline: list[float] = []
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_heartbeats, prober, done, baseline)
            await anyio.sleep(args.baseline)
            done.set()
        senders = [PreEncodedHttp(url) for _ in keys]
        during: list[float] = []
        submits: list[float] = []
        cpu: list[tc.CpuUse] = []
        try:
            for sender in senders:  # connected before the burst, as the prober is
                await sender.call("GET", "/status/heartbeat")

            async def submit(sender: PreEncodedHttp, key: str) -> None:
                start = time.perf_counter()
                status, answer = await sender.post_encoded("/generate/chat/async", payload, key)
                if status != 202:
                    raise RuntimeError(f"an image request was answered {status}: {answer}")
                submits.append(time.perf_counter() - start)

            done = anyio.Event()
            with tc.cpu_use(server.pid, cpu):
                async with anyio.create_task_group() as probing:
                    probing.start_soon(read_heartbeats, prober, done, during)
                    start = time.perf_counter()
                    async with anyio.create_task_group() as burst:
                        for sender, key in zip(senders, keys, strict=True):
                            burst.start_soon(submit, sender, key)
                    wall = time.perf_counter() - start
                    done.set()
        finally:
            for sender in senders:
                await sender.aclose()
    return {"baseline": baseline, "during": during, "submits": submits, "wall": wall, "cpu": cpu[0]}


def run_burst_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    png = encoded(photo_like(), "PNG")
    payload = json.dumps(image_request("Describe this picture.", data_url(png, "image/png")))
    body = payload.encode()
    with tc.running_server(workdir, "image-burst", args.server_backend) as server:
        worker_key = tc.create_key(server, "bench-vision-worker")
        keys = [tc.create_key(server, f"bench-requester-{i}") for i in range(args.burst)]
        got = anyio.run(
            measure_burst, server, worker_key, keys, body, args, backend=args.client_backend
        )
    baseline, during = got["baseline"], got["during"]
    report.cpu.append((f"(b) {args.burst} image submits at once", got["cpu"]))
    report.add(
        "(b) image request body",
        f"{len(body) / 1e6:.1f} MB ({len(png) / 1e6:.1f} MB PNG, {WIDTH}x{HEIGHT})",
    )
    report.add(
        f"(b) {args.burst} image submits: all answered / p50 each",
        f"{tc.ms(got['wall'])} / {tc.ms(statistics.median(got['submits']))}",
    )
    report.add(
        "(b) heartbeat p99 on the idle server",
        f"{tc.ms(tc.percentile(baseline, 99))} ({len(baseline)} reads)",
    )
    p99 = tc.percentile(during, 99)
    report.add(
        "(b) heartbeat p50 / max during the burst",
        f"{tc.ms(statistics.median(during))} / {tc.ms(max(during))} ({len(during)} reads)",
    )
    report.add(
        "(b) heartbeat p99 during the burst",
        tc.ms(p99),
        f"< {tc.ms(TARGET_HEARTBEAT_P99)}",
        p99 < TARGET_HEARTBEAT_P99,
    )
    report.figures["burst"] = {
        "body_bytes": len(body),
        "submits_wall_ms": got["wall"] * 1000,
        "heartbeat_idle_p99_ms": tc.percentile(baseline, 99) * 1000,
        "heartbeat_p50_ms": statistics.median(during) * 1000,
        "heartbeat_p99_ms": p99 * 1000,
        "heartbeat_max_ms": max(during) * 1000,
    }


# (c) pops with and without images -----------------------------------------------


async def measure_pops(
    server: tc.Server, worker_key: str, requester_key: str, image: str, args: argparse.Namespace
) -> tuple[dict[str, list[float]], list[tc.CpuUse]]:
    timed: dict[str, list[float]] = {"with": [], "without": []}
    cpu: list[tc.CpuUse] = []  # the timed pops' blocks
    async with tc.open_clients("lean", server.url, 1) as (worker,):
        await vision_pop(worker, worker_key, "bench-vision-worker")  # check in
        # Encoded once: the submits are untimed, but this process shares the machine.
        bodies = {
            "with": json.dumps(image_request("Describe this picture.", image)).encode(),
            "without": json.dumps(image_request("Name a colour.", None)).encode(),
        }
        sender = PreEncodedHttp(server.url)
        try:
            while any(len(times) < args.pops for times in timed.values()):
                for kind, times in timed.items():
                    block = min(POP_BLOCK, args.pops - len(times))
                    for _ in range(block):
                        status, answer = await sender.post_encoded(
                            "/generate/chat/async", bodies[kind], requester_key
                        )
                        if status != 202:
                            raise RuntimeError(f"a request was answered {status}: {answer}")
                    jobs = []
                    with tc.cpu_use(server.pid, cpu):
                        for _ in range(block):
                            start = time.perf_counter()
                            job = await vision_pop(worker, worker_key, "bench-vision-worker")
                            times.append(time.perf_counter() - start)
                            urls = [] if job["id"] is None else image_urls(job)
                            if (
                                job["id"] is None
                                or len(urls) != (kind == "with")
                                or any(url.startswith("data:") for url in urls)
                            ):
                                raise RuntimeError(f"a pop for a request {kind} images got {job}")
                            jobs.append(job)
                    # Done, untimed: a requester may have only so many requests in flight.
                    for job in jobs:
                        reply = cc.chat_reply(job, "bench")
                        path = "/generate/text/submit"
                        await tc.expect(200, worker.call("POST", path, reply, worker_key))
        finally:
            await sender.aclose()
    return timed, cpu


def run_pop_phase(workdir: Path, args: argparse.Namespace, report: tc.Report) -> None:
    small = encoded(photo_like().resize((SMALL, SMALL)), "JPEG", quality=90)
    image = data_url(small, "image/jpeg")
    with tc.running_server(workdir, "image-pops", args.server_backend) as server:
        worker_key = tc.create_key(server, "bench-vision-worker")
        requester_key = tc.create_key(server, "bench-requester")
        timed, cpu = anyio.run(
            measure_pops,
            server,
            worker_key,
            requester_key,
            image,
            args,
            backend=args.client_backend,
        )
    report.cpu.append(("(c) url-worker pops, both kinds", cc.total_cpu(cpu)))
    p50 = {kind: statistics.median(times) for kind, times in timed.items()}
    for kind, times in timed.items():
        report.add(
            f"(c) url-worker pop p50 (p95), requests {kind} an image",
            f"{tc.ms(p50[kind])} ({tc.ms(tc.percentile(times, 95))}, {len(times)} pops)",
        )
    ratio = p50["with"] / p50["without"]
    report.add(
        "(c) pop p50 with / without an image",
        f"{ratio:.2f}",
        f"<= {TARGET_POP_RATIO:.1f}",
        ratio <= TARGET_POP_RATIO,
    )
    report.figures["pop_p50_ms"] = {kind: m * 1000 for kind, m in p50.items()}
    report.figures["pop_ratio"] = ratio


# Command line -------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--phases", default="abc", help="which phases to run: any of a, b, c")
    p.add_argument("--runs", type=int, default=10, help="timed normalise runs per input in (a)")
    p.add_argument("--burst", type=int, default=20, help="image submits sent at once in (b)")
    p.add_argument(
        "--baseline", type=float, default=2.0, help="seconds of idle heartbeat reads in (b)"
    )
    p.add_argument("--pops", type=int, default=200, help="timed pops per kind in (c)")
    # print_report names the client; (b) and (c) always use the lean one.
    p.set_defaults(client="lean")
    tc.add_common_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return tc.run_phases(
        parser().parse_args(argv),
        {"a": run_normalise_phase, "b": run_burst_phase, "c": run_pop_phase},
    )


if __name__ == "__main__":
    sys.exit(main())
