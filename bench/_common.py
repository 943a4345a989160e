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
