"""A user's own worker answers its own requests with huge generations: what
the database and a status read cost (issue 35, finding 1).

Starts a fresh default ``hordelite serve`` (SQLite, the defaults: run from an
empty folder, so no hordelite.toml is read) on ``--port``, creates one
registered user with ``hordelite keys create``, then for ``--seconds``:

- one task queues text requests (n=20, max_length 16) with the user's key,
  as fast as they are accepted (a refused one waits a second);
- ``--workers`` tasks pop jobs as that user's workers and submit each with a
  generation of ``--generation`` bytes (10 MB by default).

Prints the database's growth (the SQLite file and its WAL) per second, the
submits accepted and refused (by rc), then reads the status of the largest
request (one read, then four at once) and prints the answer's size and the
server's resident memory (VmRSS, and its peak VmHWM) before and after, with a heartbeat's
latency during the four reads.

    .venv/bin/python bench/hostile_generations.py --port 7110 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HORDELITE = str(Path(sys.executable).with_name("hordelite"))
MODEL = "koboldcpp/hostile-7B"


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """The process's resident memory now (VmRSS) or at its peak (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.exists())


async def queue_requests(
    client: httpx.AsyncClient,
    key: str,
    max_length: int,
    until: float,
    ids: list[str],
    rcs: collections.Counter[str],
) -> None:
    body = {
        "prompt": "Say something.",
        "params": {"n": 20, "max_length": max_length, "max_context_length": max_length + 2048},
        "models": [MODEL],
    }
    while time.monotonic() < until:
        r = await client.post("/api/v2/generate/text/async", json=body, headers={"apikey": key})
        if r.status_code == 202:
            ids.append(r.json()["id"])
        else:
            rcs[f"queue {r.status_code} {r.json().get('rc')}"] += 1
            await asyncio.sleep(1.0)


async def answer_jobs(
    client: httpx.AsyncClient,
    key: str,
    name: str,
    max_length: int,
    until: float,
    generation: bytes,
    rcs: collections.Counter[str],
) -> None:
    pop = {
        "name": name,
        "models": [MODEL],
        "max_length": max_length,
        "max_context_length": max_length + 2048,
        "bridge_agent": "hostile:1:bench",
    }
    headers = {"apikey": key, "content-type": "application/json"}
    while time.monotonic() < until:
        r = await client.post("/api/v2/generate/text/pop", json=pop, headers={"apikey": key})
        job = r.json().get("id") if r.status_code == 200 else None
        if not job:
            await asyncio.sleep(0.2)
            continue
        body = b'{"id":"' + job.encode() + b'","state":"ok","generation":"' + generation + b'"}'
        s = await client.post("/api/v2/generate/text/submit", content=body, headers=headers)
        rcs[f"submit {s.status_code} {s.json().get('rc', '')}".rstrip()] += 1


async def read_statuses(base: str, pid: int, request_id: str) -> None:
    url = f"/api/v2/generate/text/status/{request_id}"
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        before = rss_mb(pid)
        r = await client.get(url)
        print(
            f"status: {r.status_code}, {len(r.content):,} bytes; RSS {before:.0f} -> {rss_mb(pid):.0f} MB"
        )
        beats: list[float] = []
        stop = asyncio.Event()

        async def heartbeat() -> None:
            while not stop.is_set():
                t = time.monotonic()
                await client.get("/api/v2/status/heartbeat")
                beats.append(time.monotonic() - t)
                await asyncio.sleep(0.05)

        async def four() -> None:
            clients = [httpx.AsyncClient(base_url=base, timeout=120) for _ in range(4)]
            try:
                await asyncio.gather(*(c.get(url) for c in clients))
            finally:
                stop.set()
                for c in clients:
                    await c.aclose()

        await asyncio.gather(heartbeat(), four())
        print(
            f"four reads at once: RSS {rss_mb(pid):.0f} MB (peak {rss_mb(pid, 'VmHWM'):.0f}), heartbeat max "
            f"{max(beats) * 1000:.0f} ms over {len(beats)} reads"
        )


async def flood(args: argparse.Namespace, base: str, key: str, db: Path, pid: int) -> None:
    # A control character is 1 byte stored and 6 in a JSON answer (\\u0001):
    # --escaped makes the status answer as large as a generation can make it.
    generation = (b"\\u0001" if args.escaped else b"a") * args.generation
    rcs: collections.Counter[str] = collections.Counter()
    ids: list[str] = []
    start_bytes, start = db_bytes(db), time.monotonic()
    until = start + args.seconds
    limits = httpx.Limits(max_connections=args.workers + 2)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        await asyncio.gather(
            queue_requests(client, key, args.max_length, until, ids, rcs),
            *(
                answer_jobs(client, key, f"hostile-{i}", args.max_length, until, generation, rcs)
                for i in range(args.workers)
            ),
        )
    elapsed = time.monotonic() - start
    grown = db_bytes(db) - start_bytes
    print(f"requests queued: {len(ids)}; answers: {dict(rcs)}")
    print(
        f"database grew {grown / 1e6:.1f} MB in {elapsed:.1f} s: "
        f"{grown / 1e6 / elapsed:.1f} MB/s, {grown / 1e6 / elapsed * 60:.0f} MB a minute"
    )
    if ids:
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            sizes = []
            for rid in ids[:10]:
                r = await client.get(f"/api/v2/generate/text/check/{rid}")
                sizes.append((r.json().get("finished", 0), rid))
        await read_statuses(base, pid, max(sizes)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=7110)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--generation", type=int, default=10_000_000, help="bytes of each")
    parser.add_argument("--max-length", type=int, default=16)
    parser.add_argument("--escaped", action="store_true", help="generations of U+0001")
    parser.add_argument("--kudos", type=float, default=0, help="the user's kudos at creation")
    parser.add_argument("--scratch", default=None, help="folder for the database (default: /tmp)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="hostile-generations-", dir=args.scratch))
    db = folder / "horde.db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    subprocess.run(
        [HORDELITE, "db", "upgrade", "--database", str(db)],
        cwd=folder,
        env=env,
        check=True,
        capture_output=True,
    )
    out = subprocess.run(
        [HORDELITE, "keys", "create", "--database", str(db), "--kudos", str(args.kudos), "flooder"],
        cwd=folder,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    key = out.split()[-1]
    server = subprocess.Popen(
        [
            HORDELITE,
            "serve",
            "--database",
            str(db),
            "--host",
            "127.0.0.1",
            "--port",
            str(args.port),
        ],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{args.port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/api/v2/status/heartbeat").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        asyncio.run(flood(args, base, key, db, server.pid))
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()


__all__: list[Any] = []
