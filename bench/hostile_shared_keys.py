"""A shared key lent with a small kudos cap, tried as its holder would:
how much of its lender's kudos does it spend?

A fresh `hordelite serve` (a child process, on a new SQLite file or a new
PostgreSQL schema), a lender with plenty of kudos lending a key of
``--cap`` kudos, a worker answering every job in full (every job billed at
its max_length), and the key's holder sending ``--requests`` requests of
``--max-length`` through the key, one after another (sequential) or all at
once (concurrent), before the worker takes the first (a busy horde: nothing
has settled yet when the last is admitted). Once every admitted request has ended, the figure is
what the lender was charged, against the cap and against the cap plus one
request's price (the bound the reservation promises).

```
.venv/bin/python bench/hostile_shared_keys.py                       # SQLite, both modes
.venv/bin/python bench/hostile_shared_keys.py --storage postgresql  # a new schema
```

The exit status is 1 when the lender was charged more than the cap plus one
request's price in any mode.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
from _common import DEFAULT_POSTGRES, POSTGRES_ENV, fresh_schema, stop_process

from hordelite.testing import FakeTextWorker

MODEL = "probe-model"
HORDELITE = str(Path(sys.executable).with_name("hordelite"))


def _cli(database: str, *args: str) -> str:
    out = subprocess.run(
        [HORDELITE, *args, "--database", database], check=True, capture_output=True, text=True
    ).stdout
    return out


def _new_key(database: str, name: str, kudos: int) -> str:
    out = _cli(database, "keys", "create", name, "--kudos", str(kudos))
    return next(
        line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("API key")
    )


async def _wait_up(url: str) -> None:
    async with httpx.AsyncClient(base_url=url) as client:
        with anyio.fail_after(30):
            while True:
                try:
                    if (await client.get("/api/v2/status/heartbeat")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.1)


async def _kudos(client: httpx.AsyncClient, key: str) -> float:
    r = await client.get("/api/v2/find_user", headers={"apikey": key})
    r.raise_for_status()
    return float(r.json()["kudos"])


async def _run(url: str, lender: str, worker_key: str, args: argparse.Namespace) -> dict[str, Any]:
    """One mode: returns what the lender was charged and what was admitted."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        r = await client.put(
            "/api/v2/sharedkeys", headers={"apikey": lender}, json={"kudos": args.cap}
        )
        r.raise_for_status()
        shared = r.json()["id"]
        before = await _kudos(client, lender)
        admitted: list[str] = []
        refused: dict[str, int] = {}
        price = 0.0
        body = {
            "prompt": "Hello",
            "params": {"max_length": args.max_length, "max_context_length": 1024},
            "models": [MODEL],
        }

        async def submit() -> None:
            nonlocal price
            r = await client.post(
                "/api/v2/generate/text/async", headers={"apikey": shared}, json=body
            )
            if r.status_code == 202:
                admitted.append(r.json()["id"])
                price = max(price, float(r.json()["kudos"]))
            else:
                rc = r.json().get("rc", str(r.status_code))
                refused[rc] = refused.get(rc, 0) + 1

        worker = FakeTextWorker(
            url,
            worker_key,
            models=[MODEL],
            max_length=args.max_length,
            generate=lambda _prompt: "word " * args.max_length,  # billed at max_length
        )
        async with worker, anyio.create_task_group() as tg:

            async def serve() -> None:
                while True:
                    await worker.serve_one(wait=1)

            if args.mode == "sequential":
                for _ in range(args.requests):
                    await submit()
            else:
                async with anyio.create_task_group() as senders:
                    for _ in range(args.requests):
                        senders.start_soon(submit)
            tg.start_soon(serve)  # after the submits: the worst case, a busy horde
            with anyio.fail_after(120):
                for rid in admitted:
                    status: dict[str, Any] = {"done": False, "faulted": False}
                    while not (status["done"] or status["faulted"]):
                        status = (
                            await client.get(
                                f"/api/v2/generate/text/status/{rid}", params={"wait": 5}
                            )
                        ).json()
            tg.cancel_scope.cancel()
        after = await _kudos(client, lender)
        key = (await client.get(f"/api/v2/sharedkeys/{shared}")).json()
    charged = round(before - after, 2)
    return {
        "mode": args.mode,
        "admitted": len(admitted),
        "refused": refused,
        "price": price,
        "charged": charged,
        "ratio": round(charged / args.cap, 2),
        "bound": round(args.cap + price, 2),
        "key_left": key["kudos"],
        "key_utilized": key["utilized"],
    }


def _serve(database: str, port: int, log: Path) -> subprocess.Popen[Any]:
    return subprocess.Popen(
        [HORDELITE, "serve", "--database", database, "--port", str(port)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "HORDELITE_HORDE_ALLOW_ANONYMOUS": "true"},
    )


def _mode(database: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    _cli(database, "db", "upgrade")
    lender = _new_key(database, f"lender-{args.mode}", 100_000)
    worker_key = _new_key(database, f"worker-{args.mode}", 0)
    server = _serve(database, args.port, workdir / f"serve-{args.mode}.log")
    try:
        url = f"http://127.0.0.1:{args.port}"
        anyio.run(_wait_up, url)
        return anyio.run(_run, url, lender, worker_key, args)
    finally:
        stop_process(server, 15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--port", type=int, default=7120)
    parser.add_argument("--cap", type=int, default=30)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--modes", default="sequential,concurrent")
    args = parser.parse_args()
    results = []
    for mode in args.modes.split(","):
        args.mode = mode
        with tempfile.TemporaryDirectory(prefix="hostile-shared-keys-") as tmp:
            workdir = Path(tmp)
            if args.storage == "sqlite":
                results.append(_mode(str(workdir / "horde.db"), args, workdir))
            else:
                with fresh_schema(os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES)) as url:
                    results.append(_mode(url, args, workdir))
    worst = False
    print(
        f"storage {args.storage}, a key of {args.cap} kudos, {args.requests} requests of "
        f"max_length {args.max_length}"
    )
    for r in results:
        over = r["charged"] > r["bound"]
        worst |= over
        print(
            f"{r['mode']:>10}: admitted {r['admitted']:>3}, refused {r['refused']}, "
            f"price {r['price']:.2f}, lender charged {r['charged']:.2f} "
            f"({r['ratio']}x the cap; bound cap + price {r['bound']:.2f}: "
            f"{'MISS' if over else 'PASS'}), key left {r['key_left']}, "
            f"utilized {r['key_utilized']}"
        )
    return 1 if worst else 0


if __name__ == "__main__":
    started = time.monotonic()
    status = main()
    print(f"({time.monotonic() - started:.1f} s)")
    sys.exit(status)
