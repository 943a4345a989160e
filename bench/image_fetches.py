"""A chat submit naming six images by URL, each answered 2 s after it is
asked for: the submit's time, this tree against another in the same run.

An in-process horde (``open_horde``, SQLite, trio, ``images.fetch_private``
on) with a vision worker online, and a loopback image server of the
script's own whose every answer waits ``--delay`` seconds. Fetched one after
another the six cost the sum of their hosts' times; taken in together
(decision 0042), about one image's time.

    .venv/bin/python bench/image_fetches.py --against ../base

prints each submit's seconds per tree and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = 6


async def submits(delay: float, rounds: int) -> list[float]:
    """Seconds of ``rounds`` submits of six slow images, in this process."""
    import anyio
    import anyio.abc
    import httpx
    from PIL import Image

    from hordelite.config import Config
    from hordelite.testing import FakeChatWorker, open_horde

    buffer = io.BytesIO()
    Image.new("RGB", (640, 480), (200, 30, 30)).save(buffer, "PNG")
    png = buffer.getvalue()
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n"
        f"Content-Length: {len(png)}\r\nConnection: close\r\n\r\n"
    ).encode()

    async def slow(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            received = b""
            while b"\r\n\r\n" not in received:
                received += await stream.receive()
            await anyio.sleep(delay)  # the slow host
            await stream.send(head + png)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    config = Config().replace(images={"fetch_private": True})
    times = []
    async with listener, anyio.create_task_group() as tg, open_horde(config=config) as horde:
        tg.start_soon(listener.serve, slow)
        key = await horde.create_key("alice", kudos=1000)
        owner = await horde.create_key("bob")
        async with (
            FakeChatWorker(
                horde.url,
                owner,
                model_id="m",
                chat_features=("vision",),
                image_transports=("url",),
            ) as worker,
            httpx.AsyncClient(base_url=horde.url, verify=False, timeout=120) as http,
        ):
            await worker.pop()
            parts = [
                {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{port}/{n}.png"}}
                for n in range(IMAGES)
            ]
            body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": parts}]}
            for _ in range(rounds):
                start = time.perf_counter()
                r = await http.post(
                    "/api/v2/generate/chat/async", headers={"apikey": key}, json=body
                )
                times.append(time.perf_counter() - start)
                assert r.status_code == 202, r.text
        tg.cancel_scope.cancel()
    return times


def run_tree(tree: Path, delay: float, rounds: int) -> list[float]:
    """This script's child on ``tree`` (its own working directory and
    ``PYTHONPATH``): the seconds of each submit."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--delay", str(delay), "--rounds", str(rounds)],
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, help="another hordelite checkout, the baseline")
    parser.add_argument("--delay", type=float, default=2.0, help="seconds each image takes")
    parser.add_argument("--rounds", type=int, default=3, help="submits per tree")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import anyio

        print(json.dumps(anyio.run(submits, args.delay, args.rounds, backend="trio")))
        return 0
    trees = [("this", ROOT)] + ([("against", args.against.resolve())] if args.against else [])
    medians = {}
    for name, tree in trees:
        times = run_tree(tree, args.delay, args.rounds)
        medians[name] = statistics.median(times)
        shown = ", ".join(f"{t:.2f}" for t in times)
        print(f"{name:8} six images of {args.delay:g} s each: submits took {shown} s")
    if args.against:
        print(f"ratio this / against (medians): {medians['this'] / medians['against']:.2f}")
    print("command: python bench/image_fetches.py " + " ".join(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
