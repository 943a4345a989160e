"""An anonymous image flood against a full image budget, black-box.

A fresh ``hordelite serve`` child (default configuration, a fresh SQLite
file, ``images.fetch_private`` on so that it can fetch from the loopback
image host this script starts with ``python -m http.server``). First the
anonymous user fills its image budget (budgets.anonymous_image_bytes, 64 MiB
by default) with requests of ``--fill-images`` photo-like PNGs each, sent as
data URLs, until the first 429 StoredBytesExceeded. Then ``--senders``
anonymous clients send image requests of ``--flood-images`` (8) images for
``--seconds`` (half of them as data URLs, half as http URLs of the same
PNG), while a registered user sends
one-image submits (a 256x256 JPEG as a data URL) one after another.

Prints: refusals a minute (and every status seen), the server's CPU (its
process's user + system time over the flood, in % of one core), the peak
size of the blob folder (sampled every 50 ms) against the budget, blobs left
on disk that no request holds, and the registered user's submit seconds
(p50, p90, max).

    .venv/bin/python bench/hostile_images.py --senders 32 --seconds 30

Targets (issue 35): the registered user's p50 < 2 s; the blob folder never
past the budget by more than what is in flight.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import chat_cycle as cc  # bench/ is the script's folder, so on sys.path
import httpx
from PIL import Image

BUDGET = 64 * 1024 * 1024  # budgets.anonymous_image_bytes' default
ANON = "0000000000"
MODEL = cc.MODEL


def photo_like(width: int, height: int) -> Image.Image:
    red = Image.linear_gradient("L").resize((width, height))
    green = Image.effect_noise((width, height), 48)
    blue = Image.radial_gradient("L").resize((width, height))
    return Image.merge("RGB", (red, green, blue))


def encoded(img: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt)
    return out.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def body(urls: list[str]) -> bytes:
    content: list[dict[str, Any]] = [{"type": "text", "text": "what is this?"}]
    content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    request = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 16}
    return json.dumps(request).encode()


def folder_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, f)).st_size
    return total


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def server(
    workdir: Path, port: int, source: str | None
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    config = workdir / "horde.toml"
    blobs = workdir / "blobs"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {port}\ngrace_period = 1.0\n'
        f'[storage]\ndatabase = "{workdir / "horde.db"}"\n'
        f'[blobs]\ndirectory = "{blobs}"\n'
        "[images]\nfetch_private = true\n"
    )
    base = [sys.executable, "-m", "hordelite", "--config", str(config)]
    log = (workdir / "serve.log").open("w")
    # ``python -m`` puts the working directory first on sys.path: the server
    # of another tree starts in that tree.
    env = None if source is None else {**os.environ, "PYTHONPATH": source}
    proc = subprocess.Popen([*base, "serve"], stdout=log, stderr=log, env=env, cwd=source)
    try:
        yield proc, blobs
    finally:
        proc.terminate()
        proc.wait(30)


def create_key(workdir: Path, name: str) -> str:
    config = workdir / "horde.toml"
    out = subprocess.run(
        [sys.executable, "-m", "hordelite", "--config", str(config), "keys", "create", name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.strip().split()[-1]


async def wait_up(client: httpx.AsyncClient) -> None:
    with anyio.fail_after(60):
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get("/api/v2/status/heartbeat")).status_code == 200:
                    return
            await anyio.sleep(0.2)


async def submit(client: httpx.AsyncClient, key: str, payload: bytes) -> tuple[int, Any]:
    answer = await client.post(
        "/api/v2/generate/chat/async",
        content=payload,
        headers={"apikey": key, "content-type": "application/json", "client-agent": "probe:1:x"},
    )
    try:
        return answer.status_code, answer.json()
    except ValueError:
        return answer.status_code, answer.text


async def fill(client: httpx.AsyncClient, payload: bytes) -> int:
    """Anonymous requests until the image budget refuses; how many were queued."""
    for queued in range(1000):
        status, answer = await submit(client, ANON, payload)
        if status == 429 and answer.get("rc") == "StoredBytesExceeded":
            return queued
        if status != 202:
            raise SystemExit(f"fill: {status} {answer}")
    raise SystemExit("fill: the budget never refused")


@contextlib.contextmanager
def image_host(workdir: Path, port: int, png: bytes) -> Iterator[None]:
    """A loopback HTTP server answering /photo.png."""
    images = workdir / "images"
    images.mkdir(exist_ok=True)
    (images / "photo.png").write_bytes(png)
    host = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=images,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        host.terminate()
        host.wait(10)


async def flood(
    args: argparse.Namespace, proc: subprocess.Popen[bytes], blobs: Path, png: bytes
) -> None:
    url = f"http://127.0.0.1:{args.port}"
    small = data_url(encoded(photo_like(256, 256), "JPEG"), "image/jpeg")
    limits = httpx.Limits(max_connections=args.senders + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        await wait_up(client)
        key = create_key(Path(args.workdir), "registered")
        worker_key = create_key(Path(args.workdir), "owner")
        pop = {
            **cc.chat_pop_body("probe-vision-worker"),
            "chat_features": [*cc.CHAT_FEATURES, "vision"],
            "image_transports": ["url"],
        }
        checked_in = await client.post(
            "/api/v2/generate/text/pop", json=pop, headers={"apikey": worker_key}
        )
        assert checked_in.status_code == 200, checked_in.text
        by_data = body([data_url(png, "image/png")] * args.fill_images)
        queued = await fill(client, by_data)
        held = folder_bytes(blobs)
        print(f"PNG {len(png):,} bytes; filled with {queued} requests; blob folder {held:,}")
        one_data = body([data_url(png, "image/png")] * args.flood_images)
        one_http = body([f"http://127.0.0.1:{args.image_port}/photo.png"] * args.flood_images)
        statuses: Counter[str] = Counter()
        latencies: list[float] = []
        peak = [held]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], folder_bytes(blobs))
                time.sleep(0.05)

        async def sender(n: int) -> None:
            payload = one_data if n % 2 == 0 else one_http
            while time.monotonic() < end:
                try:
                    status, answer = await submit(client, ANON, payload)
                except httpx.HTTPError as error:  # the server shed the connection
                    statuses[type(error).__name__] += 1
                    continue
                rc = answer.get("rc", "") if isinstance(answer, dict) else ""
                statuses[f"{status} {rc}".strip()] += 1

        async def registered() -> None:
            payload = body([small])
            while time.monotonic() < end:
                start = time.perf_counter()
                try:
                    status, answer = await submit(client, key, payload)
                except httpx.HTTPError as error:
                    statuses[f"registered {type(error).__name__}"] += 1
                    continue
                finally:
                    latencies.append(time.perf_counter() - start)
                if status != 202:
                    statuses[f"registered {status} {answer}"] += 1
                else:  # cancelled, so that its holdings stay below its own budgets
                    await client.delete(
                        f"/api/v2/generate/chat/status/{answer['id']}", headers={"apikey": key}
                    )
                await anyio.sleep(1.0)  # within budgets.requests_per_minute

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
        end = wall0 + args.seconds
        async with anyio.create_task_group() as tg:
            for n in range(args.senders):
                tg.start_soon(sender, n)
            tg.start_soon(registered)
        cpu1, wall1 = cpu_seconds(proc.pid), time.monotonic()
        stop.set()
        sampler.join()
        await anyio.sleep(2)  # refused intakes finish deleting
        left = folder_bytes(blobs)
    report(args, statuses, latencies, (cpu1 - cpu0) / (wall1 - wall0), peak[0], held, left)


def report(
    args: argparse.Namespace,
    statuses: Counter[str],
    latencies: list[float],
    cpu: float,
    peak: int,
    held: int,
    left: int,
) -> None:
    refusals = sum(v for k, v in statuses.items() if k.startswith("429"))
    print(f"{args.senders} senders for {args.seconds:g} s: {dict(statuses)}")
    print(f"refusals a minute: {refusals * 60 / args.seconds:,.0f}")
    per = cpu * args.seconds / refusals * 1000 if refusals else 0.0
    print(f"server CPU: {cpu * 100:.0f}% of a core, {per:.0f} ms a refusal")
    print(
        f"blob folder: held {held:,} after the fill, peak {peak:,} "
        f"({peak / BUDGET:.2f}x the budget), {left:,} after the flood"
    )
    if latencies:
        q = statistics.quantiles(latencies, n=10) if len(latencies) > 1 else latencies * 9
        print(
            f"registered one-image submit ({len(latencies)}): p50 "
            f"{statistics.median(latencies):.3f} s, p90 {q[8]:.3f} s, max {max(latencies):.3f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--senders", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--port", type=int, default=7140)
    parser.add_argument("--image-port", type=int, default=7145)
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=1200)
    parser.add_argument("--fill-images", type=int, default=4)
    # budgets.anonymous_images_per_request's default
    parser.add_argument("--flood-images", type=int, default=8)
    parser.add_argument("--workdir", default="/tmp/hostile-images")
    parser.add_argument("--against", help="another hordelite tree the server runs from")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in ("horde.db", "horde.db-wal", "horde.db-shm"):
        (workdir / stale).unlink(missing_ok=True)
    subprocess.run(["rm", "-rf", str(workdir / "blobs")], check=True)
    png = encoded(photo_like(args.width, args.height), "PNG")
    with (
        image_host(workdir, args.image_port, png),
        server(workdir, args.port, args.against) as (proc, blobs),
    ):
        anyio.run(flood, args, proc, blobs, png)


if __name__ == "__main__":
    main()
