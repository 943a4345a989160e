"""The budget reads of a submit read along indexes (decisions 0049, 0071):
what a user or an anonymous client holds costs what it holds, not the
retention's history of every request, nor every anonymous client's."""

from __future__ import annotations

import pytest

from hordelite.storage import requests as stored_requests
from hordelite.storage.database import Database
from hordelite.storage.transaction import Tx

READS = {
    "by_client": stored_requests._BY_CLIENT,
    "by_user": stored_requests._BY_USER,
}
INDEXES = {
    "by_client": ("ix_requests_client_created", "ix_requests_held_client"),
    "by_user": ("ix_requests_user_created", "ix_requests_held_user"),
}


@pytest.mark.parametrize("who", sorted(READS))
def test_the_sqlite_budget_reads_search_their_indexes(sqlite_database: Database, who: str) -> None:
    reads = READS[who]

    def plan(conn: Tx, statement: object) -> list[str]:
        sql = str(statement.compile(dialect=conn.dialect))  # type: ignore[attr-defined]
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, (None,) * sql.count("?")).all()
        return [row[3] for row in rows]

    created, held = INDEXES[who]
    recent = sqlite_database.run_sync(lambda conn: plan(conn, reads.recent), False)
    holdings = sqlite_database.run_sync(lambda conn: plan(conn, reads.holdings), False)
    both = sqlite_database.run_sync(lambda conn: plan(conn, reads.both), False)
    for details in (recent, both):
        assert any(
            f"USING COVERING INDEX {created}" in d or f"USING INDEX {created}" in d for d in details
        ), details
        assert any(
            "budget_refusals USING COVERING INDEX ix_budget_refusals_who" in d for d in details
        ), details
    for details in (holdings, both):
        assert any(f"USING INDEX {held}" in d for d in details), details
    for details in (recent, holdings, both):
        assert not any(
            d.startswith("SCAN requests") or d.startswith("SCAN budget_refusals") for d in details
        ), details
