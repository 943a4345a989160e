"""A status read's one statement (its request and the request's jobs) reads
along indexes: its cost follows the request, not how many jobs the horde
ever ran."""

from __future__ import annotations

from hordelite.storage import requests as stored_requests
from hordelite.storage.database import Database
from hordelite.storage.transaction import Tx


def test_the_sqlite_status_read_finds_the_jobs_of_its_request_by_index(
    sqlite_database: Database,
) -> None:
    def plan(conn: Tx) -> list[str]:
        sql = str(stored_requests._REQUEST_STATUS.compile(dialect=conn.dialect))
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, (None,) * sql.count("?")).all()
        return [row[3] for row in rows]

    details = sqlite_database.run_sync(plan, False)

    assert any(d.startswith("SEARCH requests USING INDEX") for d in details), details
    assert any(d.startswith("SEARCH jobs USING INDEX ix_jobs_request_id") for d in details), details
    # Not every job held or done built first, then scanned.
    assert not any("MATERIALIZE" in d or d.startswith("SCAN") for d in details), details
