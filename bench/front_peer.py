"""The front against its peer, the LiteLLM proxy, side by side, on
``/v1/chat/completions``, ``/v1/responses`` and ``/v1/messages``.

Both stand in front of the same fake OpenAI backend (hordelite's
``fake_backend``, in a child process of its own, whose CPU counts for
neither), which serves chat completions only:

- LiteLLM: client -> ``litellm`` proxy (one uvicorn worker) -> backend;
  a Responses or Messages call translated into a chat completion
  (``use_chat_completions_api``, ``use_chat_completions_url_for_anthropic_messages``:
  for an ``openai/`` model LiteLLM would otherwise call the backend's
  ``/v1/responses``);
- hordelite: client -> ``hordelite serve``'s ``/v1`` -> queue ->
  ``hordelite worker --threads 16`` -> backend -> worker -> submit -> the
  call's answer.

The same lean keep-alive client (this process) measures each, and the
backend's own chat completions first, so that what each adds is read off
its own figures; on each route of ``--routes`` (default all three):

(a) p50 of a non-streamed call at concurrency 1, and what it adds to the
    backend's own p50;
(b) p50 of the first token of text of a streamed call at concurrency 1 (a
    chat chunk with content; the first ``response.output_text.delta``; the
    first ``content_block_delta`` of type ``text_delta``), and what it adds
    to the backend's first content chunk;
(c) calls per second at concurrency ``--concurrency`` (16) for
    ``--duration`` seconds;
(d) CPU per call during (c): the CPU of every process of the proxy (the
    litellm process tree; ``hordelite serve`` and ``hordelite worker``
    together) over the calls.

The two take turns, ``--rounds`` times (LiteLLM first, then hordelite,
then the other way round), each on a fresh process that serves every
route, so that a change in the machine's load falls on both; each figure is
printed per round with the ratio hordelite / LiteLLM of that round, then
the medians. Targets (issues 22 and 38), on each route: hordelite's added
p50 and CPU per call no more than LiteLLM's; its added first token at most
50 ms. The exit status is 1 when one is missed.

LiteLLM is not a dependency of hordelite: it is run from its own
interpreter, ``--litellm`` or ``$HORDELITE_BENCH_LITELLM`` (the ``litellm``
executable of a virtual environment with ``litellm[proxy]``), by default
``~/.cache/hordelite/litellm-venv/bin/litellm``. Without one, the script
says "not installed" and measures hordelite and the backend alone.

    python3 -m venv ~/.cache/hordelite/litellm-venv
    ~/.cache/hordelite/litellm-venv/bin/pip install 'litellm[proxy]==1.108.7'
    .venv/bin/python bench/front_peer.py                 # about 3 minutes a route
    .venv/bin/python bench/front_peer.py --rounds 2 --calls 100 --duration 5
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
from _common import (  # bench/ is on sys.path
    never_refusing_budgets,
    process_cpu,
    process_tree,
    speed_unjudged,
    stop_process,
)

MODEL = "fake-model"
PROMPT = "Name a colour."
LITELLM_KEY = "sk-hordelite-bench-0123456789abcdef"
DEFAULT_LITELLM = Path.home() / ".cache/hordelite/litellm-venv/bin/litellm"
SERVE_BACKEND = "--serve-backend"  # argv[1]: run the fake backend (a child of this script)


# The routes ------------------------------------------------------------------


def _chat_text(answer: dict[str, Any]) -> str:
    return str(answer["choices"][0]["message"]["content"])


def _chat_first(event: dict[str, Any]) -> bool:
    choices = event.get("choices")
    return bool(choices and choices[0].get("delta", {}).get("content"))


def _responses_text(answer: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in answer["output"]
        if item.get("type") == "message"
        for part in item["content"]
    )


def _responses_first(event: dict[str, Any]) -> bool:
    return event.get("type") == "response.output_text.delta" and bool(event.get("delta"))


def _messages_text(answer: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in answer["content"])


def _messages_first(event: dict[str, Any]) -> bool:
    delta = event.get("delta") or {}
    return (
        event.get("type") == "content_block_delta"
        and delta.get("type") == "text_delta"
        and bool(delta.get("text"))
    )


@dataclasses.dataclass(frozen=True)
class Route:
    """One front route: its path, a call's body, the text of a whole
    answer, and which streamed event carries the first token of text."""

    path: str
    body: dict[str, Any]
    text: Callable[[dict[str, Any]], str]
    first_token: Callable[[dict[str, Any]], bool]
    headers: str = ""


ROUTES = {
    "chat": Route(
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]},
        _chat_text,
        _chat_first,
    ),
    "responses": Route(
        "/v1/responses", {"model": MODEL, "input": PROMPT}, _responses_text, _responses_first
    ),
    "messages": Route(
        "/v1/messages",
        # max_tokens is required here; the fake's reply is a few tokens long.
        {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": PROMPT}]},
        _messages_text,
        _messages_first,
        "anthropic-version: 2023-06-01\r\n",
    ),
}
CHAT = ROUTES["chat"]


# The client ------------------------------------------------------------------


class Client:
    """One keep-alive HTTP/1.1 connection, one call at a time to one route:
    whole, or streamed (the first token of text timed)."""

    def __init__(self, url: str, key: str, route: Route) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._key = key
        self._route = route
        self._stream: anyio.abc.SocketStream | None = None
        self._buffer = b""

    async def _send(self, body: dict[str, Any]) -> None:
        if self._stream is None:
            self._stream = await anyio.connect_tcp(self._host, self._port)
            self._buffer = b""
        payload = json.dumps(body, separators=(",", ":")).encode()
        head = (
            f"POST {self._route.path} HTTP/1.1\r\nhost: {self._host}:{self._port}\r\n"
            f"authorization: Bearer {self._key}\r\ncontent-type: application/json\r\n"
            f"{self._route.headers}content-length: {len(payload)}\r\n\r\n"
        )
        await self._stream.send(head.encode() + payload)

    async def _more(self) -> None:
        assert self._stream is not None
        data = await self._stream.receive(65536)
        if not data:
            raise ConnectionError("closed")
        self._buffer += data

    async def _head(self) -> dict[str, str]:
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            await self._more()
        lines = self._buffer[:end].decode("latin-1").split("\r\n")
        self._buffer = self._buffer[end + 4 :]
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        if status != 200:
            with contextlib.suppress(OSError, ConnectionError, anyio.EndOfStream):
                while len(self._buffer) < int(headers.get("content-length", 300)):
                    await self._more()
            raise RuntimeError(f"HTTP {status}: {headers} {self._buffer[:300]!r}")
        return headers

    async def whole(self) -> str:
        """A non-streamed call; the text of its answer."""
        await self._send(self._route.body)
        headers = await self._head()
        if "content-length" in headers:
            length = int(headers["content-length"])
            while len(self._buffer) < length:
                await self._more()
            data, self._buffer = self._buffer[:length], self._buffer[length:]
        else:
            data = await self._chunked()
        if headers.get("connection", "").lower() == "close":
            await self.aclose()
        text = self._route.text(json.loads(data))
        if not text:
            raise RuntimeError(f"an answer without text: {data[:300]!r}")
        return text

    async def streamed(self) -> float:
        """A streamed call read to the end of its body; seconds from sending
        to the first event carrying a token of text."""
        sent = time.perf_counter()
        await self._send({**self._route.body, "stream": True})
        headers = await self._head()
        if "chunked" not in headers.get("transfer-encoding", ""):
            raise RuntimeError(f"a stream not chunked: {headers}")
        first = 0.0
        text = b""
        while piece := await self._chunk():
            text += piece
            while b"\n\n" in text:
                event, text = text.split(b"\n\n", 1)
                data = event.partition(b"data: ")[2]
                if first or not data or data == b"[DONE]":
                    continue
                if self._route.first_token(json.loads(data)):
                    first = time.perf_counter() - sent
        if not first:
            raise RuntimeError("a stream without text")
        return first

    async def _chunk(self) -> bytes:
        while (end := self._buffer.find(b"\r\n")) < 0:
            await self._more()
        size = int(self._buffer[:end].split(b";")[0], 16)
        while len(self._buffer) < end + 2 + size + 2:
            await self._more()
        data = self._buffer[end + 2 : end + 2 + size]
        self._buffer = self._buffer[end + 2 + size + 2 :]
        return data

    async def _chunked(self) -> bytes:
        body = b""
        while data := await self._chunk():
            body += data
        return body

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()


# The figures of one proxy -------------------------------------------------------


async def latencies(url: str, key: str, route: Route, calls: int, streamed: bool) -> list[float]:
    """Seconds per call at concurrency 1 (first token when ``streamed``),
    after a tenth as many untimed."""
    client = Client(url, key, route)
    try:
        for _ in range(max(calls // 10, 5)):
            await (client.streamed() if streamed else client.whole())
        out = []
        for _ in range(calls):
            if streamed:
                out.append(await client.streamed())
            else:
                started = time.perf_counter()
                await client.whole()
                out.append(time.perf_counter() - started)
        return out
    finally:
        await client.aclose()


async def throughput(url: str, key: str, route: Route, concurrency: int, seconds: float) -> int:
    """Calls answered by ``concurrency`` clients in ``seconds``."""
    done = 0
    clients = [Client(url, key, route) for _ in range(concurrency)]
    deadline = time.perf_counter() + seconds

    async def one(client: Client) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await client.whole()
            if time.perf_counter() <= deadline:
                done += 1

    try:
        async with anyio.create_task_group() as tg:
            for client in clients:
                tg.start_soon(one, client)
    finally:
        for client in clients:
            await client.aclose()
    return done


def cpu_of(pids: list[int]) -> float:
    """CPU seconds of these processes and every process they started."""
    total = 0.0
    for root in pids:
        for pid in process_tree(root):
            with contextlib.suppress(OSError, IndexError):
                total += process_cpu(pid)
    return total


def measure(
    url: str, key: str, route: Route, pids: list[int], args: argparse.Namespace
) -> dict[str, float]:
    whole = anyio.run(latencies, url, key, route, args.calls, False)
    first = anyio.run(latencies, url, key, route, args.calls, True)
    before = [cpu_of([pid]) for pid in pids]
    done = anyio.run(throughput, url, key, route, args.concurrency, args.duration)
    spent = [cpu_of([pid]) - b for pid, b in zip(pids, before, strict=True)]
    figures = {
        "p50_ms": statistics.median(whole) * 1000,
        "first_token_p50_ms": statistics.median(first) * 1000,
        "per_s": done / args.duration,
        "cpu_ms_per_call": sum(spent) / max(done, 1) * 1000,
    }
    if len(pids) > 1:  # hordelite: the server's share, then the worker's
        figures["serve_cpu_ms_per_call"] = spent[0] / max(done, 1) * 1000
        figures["worker_cpu_ms_per_call"] = spent[1] / max(done, 1) * 1000
    return figures


# The processes ------------------------------------------------------------------


def _served_line(proc: subprocess.Popen[str], marker: str, log: Path) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if marker in line:
            return line
    raise RuntimeError(f"exited before {marker!r}:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def child(command: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[Any]:
    with log.open("w") as err:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=err, text=True, env=env, start_new_session=True
        )
        try:
            yield proc
        finally:
            for pid in reversed(process_tree(proc.pid)[1:]):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
            stop_process(proc, 20)


@contextlib.contextmanager
def backend(workdir: Path) -> Iterator[tuple[str, int]]:
    """The fake backend in a child process: its URL and pid."""
    command = [sys.executable, __file__, SERVE_BACKEND]
    with child(command, workdir / "backend.log") as proc:
        url = _served_line(proc, "backend at", workdir / "backend.log").split()[-1]
        yield url, proc.pid


def serve_backend() -> None:
    """(In the child.) Serve the fake backend until SIGTERM."""
    from hordelite.worker.fake_backend import FakeBackendConfig, open_fake_backend

    async def main() -> None:
        async with open_fake_backend(FakeBackendConfig(model=MODEL, context=8192)) as fake:
            print("backend at", fake.url, flush=True)
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    return

    anyio.run(main, backend="trio")


async def _wait_for_model(url: str, key: str, within: float) -> None:
    """Until ``GET url/v1/models`` lists MODEL (the proxy is up and routes it)."""
    deadline = time.perf_counter() + within
    parts = urlsplit(url)
    request = (
        f"GET /v1/models HTTP/1.1\r\nhost: {parts.netloc}\r\nauthorization: Bearer {key}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    while time.perf_counter() < deadline:
        with contextlib.suppress(OSError):
            async with await anyio.connect_tcp(parts.hostname or "", parts.port or 80) as s:
                await s.send(request)
                data = b""
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                    while True:
                        data += await s.receive()
                if f'"{MODEL}"'.encode() in data:
                    return
        await anyio.sleep(0.2)
    raise RuntimeError(f"{url} never listed {MODEL}")


@contextlib.contextmanager
def litellm(executable: str, backend_url: str, workdir: Path) -> Iterator[tuple[str, list[int]]]:
    port = _free_port()
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {backend_url}/v1\n"
        "      api_key: none\n"
        # An openai/ model is sent /v1/responses as a Responses call, and
        # /v1/messages as one too; the backend serves chat completions only,
        # as hordelite's workers call it: both routes are translated into a
        # chat completion, as hordelite translates them.
        "      use_chat_completions_api: true\n"
        "litellm_settings:\n"
        "  use_chat_completions_url_for_anthropic_messages: true\n"
    )
    env = {
        **os.environ,
        # No call home, no download of the model price list at start.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        # LiteLLM refuses to start without a master key; calls then present
        # it, as hordelite's present a user's key.
        "LITELLM_MASTER_KEY": LITELLM_KEY,
    }
    command = [executable, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--num_workers", "1"]
    with child(command, workdir / "litellm.log", env) as proc:
        url = f"http://127.0.0.1:{port}"
        anyio.run(_wait_for_model, url, LITELLM_KEY, 120.0)
        yield url, [proc.pid]


@contextlib.contextmanager
def hordelite(
    backend_url: str, workdir: Path, threads: int
) -> Iterator[tuple[str, str, list[int]]]:
    from hordelite.cli import main as hordelite_cli

    config = workdir / "horde.toml"
    database = workdir / f"horde-{time.monotonic_ns()}.db"
    # Budgets that never refuse (one requester key stands for every client), yet are checked.
    budgets = "".join(f"{k} = {v}\n" for k, v in never_refusing_budgets().items())
    moderation = "".join(f"{k} = {v}\n" for k, v in speed_unjudged().items())
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = 0\n[storage]\ndatabase = "{database}"\n'
        f'[blobs]\ndirectory = "{workdir / "blobs"}"\n[budgets]\n{budgets}'
        f"[moderation]\n{moderation}"
    )
    serve = [sys.executable, "-m", "hordelite", "--config", str(config), "serve"]
    with child(serve, workdir / "serve.log") as server:
        url = _served_line(server, " serving at ", workdir / "serve.log").split(" serving at ")[1]
        url = url.split()[0]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = hordelite_cli(["--config", str(config), "keys", "create", "bench"])
            code = code or hordelite_cli(
                ["--config", str(config), "keys", "create", "requester", "--kudos", "1e9"]
            )
        keys = [
            ln.rsplit(":", 1)[1].strip() for ln in out.getvalue().splitlines() if "API key" in ln
        ]
        if code or len(keys) != 2:
            raise RuntimeError(f"keys create failed: {out.getvalue()}")
        worker = [sys.executable, "-m", "hordelite", "worker", "--horde", url, "--name", "peer"]
        worker += ["--backend", backend_url, "--threads", str(threads)]
        env = {**os.environ, "HORDELITE_WORKER_KEY": keys[0]}
        with child(worker, workdir / "worker.log", env) as work:
            anyio.run(_wait_for_model, url, keys[1], 60.0)
            yield url, keys[1], [server.pid, work.pid]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The report ---------------------------------------------------------------------

FIGURES = (
    ("p50_ms", "p50 at c=1, ms"),
    ("added_ms", "added p50 at c=1, ms"),
    ("first_token_p50_ms", "streamed first token p50, ms"),
    ("added_first_token_ms", "streamed first token, added, ms"),
    ("per_s", "calls/s at c={c}"),
    ("cpu_ms_per_call", "CPU per call, ms (at c={c})"),
    ("serve_cpu_ms_per_call", "  of which hordelite serve"),
    ("worker_cpu_ms_per_call", "  of which hordelite worker"),
)
# Issue 38: what hordelite may add to the backend's own time to the first
# token of a stream, on every streamed route.
TARGET_ADDED_FIRST_TOKEN_MS = 50.0

# One round: route -> kind ("backend", "litellm", "hordelite") -> figures.
Round = dict[str, dict[str, dict[str, float]]]


def with_added(figures: dict[str, float], direct: dict[str, float]) -> dict[str, float]:
    return {
        **figures,
        "added_ms": figures["p50_ms"] - direct["p50_ms"],
        "added_first_token_ms": figures["first_token_p50_ms"] - direct["first_token_p50_ms"],
    }


def print_table(route: str, rounds: list[Round], args: argparse.Namespace) -> None:
    """One route's figures, each round's and their medians, with the ratio
    hordelite / LiteLLM of each."""
    series = [r[route] for r in rounds]
    kinds = [k for k in ("backend", "litellm", "hordelite") if k in series[0]]
    header = f"{'figure':36}" + "".join(f"{k:>14}" for k in kinds)
    if "litellm" in kinds:
        header += f"{'hordelite/litellm':>20}"
    for i, figures in enumerate([*series, None]):
        label = "median" if figures is None else f"round {i + 1}"
        print(f"{ROUTES[route].path}, {label}\n{header}")
        for key, name in FIGURES:
            values: list[float | None] = []
            for kind in kinds:
                got = [r[kind][key] for r in series if key in r[kind]]
                if figures is not None:
                    values.append(figures[kind].get(key))
                else:
                    values.append(statistics.median(got) if got else None)
            row = f"{name.format(c=args.concurrency):36}" + "".join(
                f"{v:14.2f}" if v is not None else f"{'-':>14}" for v in values
            )
            if "litellm" in kinds and values[1] and values[2] is not None:
                row += f"{values[2] / values[1]:20.2f}"
            print(row)
        print()


def check_targets(route: str, rounds: list[Round]) -> bool:
    """Print the route's targets against the medians; whether all were met."""

    def median(kind: str, key: str) -> float:
        return statistics.median(r[route][kind][key] for r in rounds)

    checks = []
    if "litellm" in rounds[0][route]:
        checks += [
            (f"{key} <= LiteLLM's", median("hordelite", key), median("litellm", key))
            for key in ("added_ms", "cpu_ms_per_call")
        ]
    added = median("hordelite", "added_first_token_ms")
    checks.append(("added_first_token_ms <=", added, TARGET_ADDED_FIRST_TOKEN_MS))
    met = True
    for name, got, bound in checks:
        ok = got <= bound
        met &= ok
        print(
            f"target, {ROUTES[route].path}: hordelite {name} {bound:.2f} ms: {got:.2f}: "
            f"{'PASS' if ok else 'MISS'}"
        )
    return met


def run_rounds(executable: str | None, args: argparse.Namespace) -> list[Round]:
    """The backend alone, then each proxy in turn on a fresh process (the
    order flipping each round), every route measured on each."""
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="hordelite-peer-") as tmp:
        workdir = Path(tmp)
        with backend(workdir) as (backend_url, _):
            for i in range(args.rounds):
                progress(f"round {i + 1}: the backend alone")
                direct = measure(backend_url, "none", CHAT, [], args)
                figures: Round = {route: {"backend": direct} for route in args.routes}
                order = ["litellm", "hordelite"] if i % 2 == 0 else ["hordelite", "litellm"]
                for kind in order:
                    if kind == "litellm" and executable is None:
                        continue
                    with contextlib.ExitStack() as stack:
                        if kind == "litellm":
                            assert executable is not None
                            url, pids = stack.enter_context(
                                litellm(executable, backend_url, workdir)
                            )
                            key = LITELLM_KEY
                        else:
                            url, key, pids = stack.enter_context(
                                hordelite(backend_url, workdir, args.threads)
                            )
                        for route in args.routes:
                            progress(f"round {i + 1}: {kind} {ROUTES[route].path}")
                            got = measure(url, key, ROUTES[route], pids, args)
                            figures[route][kind] = with_added(got, direct)
                rounds.append(figures)
    return rounds


def progress(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


def routes_of(text: str) -> list[str]:
    routes = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in routes if r not in ROUTES]
    if unknown or not routes:
        raise argparse.ArgumentTypeError(f"routes are any of {', '.join(ROUTES)}: {text!r}")
    return routes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--litellm", default=os.environ.get("HORDELITE_BENCH_LITELLM"))
    p.add_argument(
        "--routes",
        type=routes_of,
        default=list(ROUTES),
        help=f"comma-separated, any of {', '.join(ROUTES)} (default all)",
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--calls", type=int, default=200, help="timed calls at c=1 (default 200)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=10.0, help="seconds of (c) (default 10)")
    p.add_argument("--threads", type=int, default=16, help="hordelite worker --threads")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    executable = args.litellm or (str(DEFAULT_LITELLM) if DEFAULT_LITELLM.exists() else None)
    if executable and not shutil.which(executable):
        executable = None
    if executable is None:
        print("LiteLLM: not installed (see --help); measuring hordelite alone")
    rounds = run_rounds(executable, args)
    print()
    met = True
    for route in args.routes:
        print_table(route, rounds, args)
    for route in args.routes:
        met &= check_targets(route, rounds)
    print("command:", " ".join(["python", *sys.argv]))
    if args.json:
        args.json.write_text(json.dumps(rounds, indent=2))
    return 0 if met else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == SERVE_BACKEND:
        serve_backend()
    else:
        sys.exit(main())
