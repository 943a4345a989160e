"""Inline SQLite transactions take turns past a backlog (Database._inline).

The loop runs every ready task once per pass of its scheduler. Without turns,
a burst of handlers reaching their transactions together runs them all in one
pass, and nothing else (an accept, a heartbeat) runs until it ends.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from sqlalchemy import text

from hordelite.storage.database import INLINE_TURNS_BACKLOG, Database
from hordelite.storage.transaction import Tx

pytestmark = pytest.mark.anyio

BURST = 10 * INLINE_TURNS_BACKLOG


async def passes_seen_by(db: Database, burst: int) -> list[int]:
    """Run ``burst`` transactions at once beside a task that counts passes;
    returns, for each transaction, the pass it ran in."""
    passes = 0
    seen: list[int] = []
    done = anyio.Event()

    def transaction(conn: Tx) -> None:
        conn.execute(text("SELECT 1"))
        seen.append(passes)

    async def count_passes() -> None:
        nonlocal passes
        while not done.is_set():
            passes += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(count_passes)
        async with anyio.create_task_group() as burst_group:
            for _ in range(burst):
                burst_group.start_soon(db.read, transaction)
        done.set()
    return seen


async def test_a_burst_of_inline_transactions_takes_turns_with_the_rest_of_the_loop(
    tmp_path: Path,
) -> None:
    db = Database(str(tmp_path / "horde.db"))
    try:
        assert db.inline
        seen = await passes_seen_by(db, BURST)
    finally:
        db.dispose()
    assert len(seen) == BURST
    # Past the backlog the transactions take turns, so the other task runs
    # between them (trio and asyncio each let some share a pass); without
    # turns they all share one or two passes.
    assert len(set(seen)) >= BURST // 2


async def test_a_few_inline_transactions_do_not_wait_for_turns(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "horde.db"))
    try:
        seen = await passes_seen_by(db, INLINE_TURNS_BACKLOG)
    finally:
        db.dispose()
    # Below the backlog nothing takes turns: they run in the pass after
    # their checkpoint, together.
    assert len(set(seen)) <= 2
