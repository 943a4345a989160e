"""Helpers shared by the integration tests: client calls over real HTTP, polling
with a deadline, and the parts a test can cut (a Redis server, a database relay)."""

from __future__ import annotations

import contextlib
import inspect
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.abc
import httpx
import pytest
from sqlalchemy import event

from hordelite.testing import TestHorde


async def submit_text(
    client: httpx.AsyncClient,
    api_key: str,
    prompt: str,
    *,
    models: Sequence[str] = (),
    **params: Any,
) -> str:
    """Queue a text request; returns its id (fails the test on a refusal)."""
    body: dict[str, Any] = {"prompt": prompt, "params": params, "models": list(models)}
    response = await client.post(
        "/api/v2/generate/text/async", headers={"apikey": api_key}, json=body
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def text_status(client: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    response = await client.get(f"/api/v2/generate/text/status/{request_id}")
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def kudos_of(client: httpx.AsyncClient, api_key: str) -> float:
    response = await client.get("/api/v2/find_user", headers={"apikey": api_key})
    assert response.status_code == 200, response.text
    return float(response.json()["kudos"])


async def worker_id(client: httpx.AsyncClient, name: str) -> str:
    response = await client.get(f"/api/v2/workers/name/{name}")
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def worker_registered(client: httpx.AsyncClient, name: str) -> None:
    """Once the horde knows the worker (its first pop registers it)."""
    with anyio.fail_after(10):
        while True:
            if (await client.get(f"/api/v2/workers/name/{name}")).status_code == 200:
                return
            await anyio.sleep(0.01)


def assert_refused(
    response: httpx.Response, status: int, rc: str, *words: str, case: object = ""
) -> dict[str, Any]:
    """The response is the AI Horde error envelope with this status and
    return code, its message naming each of ``words``; returns its body.
    ``case`` names the case in a failure's report, where a test loops."""
    assert response.status_code == status, (case, response.text)
    body: dict[str, Any] = response.json()
    assert body["rc"] == rc, (case, body)
    assert isinstance(body["message"], str), (case, body)
    assert body["message"], (case, body)
    for word in words:
        assert word in body["message"], (case, body)
    return body


async def eventually(check: Callable[[], object], within: float = 10.0) -> None:
    """Until ``check()`` is truthy, polled with a deadline: fails after ``within``
    seconds. ``check`` may return an awaitable (an async check), which is
    awaited: its truth, not the coroutine's, is what counts."""
    with anyio.fail_after(within):
        while True:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            await anyio.sleep(0.01)


def serve_environment(*, suspect_speed: bool = False) -> dict[str, str]:
    """The environment of a ``hordelite serve`` (or ``worker``) subprocess:
    this one's without hordelite's configuration variables (the test's
    own, ``HORDELITE_TEST_*``, kept). Unless ``suspect_speed``, worker
    suspicion by speed is off, as ``open_horde`` has it: the fake workers
    answer in milliseconds and would be paused after five jobs."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HORDELITE_") or k.startswith("HORDELITE_TEST_")
    }
    if not suspect_speed:
        env["HORDELITE_MODERATION_SUSPICIOUS_TOKENS_PER_SECOND"] = "0"
    return env


def run_hordelite(*argv: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """One ``hordelite`` command run to its exit, as the operator types it
    (from ``cwd``, in ``serve_environment()``): its code and output."""
    return subprocess.run(
        [sys.executable, "-m", "hordelite", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=serve_environment(),
        timeout=timeout,
        check=False,
    )


class ServeProcess:
    """``hordelite serve --config CONFIG`` in a subprocess, run from the
    config's folder in ``serve_environment()``; constructed once its start
    banner is out (``banner``, and ``url``, where it serves).

    Its stdout is read line by line into ``lines`` (None at end of file) by
    ``reader``, the stream's only reader, joined before the stream is closed;
    its stderr goes to ``log`` (named ``log_name``, in the config's folder).
    ``close`` ends it (``stop``: SIGTERM, then SIGKILL past
    ``stop_deadline``) and closes the streams."""

    def __init__(
        self,
        config: Path,
        *,
        log_name: str = "serve.log",
        start_deadline: float = 30.0,
        stop_deadline: float = 10.0,
    ) -> None:
        self.start_deadline = start_deadline
        self.stop_deadline = stop_deadline
        self.log = config.parent / log_name
        self._stderr = self.log.open("w", encoding="utf-8")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hordelite", "--config", str(config), "serve"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=config.parent,
            env=serve_environment(),
        )
        assert self.process.stdout is not None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, args=(self.process.stdout,))
        self.reader.start()
        self.banner = self._banner()
        match = re.search(r"serving at (http://127\.0\.0\.1:\d+)", "\n".join(self.banner))
        assert match, self.banner
        self.url = match.group(1)

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _banner(self) -> list[str]:
        """Stdout up to and including the line telling how to create a key."""
        deadline = time.monotonic() + self.start_deadline
        banner: list[str] = []
        while not any("keys create" in line for line in banner):
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                pytest.fail(f"no start banner within {self.start_deadline} s: {banner}")
            if line is None:
                self.close()
                pytest.fail(f"serve exited before its banner: {banner} {self.log.read_text()}")
            banner.append(line)
        return banner

    def stop(self) -> None:
        """SIGTERM, then SIGKILL past the stop deadline."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.stop_deadline)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def close(self) -> None:
        """``stop``, then the streams closed."""
        self.stop()
        self.reader.join(timeout=self.stop_deadline)
        if self.process.stdout is not None and not self.reader.is_alive():
            self.process.stdout.close()
        self._stderr.close()


@contextlib.contextmanager
def statements(horde: TestHorde) -> Iterator[list[str]]:
    """The SQL statements the horde sends while the block runs, less the
    webhook round's look for calls due: it runs every WEBHOOK_POLL_SECONDS
    of real time whatever the test does (and at once after a request
    ends), so on a loaded machine it can land inside any block."""
    sent: list[str] = []
    db = horde.horde.db
    engines = {id(e): e for e in (db.engine, getattr(db, "_inline_engine", None)) if e}

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "requests.hook_due <=" not in statement:
            sent.append(statement)

    for engine in engines.values():
        event.listen(engine, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        for engine in engines.values():
            event.remove(engine, "before_cursor_execute", count)


class RedisServer:
    """A redis-server of the test's own, on a free port, that the test can
    kill, or stop (SIGSTOP: its connections stay open and nothing answers,
    as with a hung Redis or a partition) and continue."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no"),
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def cont(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        """Gone, stopped or not (a test's teardown calls it whatever it did)."""
        if self.process is not None:
            self.cont()  # a stopped process dies of SIGKILL too; continued, it exits at once
            self.process.kill()
            self.process.wait()
            self.process = None


def redis_info(url: str, section: str) -> dict[str, str]:
    """One section of the Redis server's INFO (its fields by name), read on
    a connection of its own with a blocking socket; the INFO itself counts
    as one command processed."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379)) as sock:
        sock.sendall(b"*2\r\n$4\r\nINFO\r\n$%d\r\n%s\r\n" % (len(section), section.encode()))
        data = b""
        while b"\r\n" not in data:
            data += sock.recv(65536)
        header, _, body = data.partition(b"\r\n")  # a bulk string: $<length>
        while len(body) < int(header[1:]):
            body += sock.recv(65536)
    fields = (line.partition(":") for line in body.decode().splitlines())
    return {name: value for name, sep, value in fields if sep and not name.startswith("#")}


class Relay:
    """A TCP relay to PostgreSQL that the test can cut: every connection
    through it is closed, and new ones are refused."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._scope = anyio.CancelScope()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        with self._scope:
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            task_status.started()
            async with listener:
                await listener.serve(self._relay)

    async def _relay(self, client: anyio.abc.SocketStream) -> None:
        async with client, await anyio.connect_tcp(*self.target) as server:

            async def pipe(a: anyio.abc.SocketStream, b: anyio.abc.SocketStream) -> None:
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                    while True:
                        await b.send(await a.receive())

            async with anyio.create_task_group() as tg:
                tg.start_soon(pipe, client, server)
                tg.start_soon(pipe, server, client)

    def cut(self) -> None:
        self._scope.cancel()


ServerT = TypeVar("ServerT")


@contextlib.asynccontextmanager
async def loopback_server(
    server_of: Callable[[int], ServerT],
    answer: Callable[[ServerT, anyio.abc.ByteStream], Awaitable[None]],
) -> AsyncIterator[ServerT]:
    """An HTTP server of the test's own on a free port of 127.0.0.1:
    ``server_of(port)`` is its state (its URLs, what it saw) and
    ``answer(server, stream)`` serves each connection, which is closed
    after it (a client that goes away ends its connection, not the
    server); it stops at the block's end. Opened by a fixture, its task
    group does not wrap a failing test's error in an exception group."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    server = server_of(listener.extra(anyio.abc.SocketAttribute.local_port))
    async with listener, anyio.create_task_group() as tg:

        async def handle(stream: anyio.abc.SocketStream) -> None:
            async with stream:
                with contextlib.suppress(
                    anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError
                ):
                    await answer(server, stream)

        tg.start_soon(listener.serve, handle)
        yield server
        tg.cancel_scope.cancel()


def closing_answer(status: str, body: bytes = b"", content_type: str = "image/png") -> bytes:
    """An HTTP/1.1 answer carrying ``body``, the connection closed after it."""
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def request_head(stream: anyio.abc.ByteStream) -> tuple[str, dict[str, str]]:
    """One HTTP request's path and headers (names in lower case), read from
    ``stream`` up to the blank line that ends them."""
    head = b""
    while b"\r\n\r\n" not in head:
        head += await stream.receive()
    request_line, *lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    fields = (line.split(":", 1) for line in lines)
    return request_line.split(" ")[1], {k.strip().lower(): v.strip() for k, v in fields}


@contextlib.asynccontextmanager
async def relayed(url: str) -> AsyncIterator[tuple[Relay, str]]:
    parts = urlsplit(url)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    async with anyio.create_task_group() as tg:
        await tg.start(relay.run)
        netloc = (
            f"{parts.username}@127.0.0.1:{relay.port}"
            if parts.username
            else f"127.0.0.1:{relay.port}"
        )
        yield relay, urlunsplit(parts._replace(netloc=netloc))
        relay.cut()
