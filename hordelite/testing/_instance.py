from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from hordelite.blobs import BlobStore
from hordelite.clock import Clock
from hordelite.config import Config
from hordelite.horde.service import Horde
from hordelite.server import open_server
from hordelite.storage.database import Database
from hordelite.storage.migrations import upgrade
from hordelite.storage.queries import SweepResult


@dataclasses.dataclass
class TestHorde:
    """A running horde: its base ``url``, the service, and helpers."""

    __test__ = False  # not a pytest test class

    url: str
    horde: Horde
    database: str
    # The horde's blob store (its files live in the temporary folder unless
    # the given config names a directory or an object store).
    blobs: BlobStore
    # The base URL of the port serving /metrics alone, when [metrics] names one.
    metrics_url: str | None = None

    async def create_key(
        self, name: str = "user", *, kudos: float = 0.0, admin: bool = False, trusted: bool = False
    ) -> str:
        """A new user's API key."""
        _, key = await self.horde.create_user(name, kudos=kudos, admin=admin, trusted=trusted)
        return key

    async def sweep(self) -> SweepResult:
        """Run the timers' work now (after moving a ManualClock, say); on
        PostgreSQL it waits for a periodic sweep under way, never skips."""
        return await self.horde.sweep(wait=True)


_template_lock = threading.Lock()


@functools.cache
def _migrated_template() -> str:
    """A SQLite file holding the current schema and nothing else, made
    once per process and removed at its exit."""
    folder = tempfile.mkdtemp(prefix="hordelite-template-")
    atexit.register(shutil.rmtree, folder, True)
    path = str(Path(folder) / "migrated.db")
    db = Database(path, 1)
    try:
        db.run_sync(upgrade, True)
    finally:
        db.dispose()
    return path


def _copy_migrated(path: str) -> None:
    """A fresh database at ``path``, copied from the migrated template.

    Migrating a new file costs tens of milliseconds, which a suite opening
    thousands of hordes pays each time; a copy costs about one. The horde
    still migrates it at start (nothing is pending) and creates the
    anonymous user then, at its own clock, as on any new database. SQLite's
    backup API copies the file whole, its write-ahead log included."""
    with _template_lock:
        template = _migrated_template()
    source = sqlite3.connect(template)
    target = sqlite3.connect(path)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()


@contextlib.asynccontextmanager
async def open_horde(
    *,
    config: Config | None = None,
    clock: Clock | None = None,
    database: str | None = None,
    grace_period: float = 2,
    suspect_speed: bool = False,
    **horde: Any,
) -> AsyncIterator[TestHorde]:
    """Run a horde until the block exits.

    ``database`` defaults to a SQLite file in a temporary folder (removed on
    exit); ``horde`` keys override the [horde] configuration section, e.g.
    ``open_horde(job_ttl=5, allow_anonymous=False)``. Pass a ``ManualClock``
    as ``clock`` to move time instead of sleeping; the periodic sweep then
    still runs, but only ``TestHorde.sweep()`` right after a move is certain.
    ``grace_period``: the server's, for its drain at the block's end.
    ``suspect_speed``: keep ``[moderation] suspicious_tokens_per_second``
    as configured; by default it is 0 (off): a fake worker answers in
    milliseconds, far past any plausible speed, and would be paused after
    five jobs in every test that is not about suspicion.
    """
    with tempfile.TemporaryDirectory(prefix="hordelite-") as tmp:
        db = database
        if db is None:
            db = str(Path(tmp) / "horde.db")
            await anyio.to_thread.run_sync(_copy_migrated, db)
        # HORDELITE_SIGNALS_URL, as for `hordelite serve`: the same suites
        # then run on Redis signals.
        base = config or Config().replace(
            signals={"url": os.environ.get("HORDELITE_SIGNALS_URL", "")}
        )
        cfg = base.replace(
            server={"host": "127.0.0.1", "port": 0, "grace_period": grace_period},
            storage={"database": db},
            horde=horde,
        )
        if not suspect_speed:
            cfg = cfg.replace(moderation={"suspicious_tokens_per_second": 0})
        if not cfg.blobs.directory and not cfg.blobs.s3_endpoint:
            cfg = cfg.replace(blobs={"directory": str(Path(tmp) / "hordelite-blobs")})
        async with open_server(cfg, clock=clock) as running:
            yield TestHorde(
                url=running.url,
                horde=running.horde,
                database=db,
                blobs=running.blobs,
                metrics_url=running.metrics_url,
            )
