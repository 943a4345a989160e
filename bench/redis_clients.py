"""The Redis client for the signals: coredis against redis-py's asyncio client.

Measures, against the Redis at HORDELITE_TEST_REDIS_URL (default
redis://127.0.0.1:6379/0; it uses logical database 5 and flushes it):

- a command's round trip (GET of a request version, what every status read
  sends), one caller, as p50 microseconds and calls per second;
- a signal's trip: PUBLISH on one connection to the message at a
  subscriber's pattern subscription (``horde:chat:*``), p50 microseconds.

coredis runs on trio and on asyncio; redis-py's asyncio client on asyncio
only (its row is skipped when redis-py is not installed). Each figure is
printed with its ratio to coredis on asyncio, measured in the same run.

    .venv/bin/python bench/redis_clients.py [--calls N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import coredis
from _common import DEFAULT_REDIS, REDIS_ENV, redis_on_db  # bench/ is on sys.path

SIGNALS = 300


def bench_url() -> str:
    return redis_on_db(os.environ.get(REDIS_ENV, DEFAULT_REDIS), 5)


async def round_trips(get: Callable[[], Awaitable[Any]], calls: int) -> tuple[float, float]:
    """p50 microseconds and calls per second of ``get``."""
    times = []
    started = time.perf_counter()
    for _ in range(calls):
        t = time.perf_counter()
        await get()
        times.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - started
    return statistics.median(times) * 1e6, calls / elapsed


async def coredis_figures(calls: int) -> dict[str, float]:
    client: coredis.Redis[str] = coredis.Redis.from_url(bench_url(), decode_responses=True)
    async with client:
        await client.flushdb()
        await client.set("horde:version:r1", "7")
        p50, rate = await round_trips(lambda: client.get("horde:version:r1"), calls)
        trips: list[float] = []
        async with client.pubsub(patterns=["horde:chat:*"]) as pubsub:
            got = anyio.Event()
            sent_at = 0.0

            async def hear() -> None:
                async for message in pubsub:
                    if message["type"] == "pmessage":
                        trips.append(time.perf_counter() - sent_at)
                        got.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(hear)
                await anyio.sleep(0.1)
                for _ in range(SIGNALS):
                    got = anyio.Event()
                    sent_at = time.perf_counter()
                    await client.publish("horde:chat:r1", "end")
                    with anyio.fail_after(5):
                        await got.wait()
                tg.cancel_scope.cancel()
        await client.flushdb()
    return {"get_p50": p50, "get_rate": rate, "signal_p50": statistics.median(trips) * 1e6}


async def redis_py_figures(calls: int) -> dict[str, float] | None:
    try:
        import redis.asyncio as redis_asyncio  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    client = redis_asyncio.Redis.from_url(bench_url(), decode_responses=True)
    try:
        await client.set("horde:version:r1", "7")
        p50, rate = await round_trips(lambda: client.get("horde:version:r1"), calls)
        pubsub = client.pubsub()
        await pubsub.psubscribe("horde:chat:*")
        trips = []
        for _ in range(SIGNALS):
            sent_at = time.perf_counter()
            await client.publish("horde:chat:r1", "end")
            while True:
                message = await pubsub.get_message(timeout=5)
                if message is not None and message["type"] == "pmessage":
                    trips.append(time.perf_counter() - sent_at)
                    break
        await pubsub.aclose()
        await client.flushdb()
    finally:
        await client.aclose()
    return {"get_p50": p50, "get_rate": rate, "signal_p50": statistics.median(trips) * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    rows: dict[str, dict[str, float] | None] = {
        "coredis on asyncio": anyio.run(coredis_figures, args.calls, backend="asyncio"),
        "coredis on trio": anyio.run(coredis_figures, args.calls, backend="trio"),
        "redis-py asyncio (asyncio only)": anyio.run(
            redis_py_figures, args.calls, backend="asyncio"
        ),
    }
    base = rows["coredis on asyncio"]
    assert base is not None
    print(
        f"{'client':34} {'GET p50 us':>11} {'GET/s':>8} {'signal p50 us':>14}   ratios to coredis/asyncio"
    )
    for name, row in rows.items():
        if row is None:
            print(f"{name:34} not installed")
            continue
        print(
            f"{name:34} {row['get_p50']:11.1f} {row['get_rate']:8.0f} {row['signal_p50']:14.1f}"
            f"   x{row['get_p50'] / base['get_p50']:.2f} x{row['get_rate'] / base['get_rate']:.2f}"
            f" x{row['signal_p50'] / base['signal_p50']:.2f}"
        )
    print(f"calls: {args.calls} GETs, {SIGNALS} signals per client")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
