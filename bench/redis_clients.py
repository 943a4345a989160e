"""The Redis client for the signals: coredis, redis-py's asyncio client, and
hordelite's own command connections (hordelite/signals/_resp.py, decision 0062).

Measures, against the Redis at HORDELITE_TEST_REDIS_URL (default
redis://127.0.0.1:6379/0; it uses logical database 5 and flushes it):

- a command's round trip (GET of a request version, what every status read
  sends), one caller, as p50 microseconds, calls per second and this
  process's CPU per call;
- a signal's trip: PUBLISH on one connection to the message at a
  subscriber's pattern subscription (``horde:chat:*``), p50 microseconds.

coredis and hordelite's ``Commands`` run on trio and on asyncio (the
signal rows of ``Commands`` publish with it and hear with coredis's pub/sub,
as the signals do); redis-py's asyncio client on asyncio only (its row is
skipped when redis-py is not installed). Each figure is printed with its
ratio to coredis on asyncio, measured in the same run.

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


async def round_trips(get: Callable[[], Awaitable[Any]], calls: int) -> tuple[float, float, float]:
    """p50 microseconds, calls per second and CPU microseconds a call of ``get``."""
    times = []
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        t = time.perf_counter()
        await get()
        times.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - started
    spent = time.process_time() - cpu
    return statistics.median(times) * 1e6, calls / elapsed, spent / calls * 1e6


async def signal_trips(pubsub: Any, publish: Callable[[], Awaitable[Any]]) -> list[float]:
    """Seconds from each PUBLISH to its message at ``pubsub``'s pattern subscription."""
    trips: list[float] = []
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
            await publish()
            with anyio.fail_after(5):
                await got.wait()
        tg.cancel_scope.cancel()
    return trips


async def coredis_figures(calls: int) -> dict[str, float]:
    client: coredis.Redis[str] = coredis.Redis.from_url(bench_url(), decode_responses=True)
    async with client:
        await client.flushdb()
        await client.set("horde:version:r1", "7")
        p50, rate, cpu = await round_trips(lambda: client.get("horde:version:r1"), calls)
        async with client.pubsub(patterns=["horde:chat:*"]) as pubsub:
            trips = await signal_trips(pubsub, lambda: client.publish("horde:chat:r1", "end"))
        await client.flushdb()
    return {
        "get_p50": p50,
        "get_rate": rate,
        "get_cpu": cpu,
        "signal_p50": statistics.median(trips) * 1e6,
    }


async def commands_figures(calls: int) -> dict[str, float]:
    from hordelite.signals._resp import Commands

    commands = Commands(bench_url(), 2.0)
    client: coredis.Redis[str] = coredis.Redis.from_url(bench_url(), decode_responses=True)
    try:
        await commands.call("SET", "horde:version:r1", "7")
        p50, rate, cpu = await round_trips(lambda: commands.call("GET", "horde:version:r1"), calls)
        async with client, client.pubsub(patterns=["horde:chat:*"]) as pubsub:
            trips = await signal_trips(
                pubsub, lambda: commands.call("PUBLISH", "horde:chat:r1", "end")
            )
        await commands.call("FLUSHDB")
    finally:
        await commands.aclose()
    return {
        "get_p50": p50,
        "get_rate": rate,
        "get_cpu": cpu,
        "signal_p50": statistics.median(trips) * 1e6,
    }


async def redis_py_figures(calls: int) -> dict[str, float] | None:
    try:
        import redis.asyncio as redis_asyncio  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    client = redis_asyncio.Redis.from_url(bench_url(), decode_responses=True)
    try:
        await client.set("horde:version:r1", "7")
        p50, rate, cpu = await round_trips(lambda: client.get("horde:version:r1"), calls)
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
    return {
        "get_p50": p50,
        "get_rate": rate,
        "get_cpu": cpu,
        "signal_p50": statistics.median(trips) * 1e6,
    }


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
        "hordelite Commands on asyncio": anyio.run(commands_figures, args.calls, backend="asyncio"),
        "hordelite Commands on trio": anyio.run(commands_figures, args.calls, backend="trio"),
    }
    base = rows["coredis on asyncio"]
    assert base is not None
    print(
        f"{'client':34} {'GET p50 us':>11} {'GET/s':>8} {'CPU/GET us':>11} {'signal p50 us':>14}"
        "   ratios to coredis/asyncio"
    )
    for name, row in rows.items():
        if row is None:
            print(f"{name:34} not installed")
            continue
        print(
            f"{name:34} {row['get_p50']:11.1f} {row['get_rate']:8.0f} {row['get_cpu']:11.1f}"
            f" {row['signal_p50']:14.1f}"
            f"   x{row['get_p50'] / base['get_p50']:.2f} x{row['get_rate'] / base['get_rate']:.2f}"
            f" x{row['get_cpu'] / base['get_cpu']:.2f} x{row['signal_p50'] / base['signal_p50']:.2f}"
        )
    print(f"calls: {args.calls} GETs, {SIGNALS} signals per client")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
