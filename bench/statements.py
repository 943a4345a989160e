"""What one statement and one transaction cost through each execution path.

Runs the hottest read of every write (the user lookup by key hash) on one
SQLite connection through SQLAlchemy Core (how hordelite runs it), through
``exec_driver_sql`` and on the DBAPI cursor, and times empty read and write
transactions through ``Database``. Prints microseconds per call and each
path's ratio to Core, measured in the same run. Decision 0038 reads these
figures (why the statements stay on Core).

    .venv/bin/python bench/statements.py [--calls N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection

from hordelite.storage import accounts
from hordelite.storage.database import Database
from hordelite.storage.migrations import upgrade

KEY_HASH = "h" * 64


def per_call(calls: int, run: Callable[[], Any]) -> float:
    """Microseconds per call of ``run``."""
    started = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - started) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hordelite-bench-") as tmp:
        db = Database(str(Path(tmp) / "bench.db"))
        db.run_sync(upgrade, True)
        db.run_sync(accounts.create_user, True, "alice", KEY_HASH, 10.0, False, False, 0.0)

        def paths(conn: Connection) -> dict[str, float]:
            compiled = accounts.USER_BY_KEY.compile(dialect=conn.dialect)
            raw = conn.connection.driver_connection
            assert raw is not None

            def on_cursor() -> dict[str, Any]:
                cursor = raw.cursor()
                cursor.execute(compiled.string, (KEY_HASH,))
                names = [c[0] for c in cursor.description]
                return dict(zip(names, cursor.fetchone(), strict=True))

            params = {"key_hash": KEY_HASH}
            return {
                "SQLAlchemy Core (hordelite)": per_call(
                    args.calls,
                    lambda: conn.execute(accounts.USER_BY_KEY, params).mappings().first(),
                ),
                "exec_driver_sql": per_call(
                    args.calls,
                    lambda: conn.exec_driver_sql(compiled.string, (KEY_HASH,)).mappings().first(),
                ),
                "DBAPI cursor": per_call(args.calls, on_cursor),
            }

        figures = db.run_sync(paths, False)
        transactions = args.calls // 4
        figures["empty write transaction"] = per_call(
            transactions, lambda: db.run_sync(lambda conn: None, True)
        )
        figures["empty read transaction"] = per_call(
            transactions, lambda: db.run_sync(lambda conn: None, False)
        )
        db.dispose()
    core = figures["SQLAlchemy Core (hordelite)"]
    print(f"{'path':32} {'us per call':>12} {'/ Core':>8}")
    for name, micros in figures.items():
        print(f"{name:32} {micros:12.1f} {micros / core:8.2f}")
    print(f"calls: {args.calls} per statement path, {transactions} per transaction")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
