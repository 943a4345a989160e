"""What the Quart shell costs a page it serves, next to the dispatcher's own
routes, on one real ``hordelite serve`` (decision 0076).

The shell serves the dashboard's page (``GET /``, a template) and its static
files; the dispatcher serves every other route. Both pages below answer
bytes rendered at most once a period and reused, so what differs between
them is what serves them: ``--requests`` (2,000) sequential requests of each
on one keep-alive connection, in rounds alternating the routes (``--rounds``,
3), the server's CPU per request from /proc.

    .venv/bin/python bench/shell.py

Printed: server CPU per request for GET / (shell), GET
/dashboard/static/dashboard.css (shell, a static file), GET /dashboard/pool
and GET /api/v2/status/heartbeat (dispatcher), and each one's ratio to the
heartbeat's measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import anyio
import text_cycle as tc  # bench/ is the script's folder, so on sys.path
from _common import process_cpu

ROUTES = {
    "page (shell)": "/",
    "static file (shell)": "/dashboard/static/dashboard.css",
    "pool (dispatcher)": "/dashboard/pool",
    "heartbeat (dispatcher)": "/api/v2/status/heartbeat",
}
BASELINE = "heartbeat (dispatcher)"


async def _get(stream: anyio.abc.ByteStream, host: str, path: str, buffer: bytearray) -> int:
    """One GET on a keep-alive connection; returns the status."""
    await stream.send(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    while b"\r\n\r\n" not in buffer:
        buffer += await stream.receive()
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    body = bytearray(rest)
    while len(body) < length:
        body += await stream.receive()
    buffer[:] = body[length:]
    return int(lines[0].split()[1])


# Requests on one connection: Hypercorn closes a connection after 1,000.
PER_CONNECTION = 500


async def _measure(url: str, pid: int, path: str, count: int) -> float:
    """Server CPU seconds per request of ``count`` GETs of ``path``."""
    host_port = url.removeprefix("http://")
    host, _, port = host_port.rpartition(":")
    spent = 0.0
    for batch in range(0, count, PER_CONNECTION):
        async with await anyio.connect_tcp(host, int(port)) as stream:
            buffer = bytearray()
            for _ in range(10):  # warm: the page rendered, the connection up
                await _get(stream, host_port, path, buffer)
            before = process_cpu(pid)
            for _ in range(min(PER_CONNECTION, count - batch)):
                status = await _get(stream, host_port, path, buffer)
                if status != 200:
                    raise RuntimeError(f"GET {path} answered {status}")
            spent += process_cpu(pid) - before
    return spent / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="trio", choices=["trio", "asyncio"])
    args = parser.parse_args()
    figures: dict[str, list[float]] = {name: [] for name in ROUTES}
    with tempfile.TemporaryDirectory() as tmp:
        with tc.running_server(Path(tmp), "shell", args.backend) as server:
            for _ in range(args.rounds):
                for name, path in ROUTES.items():
                    cost = anyio.run(_measure, server.url, server.pid, path, args.requests)
                    figures[name].append(cost)
    base = statistics.median(figures[BASELINE])
    print(f"server CPU per request, median of {args.rounds} rounds of {args.requests}:")
    for name, costs in figures.items():
        cost = statistics.median(costs)
        print(f"  {name:24} {cost * 1e6:7.0f} us   x{cost / base:.2f} of the heartbeat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
