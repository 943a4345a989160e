"""Pieces the bench scripts share: processes and their CPU, from /proc (Linux),
and fresh PostgreSQL schemas and Redis databases.

Not a benchmark: the scripts import it (bench/ is the script's folder, so on
sys.path).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg

# The test servers the suite uses (tests/conftest.py reads the same variables).
POSTGRES_ENV = "HORDELITE_TEST_POSTGRES_URL"
REDIS_ENV = "HORDELITE_TEST_REDIS_URL"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"

_TICK = os.sysconf("SC_CLK_TCK")

# The most models a pop may declare on the wire (contract/limits.py MAX_MODELS).
_MODELS_PER_POP = 100


def never_refusing_budgets() -> dict[str, int]:
    """A [budgets] section high enough never to refuse a benchmark's
    requests, yet set, so that every check and its reads still run (0 would
    skip them); empty for a tree that has no budgets (a baseline)."""
    try:
        from hordelite.config import BudgetsConfig
    except ImportError:
        return {}
    return {
        f.name: _MODELS_PER_POP if f.name == "models_per_worker" else 10**12
        for f in dataclasses.fields(BudgetsConfig)
    }


def speed_unjudged() -> dict[str, int]:
    """A [moderation] section under which no job is too fast: a bench's
    workers (fakes, or a worker on the fake backend) answer far faster than
    a model could, and judged by speed each would be paused as suspicious
    within a few jobs. Empty for a tree that does not judge speed (a
    baseline)."""
    try:
        from hordelite.config import ModerationConfig
    except ImportError:
        return {}
    names = {f.name for f in dataclasses.fields(ModerationConfig)}
    return {"suspicious_tokens_per_second": 0} if "suspicious_tokens_per_second" in names else {}


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_cpu() -> float:
    """CPU seconds every core of the machine has spent busy since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / _TICK


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants, alive now (a server may run worker processes)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                children.setdefault(int(_stat_fields(int(entry.name))[1]), []).append(
                    int(entry.name)
                )
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def stop_process(process: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM ``process`` and wait for it; SIGKILL it if it outlives ``timeout`` seconds."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# PostgreSQL and Redis -----------------------------------------------------------


def with_search_path(url: str, schema: str) -> str:
    """``url`` with libpq's ``options`` set so that every connection uses ``schema``."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-csearch_path={schema}"))
    return urlunsplit(parts._replace(query=urlencode(query)))


@contextlib.contextmanager
def fresh_schema(postgres_url: str) -> Iterator[str]:
    """A postgresql:// URL whose connections live in a new, empty schema, dropped on exit."""
    schema = f"bench_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_search_path(postgres_url, schema)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def redis_on_db(url: str, db: int) -> str:
    """``url`` (redis://host:port/n) naming logical database ``db`` instead."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


class RedisCommands:
    """The bench's own Redis commands (FLUSHDB, CLIENT LIST, INFO) in RESP2
    on one blocking socket, apart from the servers' clients."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.port = parts.port or 6379
        self._sock = socket.create_connection((parts.hostname or "127.0.0.1", self.port), 10)
        self._file = self._sock.makefile("rb")
        if parts.password:
            self.command("AUTH", *filter(None, [parts.username]), parts.password)
        self.command("SELECT", parts.path.strip("/") or "0")

    def command(self, *words: str) -> Any:
        encoded = [word.encode() for word in words]
        payload = b"*%d\r\n" % len(encoded) + b"".join(
            b"$%d\r\n%s\r\n" % (len(word), word) for word in encoded
        )
        self._sock.sendall(payload)
        return self._reply()

    def _reply(self) -> Any:
        line = self._file.readline()
        if not line:
            raise ConnectionError("Redis closed the connection")
        kind, rest = line[:1], line[1:-2].decode()
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RuntimeError(f"Redis answered: {rest}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self._file.read(size + 2)[:-2].decode()
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._reply() for _ in range(size)]
        raise RuntimeError(f"an answer from Redis this client cannot read: {line!r}")

    def flush(self) -> None:
        self.command("FLUSHDB")

    def clients(self) -> list[dict[str, str]]:
        """CLIENT LIST, each client as its fields."""
        listing: str = self.command("CLIENT", "LIST")
        return [
            dict(field.split("=", 1) for field in line.split() if "=" in field)
            for line in listing.splitlines()
            if line.strip()
        ]

    def connected_clients(self) -> int:
        info: str = self.command("INFO", "clients")
        for line in info.splitlines():
            if line.startswith("connected_clients:"):
                return int(line.split(":", 1)[1])
        raise RuntimeError("INFO clients has no connected_clients")

    def close(self) -> None:
        self._file.close()
        self._sock.close()


def flush_redis(url: str) -> None:
    redis = RedisCommands(url)
    try:
        redis.flush()
    finally:
        redis.close()


# The Redis logical database of a postgresql+redis store, flushed before and after.
REDIS_DB = 5
STORAGES = ("sqlite", "postgresql", "postgresql+redis")


@contextlib.contextmanager
def storage_urls(storage: str, sqlite_path: str) -> Iterator[tuple[str, str]]:
    """(database, signals URL) of a fresh store of the kind ``storage`` (one
    of STORAGES) names: the SQLite file ``sqlite_path`` and in-process
    signals; a new PostgreSQL schema and in-process signals; or that and a
    flushed Redis database (REDIS_DB)."""
    if storage == "sqlite":
        yield sqlite_path, ""
        return
    postgres = os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES)
    with fresh_schema(postgres) as database:
        if storage == "postgresql":
            yield database, ""
            return
        signals_url = redis_on_db(os.environ.get(REDIS_ENV, DEFAULT_REDIS), REDIS_DB)
        flush_redis(signals_url)
        try:
            yield database, signals_url
        finally:
            flush_redis(signals_url)
