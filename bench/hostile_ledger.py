"""The ledger tried as a hostile user would (issue 35, finding 7), black-box.

Starts ``hordelite serve`` on a fresh store, creates users with the CLI,
then through ``POST /api/v2/kudos/transfer`` only:

1. ``--transfers`` transfers (2,000 by default) of random whole hundredths
   between the users, ``--concurrency`` at a time; then the sum of every
   balance is read from the database as stored, against the sum created.
2. Each user transfers the balance ``/find_user`` shows it (rounded to the
   hundredth, as a client reads it) to another: on a float ledger a
   balance stored as 450.70999999999856 shows as 450.71, and sending it is
   refused ("450.71 is more than your 450.71 kudos").
3. A transfer sent twice with the same ``Idempotency-Key`` (a client that
   retries after a lost answer): how much left the sender's balance.
4. Transfers under keys while the server is killed (-9), then started
   again; the transfers whose answers were lost retried with their keys:
   how much left the sender against how much it sent.

```
.venv/bin/python bench/hostile_ledger.py                     # SQLite
.venv/bin/python bench/hostile_ledger.py --storage postgresql
```
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import anyio
import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).parent))
from _common import fresh_schema, stop_process

POSTGRES_ENV = "HORDELITE_TEST_POSTGRES_URL"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
USERS = 8
START_KUDOS = "1000"


def cli(database: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hordelite", *args, "--database", database],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def create_users(database: str) -> list[tuple[str, str]]:
    """(handle, key) of each user, each created with START_KUDOS."""
    made = []
    for i in range(USERS):
        out = cli(database, "keys", "create", f"ledger{i}", "--kudos", START_KUDOS)
        handle = re.search(r"user (\S+) created", out)
        key = re.search(r"API key \(shown once, keep it\): (\S+)", out)
        assert handle, out
        assert key, out
        made.append((handle.group(1), key.group(1)))
    return made


def stored_sum(database: str) -> tuple[Any, str]:
    """SUM(kudos) of every user but the anonymous one, as the database holds it,
    and the column's declared type."""
    if database.startswith("postgresql"):
        with psycopg.connect(database) as conn:
            total = conn.execute("SELECT sum(kudos) FROM users WHERE id <> 0").fetchone()
            kind = conn.execute(
                "SELECT data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema() "
                "AND table_name = 'users' AND column_name = 'kudos'"
            ).fetchone()
            assert total is not None
            assert kind is not None
            return total[0], str(kind[0])
    import sqlite3

    with sqlite3.connect(database) as conn:
        total = conn.execute("SELECT sum(kudos) FROM users WHERE id <> 0").fetchone()[0]
        kind = next(r[2] for r in conn.execute("PRAGMA table_info(users)") if r[1] == "kudos")
        return total, kind


async def transfer(
    client: httpx.AsyncClient, key: str, to: str, amount: float, op: str | None = None
) -> httpx.Response:
    headers = {"apikey": key}
    if op is not None:
        headers["Idempotency-Key"] = op
    return await client.post(
        "/api/v2/kudos/transfer", json={"username": to, "amount": amount}, headers=headers
    )


async def shown_kudos(client: httpx.AsyncClient, key: str) -> float:
    answer = await client.get("/api/v2/find_user", headers={"apikey": key})
    answer.raise_for_status()
    return float(answer.json()["kudos"])


async def run(server: Server, args: argparse.Namespace) -> None:
    url, database = server.url, server.database
    made = create_users(database)
    start_sum, kind = stored_sum(database)
    print(f"kudos column: {kind}; {USERS} users created with {START_KUDOS} kudos each")
    rng = random.Random(args.seed)
    plan = []
    for _ in range(args.transfers):
        a, b = rng.sample(range(USERS), 2)
        plan.append((a, b, rng.randint(1, 999) / 100))
    counts = {"ok": 0, "refused": 0}
    limiter = anyio.CapacityLimiter(args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def one(a: int, b: int, amount: float) -> None:
            async with limiter:
                answer = await transfer(client, made[a][1], made[b][0], amount)
            counts["ok" if answer.status_code == 200 else "refused"] += 1

        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for a, b, amount in plan:
                tg.start_soon(one, a, b, amount)
        took = time.perf_counter() - began
        end_sum, _ = stored_sum(database)
        drift = Decimal(str(end_sum)) - Decimal(str(start_sum))
        print(
            f"1. {args.transfers} transfers ({counts['ok']} moved, {counts['refused']} refused) "
            f"in {took:.1f} s; stored sum before {start_sum!r}, after {end_sum!r}, "
            f"drift {drift} (stored units)"
        )
        refused = []
        for i, (_, key) in enumerate(made):
            shown = round(await shown_kudos(client, key), 2)
            if shown <= 0:
                continue
            answer = await transfer(client, key, made[(i + 1) % USERS][0], shown)
            if answer.status_code != 200:
                refused.append(f"{shown}: {answer.json().get('message')}")
        print(f"2. sending the balance shown: {len(refused)} of {USERS} refused")
        for line in refused:
            print(f"   {line}")
        sender, to = made[0][1], made[1][0]
        await transfer(client, made[2][1], made[0][0], 5.0)  # something to send
        before = await shown_kudos(client, sender)
        first = await transfer(client, sender, to, 1.25, op="retry-1")
        second = await transfer(client, sender, to, 1.25, op="retry-1")
        after = await shown_kudos(client, sender)
        print(
            f"3. one transfer of 1.25 sent twice with one Idempotency-Key: answers "
            f"{first.status_code} {first.text.strip()} and {second.status_code} "
            f"{second.text.strip()}; the sender paid {before - after:.2f}"
        )
    await crash_run(server, made, args)


CRASH_TRANSFERS = 400


async def crash_run(server: Server, made: list[tuple[str, str]], args: argparse.Namespace) -> None:
    """Transfers of 0.01 under keys, the server killed (-9) while they run,
    then started again; each transfer whose answer was lost is retried with
    its key, as a careful client does. Each must have moved once."""
    sender, to = made[0][1], made[1][0]  # user 0 holds most kudos by now
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        before = await shown_kudos(client, sender)
    lost: list[int] = []
    limiter = anyio.CapacityLimiter(args.concurrency)
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:

        async def one(i: int) -> None:
            try:
                async with limiter:
                    answer = await transfer(client, sender, to, 0.01, op=f"crash-{i}")
                if answer.status_code != 200:
                    lost.append(i)
            except httpx.HTTPError:
                lost.append(i)

        async with anyio.create_task_group() as tg:
            for i in range(CRASH_TRANSFERS):
                tg.start_soon(one, i)
            await anyio.sleep(0.5)
            server.kill()
    server.start()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        for i in lost:
            answer = await transfer(client, sender, to, 0.01, op=f"crash-{i}")
            assert answer.status_code == 200, answer.text
        after = await shown_kudos(client, sender)
    print(
        f"4. {CRASH_TRANSFERS} transfers of 0.01 under keys, kill -9 during them, "
        f"{len(lost)} answers lost and retried with their keys: the sender paid "
        f"{before - after:.2f} for {CRASH_TRANSFERS * 0.01:.2f} of transfers"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--port", type=int, default=7160)
    parser.add_argument("--transfers", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=35)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hostile_ledger") as tmp:
        if args.storage == "sqlite":
            _serve(str(Path(tmp) / "horde.db"), tmp, args)
            return
        with fresh_schema(os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES)) as database:
            _serve(database, tmp, args)


class Server:
    """``hordelite serve`` on ``database``, started again after a kill -9."""

    def __init__(self, database: str, tmp: str, port: int) -> None:
        self.database = database
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.log = open(Path(tmp) / "serve.log", "a")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "hordelite", "serve", "--database", self.database),
                *("--host", "127.0.0.1", "--port", str(self.port)),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{self.url}/api/v2/status/heartbeat", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.1)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, 10)
        self.log.close()


def _serve(database: str, tmp: str, args: argparse.Namespace) -> None:
    cli(database, "db", "upgrade")
    server = Server(database, tmp, args.port)
    try:
        server.start()
        anyio.run(run, server, args)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
