"""The Redis client for the signals: hordelite's own connections
(hordelite/signals/_resp.py: commands, decision 0062; pub/sub, decision
0067), coredis and redis-py's asyncio client when they are installed.

Measures, against the Redis at HORDELITE_TEST_REDIS_URL (default
redis://127.0.0.1:6379/0; it uses logical database 5 and flushes it):

- a command's round trip (a GET), one caller, as p50 microseconds, calls
  per second and this process's CPU per call;
- a signal's trip: PUBLISH on one connection to the message at a
  subscriber's pattern subscription (``horde:chat:*``) in the same
  process, p50 microseconds and this process's CPU per signal (the publish
  and the hearing: what a signal the process sends and hears back costs it).

hordelite and coredis run on trio and on asyncio; redis-py's asyncio client
on asyncio only. A client that is not installed (coredis and redis-py are
no dependencies of hordelite) prints "not installed". Each figure is printed
with its ratio to hordelite on trio, measured in the same run.

    .venv/bin/python bench/redis_clients.py [--calls N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
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


async def signal_trips(
    listen: Callable[[Callable[[], None]], Coroutine[Any, Any, None]],
    publish: Callable[[], Awaitable[Any]],
) -> tuple[list[float], float]:
    """Seconds from each PUBLISH to its message at ``listen``'s pattern
    subscription (``listen(heard)`` calls ``heard()`` for each message), and
    this process's CPU microseconds a signal."""
    trips: list[float] = []
    got = anyio.Event()
    sent_at = 0.0

    def heard() -> None:
        trips.append(time.perf_counter() - sent_at)
        got.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(listen, heard)
        await anyio.sleep(0.1)
        cpu = time.process_time()
        for _ in range(SIGNALS):
            got = anyio.Event()
            sent_at = time.perf_counter()
            await publish()
            with anyio.fail_after(5):
                await got.wait()
        spent = time.process_time() - cpu
        tg.cancel_scope.cancel()
    return trips, spent / SIGNALS * 1e6


def figures(
    round_trip: tuple[float, float, float], signals: tuple[list[float], float]
) -> dict[str, float]:
    (p50, rate, cpu), (trips, signal_cpu) = round_trip, signals
    return {
        "get_p50": p50,
        "get_rate": rate,
        "get_cpu": cpu,
        "signal_p50": statistics.median(trips) * 1e6,
        "signal_cpu": signal_cpu,
    }


async def hordelite_figures(calls: int) -> dict[str, float]:
    from hordelite.signals._resp import Commands

    commands = Commands(bench_url(), 2.0)
    listener = Commands(bench_url(), 2.0)

    async def listen(heard: Callable[[], None]) -> None:
        await listener.listen([], ["horde:chat:*"], lambda: None, lambda _c, _d: heard())

    try:
        await commands.call("SET", "horde:version:r1", "7")
        round_trip = await round_trips(lambda: commands.call("GET", "horde:version:r1"), calls)
        signals = await signal_trips(
            listen, lambda: commands.call("PUBLISH", "horde:chat:r1", "end")
        )
        await commands.call("FLUSHDB")
    finally:
        await commands.aclose()
    return figures(round_trip, signals)


async def coredis_figures(calls: int) -> dict[str, float] | None:
    try:
        import coredis  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    client = coredis.Redis.from_url(bench_url(), decode_responses=True)

    async def listen(heard: Callable[[], None]) -> None:
        async with client.pubsub(patterns=["horde:chat:*"]) as pubsub:
            async for message in pubsub:
                if message["type"] == "pmessage":
                    heard()

    async with client:
        await client.flushdb()
        await client.set("horde:version:r1", "7")
        round_trip = await round_trips(lambda: client.get("horde:version:r1"), calls)
        signals = await signal_trips(listen, lambda: client.publish("horde:chat:r1", "end"))
        await client.flushdb()
    return figures(round_trip, signals)


async def redis_py_figures(calls: int) -> dict[str, float] | None:
    try:
        import redis.asyncio as redis_asyncio  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    client = redis_asyncio.Redis.from_url(bench_url(), decode_responses=True)
    pubsub = client.pubsub()

    async def listen(heard: Callable[[], None]) -> None:
        while True:
            message = await pubsub.get_message(timeout=5)
            if message is not None and message["type"] == "pmessage":
                heard()

    try:
        await client.set("horde:version:r1", "7")
        round_trip = await round_trips(lambda: client.get("horde:version:r1"), calls)
        await pubsub.psubscribe("horde:chat:*")
        signals = await signal_trips(listen, lambda: client.publish("horde:chat:r1", "end"))
        await pubsub.aclose()
        await client.flushdb()
    finally:
        await client.aclose()
    return figures(round_trip, signals)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    rows: dict[str, dict[str, float] | None] = {
        "hordelite on trio": anyio.run(hordelite_figures, args.calls, backend="trio"),
        "hordelite on asyncio": anyio.run(hordelite_figures, args.calls, backend="asyncio"),
        "coredis on trio": anyio.run(coredis_figures, args.calls, backend="trio"),
        "coredis on asyncio": anyio.run(coredis_figures, args.calls, backend="asyncio"),
        "redis-py asyncio (asyncio only)": anyio.run(
            redis_py_figures, args.calls, backend="asyncio"
        ),
    }
    base = rows["hordelite on trio"]
    assert base is not None
    print(
        f"{'client':32} {'GET p50 us':>10} {'GET/s':>7} {'CPU/GET us':>10}"
        f" {'signal p50 us':>13} {'CPU/signal us':>13}   ratios to hordelite on trio"
    )
    keys = ("get_p50", "get_rate", "get_cpu", "signal_p50", "signal_cpu")
    for name, row in rows.items():
        if row is None:
            print(f"{name:32} not installed")
            continue
        ratios = " ".join(f"x{row[k] / base[k]:.2f}" for k in keys)
        print(
            f"{name:32} {row['get_p50']:10.1f} {row['get_rate']:7.0f} {row['get_cpu']:10.1f}"
            f" {row['signal_p50']:13.1f} {row['signal_cpu']:13.1f}   {ratios}"
        )
    print(f"calls: {args.calls} GETs, {SIGNALS} signals per client")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
