"""What the reference worker's fit check costs a chat job: backend calls, and
CPU in the worker and in the backend, for this tree and a baseline tree.

Each variant is a ``hordelite worker`` child process run from its tree's
sources (``PYTHONPATH``) against a fake llama.cpp-like backend in a child
process of its own (this tree's ``hordelite.testing`` fake: ``/props``,
``/apply-template``, ``/tokenize``, chat), so that the CPU of each is read
apart from /proc; the horde runs in this process (``open_horde``, SQLite),
which also queues the jobs and polls their status. A variant's round:

1. start the fake backend and the worker; wait until the worker is listed
   (its declaration and start probes are then done, outside the figures);
2. read both processes' CPU and the backend's requests by route;
3. queue ``--jobs`` (200) chat jobs at once, a conversation far under the
   context (a system prompt and five turns, 700 bytes of JSON, ``max_tokens`` 32),
   and wait until every one is done;
4. read them again; stop both.

With ``--llama-server BIN``, the backend is a real llama-server instead
(built by ``tests/llamacpp/build_llama_server.py``) running the test tier's
tiny generated model with a context of 2048 tokens, one slot and one thread;
the worker reaches it through the tier's recording relay, which counts the
routes it calls. Its CPU then includes the generation of each reply
(``max_tokens`` 4 there), which the fit check does not change.

Figures per variant, summed over its rounds: the worker's CPU per job, the
backend's CPU per job (milliseconds, user + system) and backend calls per job
(by route); then the ratio this tree / baseline of each, from the same run.
Variants alternate, baseline first, ``--rounds`` (2) times each, so that other
load on the machine falls on both.

    git worktree add --detach ../wt-base 9bf170a     # the baseline's sources
    .venv/bin/python bench/worker_calls.py --base ../wt-base      # about a minute
    .venv/bin/python bench/worker_calls.py --base ../wt-base --jobs 100 --rounds 1
    .venv/bin/python bench/worker_calls.py --base ../wt-base \
        --llama-server "$(python3 tests/llamacpp/build_llama_server.py)"

Measured figures: docs/performance.md ("Worker backend calls per job").
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
from _common import process_cpu, stop_process  # bench/ is the script's folder, so on sys.path

from hordelite.testing import open_horde

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.llamacpp._relay import open_relay  # noqa: E402
from tests.llamacpp.tiny_model import write_tiny_model  # noqa: E402

# The real backend's context: the bench's conversation far under it.
LLAMA_CONTEXT = 2048
CONVERSATION = [
    {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
    {"role": "user", "content": "What is the capital of France, and what river runs through it?"},
    {"role": "assistant", "content": "Paris, on the Seine, which flows on to Le Havre."},
    {"role": "user", "content": "Name three bridges over that river in the city, please. " * 4},
    {"role": "assistant", "content": "Pont Neuf, Pont Alexandre III and Pont des Arts."},
    {"role": "user", "content": "Which of them is the oldest? Answer briefly, in English."},
]
# The fake backend, in a child: prints its URL, then its requests by route
# for each line read on stdin.
FAKE = """
import collections, json, sys
import anyio, anyio.to_thread
from hordelite.testing import open_fake_backend

async def main():
    async with open_fake_backend() as fake:
        print(fake.url, flush=True)
        while await anyio.to_thread.run_sync(sys.stdin.readline):
            print(json.dumps(collections.Counter(r["path"] for r in fake.requests)), flush=True)

anyio.run(main, backend="trio")
"""


@dataclasses.dataclass
class Totals:
    jobs: int = 0
    worker_cpu: float = 0.0
    backend_cpu: float = 0.0
    calls: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def per_job(self) -> dict[str, Any]:
        return {
            "worker_cpu_ms": self.worker_cpu / self.jobs * 1000,
            "backend_cpu_ms": self.backend_cpu / self.jobs * 1000,
            "calls": sum(self.calls.values()) / self.jobs,
            "routes": {path: n / self.jobs for path, n in sorted(self.calls.items())},
        }


@contextlib.contextmanager
def child(args: list[str], source: Path, **kwargs: Any) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": str(source)}
    process = subprocess.Popen([sys.executable, *args], env=env, text=True, cwd=source, **kwargs)
    try:
        yield process
    finally:
        stop_process(process, 15)


async def listed(client: httpx.AsyncClient, name: str) -> None:
    with anyio.fail_after(60):
        while True:
            if (await client.get(f"/api/v2/workers/name/{name}")).status_code == 200:
                return
            await anyio.sleep(0.05)


class Backend:
    """The backend of a round: its process (for its CPU), its URL, and its
    requests by route so far."""

    def __init__(self, process: subprocess.Popen[Any], url: str, model: str) -> None:
        self.process = process
        self.url = url
        self.model = model

    async def calls(self) -> collections.Counter[str]:
        """The fake's requests by route (FAKE prints them for each line it reads)."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        line = await anyio.to_thread.run_sync(self.process.stdout.readline)
        return collections.Counter(json.loads(line))


class LlamaBackend(Backend):
    def __init__(self, process: subprocess.Popen[Any], url: str, relay: Any) -> None:
        super().__init__(process, relay.url, "tiny-llama")
        self.relay = relay

    async def calls(self) -> collections.Counter[str]:
        return collections.Counter(self.relay.paths("POST"))


@contextlib.asynccontextmanager
async def fake_backend() -> AsyncIterator[Backend]:
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    with child(["-c", FAKE], ROOT, **pipes) as fake:
        assert fake.stdout is not None
        url = (await anyio.to_thread.run_sync(fake.stdout.readline)).strip()
        yield Backend(fake, url, "fake-model")


@contextlib.contextmanager
def llama_process(binary: str, model: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    command = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--ctx-size", str(LLAMA_CONTEXT), "-np", "1", "--threads", "1"]
    command += ["--jinja", "--no-webui"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        stop_process(process, 15)


@contextlib.asynccontextmanager
async def llama_backend(binary: str, model: Path) -> AsyncIterator[Backend]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with llama_process(binary, model, port) as process:
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=url, timeout=1) as client:
            with anyio.fail_after(60):
                while True:
                    assert process.poll() is None, "llama-server exited"
                    try:
                        if (await client.get("/health")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await anyio.sleep(0.05)
        async with open_relay(port) as relay:
            yield LlamaBackend(process, url, relay)


async def round_(
    variant: str,
    source: Path,
    horde_url: str,
    keys: tuple[str, str],
    n: int,
    args: argparse.Namespace,
) -> Totals:
    requester, owner = keys
    name = f"bench-{variant}-{n}"
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=horde_url, timeout=30))
        if args.llama_server:
            backend = await stack.enter_async_context(llama_backend(args.llama_server, args.model))
        else:
            backend = await stack.enter_async_context(fake_backend())
        worker_args = ["-m", "hordelite", "worker", "--horde", horde_url, "--key", owner]
        worker_args += ["--name", name, "--backend", backend.url, "--wait", "5"]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        with child(worker_args, source, **quiet) as worker:
            await listed(client, name)
            calls = await backend.calls()
            cpu = process_cpu(worker.pid), process_cpu(backend.process.pid)
            ids = []
            body = {
                "model": backend.model,
                "messages": CONVERSATION,
                "max_tokens": 4 if args.llama_server else 32,
            }
            for _ in range(args.jobs):
                r = await client.post(
                    "/api/v2/generate/chat/async", headers={"apikey": requester}, json=body
                )
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
            for request_id in ids:
                path = f"/api/v2/generate/chat/status/{request_id}"
                while True:
                    status = (await client.get(path)).json()
                    if status["faulted"]:
                        raise RuntimeError(f"{variant}: a job faulted: {status}")
                    if status["done"]:
                        break
                    await anyio.sleep(0.05)
            worker_cpu = process_cpu(worker.pid) - cpu[0]
            backend_cpu = process_cpu(backend.process.pid) - cpu[1]
            after = await backend.calls()
    return Totals(args.jobs, worker_cpu, backend_cpu, after - calls)


async def measure(args: argparse.Namespace, base: Path) -> dict[str, Totals]:
    totals = {"baseline": Totals(), "this tree": Totals()}
    sources = {"baseline": base, "this tree": ROOT}
    # No limit on generations in flight: every job is queued at once.
    async with open_horde(concurrency=0) as horde:
        keys = (
            await horde.create_key("bench-requester", kudos=10_000_000),
            await horde.create_key("bench-worker"),
        )
        for n in range(args.rounds):
            for variant in ("baseline", "this tree"):
                got = await round_(
                    variant.replace(" ", "-"), sources[variant], horde.url, keys, n, args
                )
                total = totals[variant]
                total.jobs += got.jobs
                total.worker_cpu += got.worker_cpu
                total.backend_cpu += got.backend_cpu
                total.calls += got.calls
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the baseline tree (a git worktree)")
    parser.add_argument("--jobs", type=int, default=200, help="chat jobs a round (200)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each variant (2)")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument(
        "--llama-server", help="a llama-server binary: the backend, instead of the fake"
    )
    args = parser.parse_args(argv)
    if not (Path(args.base) / "hordelite" / "worker").is_dir():
        parser.error(f"--base {args.base} is not a hordelite tree")
    with tempfile.TemporaryDirectory() as folder:
        if args.llama_server:
            args.model = write_tiny_model(Path(folder) / "tiny-llama.gguf", context=LLAMA_CONTEXT)
        totals = anyio.run(measure, args, Path(args.base).resolve(), backend="trio")
    figures = {variant: total.per_job() for variant, total in totals.items()}
    base, new = figures["baseline"], figures["this tree"]
    print(f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores")
    against = "a real llama-server" if args.llama_server else "the fake backend"
    print(f"{args.rounds} rounds x {args.jobs} chat jobs a variant, {against}; per job:")
    print(f"{'':24}{'baseline':>12}{'this tree':>12}{'ratio':>8}")
    for key, label in (
        ("worker_cpu_ms", "worker CPU (ms)"),
        ("backend_cpu_ms", "backend CPU (ms)"),
        ("calls", "backend calls"),
    ):
        print(f"{label:24}{base[key]:12.2f}{new[key]:12.2f}{new[key] / base[key]:8.2f}")
    for variant, figure in figures.items():
        routes = ", ".join(f"{path} {n:.2f}" for path, n in figure["routes"].items())
        print(f"  {variant}: {routes}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
