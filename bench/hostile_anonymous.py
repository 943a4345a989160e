"""One anonymous flooder against one polite anonymous client, black-box.

Against a running ``hordelite serve`` (default configuration, no worker):
the flooder sends anonymous text requests (key ``0000000000``) as fast as
``--flooders`` connections allow, from one loopback address; the polite
client sends one every ``--every`` seconds from another loopback address
(Linux answers every 127.0.0.0/8 address on the loopback). With the
anonymous user's budgets shared by every client, the flooder's 60 requests
a minute (then its 100 held, its 100 in flight) lock the polite client
out; counted per client address, the polite client is accepted.

``--proxied`` sends both from 127.0.0.1 with ``X-Forwarded-For`` naming
each client, for a horde started with ``server.trusted_proxies =
"127.0.0.1"`` (a proxy on the same machine).

    hordelite serve --port 7150 --database sqlite:////tmp/a/h.db &
    .venv/bin/python bench/hostile_anonymous.py --url http://127.0.0.1:7150

prints the flooder's answers by status, the polite client's, and the
server's CPU when ``--pid`` names it.
"""

from __future__ import annotations

import argparse
import collections
import time

import anyio
import httpx

ANONYMOUS = "0000000000"
BODY = {"prompt": "Hello", "params": {"max_length": 16}, "models": ["any"]}
FLOODER, POLITE = "127.0.0.2", "127.0.0.3"


def _client(url: str, address: str, proxied: bool) -> httpx.AsyncClient:
    headers = {"apikey": ANONYMOUS, "Client-Agent": "hostile_anonymous:1:bench"}
    if proxied:
        headers["X-Forwarded-For"] = f"203.0.113.7, {address}"
        address = "127.0.0.1"
    transport = httpx.AsyncHTTPTransport(local_address=address)
    return httpx.AsyncClient(base_url=url, headers=headers, transport=transport, timeout=30)


async def _flood(client: httpx.AsyncClient, until: float, seen: collections.Counter[str]) -> None:
    while time.monotonic() < until:
        answer = await client.post("/api/v2/generate/text/async", json=BODY)
        seen[f"{answer.status_code} {answer.json().get('rc', '')}".strip()] += 1


async def _polite(
    client: httpx.AsyncClient, until: float, every: float, seen: collections.Counter[str]
) -> None:
    while time.monotonic() < until:
        answer = await client.post("/api/v2/generate/text/async", json=BODY)
        seen[f"{answer.status_code} {answer.json().get('rc', '')}".strip()] += 1
        await anyio.sleep(every)


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:7150")
    parser.add_argument("--duration", type=float, default=90.0)
    parser.add_argument("--flooders", type=int, default=4, help="the flooder's connections")
    parser.add_argument("--every", type=float, default=3.0, help="the polite client's pause")
    parser.add_argument("--proxied", action="store_true")
    parser.add_argument("--pid", type=int, default=0, help="the server's, for its CPU")
    args = parser.parse_args()
    flood: collections.Counter[str] = collections.Counter()
    polite: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    until = started + args.duration
    cpu = _cpu(args.pid) if args.pid else 0.0
    async with (
        _client(args.url, FLOODER, args.proxied) as flooder,
        _client(args.url, POLITE, args.proxied) as nice,
        anyio.create_task_group() as tg,
    ):
        for _ in range(args.flooders):
            tg.start_soon(_flood, flooder, until, flood)
        tg.start_soon(_polite, nice, until, args.every, polite)
    elapsed = time.monotonic() - started
    print(f"{elapsed:.0f} s, flooder {sum(flood.values())} requests: {dict(flood)}")
    accepted = polite.get("202", 0)
    print(f"polite client: {accepted} of {sum(polite.values())} accepted: {dict(polite)}")
    if args.pid:
        print(f"server CPU: {(_cpu(args.pid) - cpu) / elapsed:.2f} cores")


if __name__ == "__main__":
    anyio.run(main)
