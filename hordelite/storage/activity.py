"""The dashboard's activity figures: jobs done per time bucket, in one
aggregate query over the jobs still stored (ended requests are purged past
the horde's retention, their jobs with them)."""

from __future__ import annotations

import dataclasses

from sqlalchemy import Connection, Integer, cast, func, select

from hordelite.storage.schema import jobs, requests


@dataclasses.dataclass(frozen=True)
class Bucket:
    """The jobs submitted done in one bucket: how many, their tokens, and
    the mean seconds from their request's submit to the job's."""

    index: int
    jobs: int
    tokens: int
    latency: float


def done_jobs_per_bucket(
    conn: Connection, start: float, bucket_seconds: int, buckets: int
) -> list[Bucket]:
    """The buckets from ``start`` that saw a job done, by index (empty
    buckets are left out)."""
    offset = (jobs.c.submitted - start) / bucket_seconds
    # CAST truncates on SQLite and rounds on PostgreSQL: floor first there
    # (the offset is never negative, so truncation is the floor on SQLite,
    # whose floor() is an optional extension).
    index = cast(func.floor(offset) if conn.dialect.name == "postgresql" else offset, Integer)
    rows = conn.execute(
        select(
            index,
            func.count(),
            func.coalesce(func.sum(jobs.c.tokens), 0),
            func.avg(jobs.c.submitted - requests.c.created),
        )
        .join(requests, requests.c.id == jobs.c.request_id)
        .where(
            jobs.c.state == "done",
            jobs.c.submitted >= start,
            jobs.c.submitted < start + bucket_seconds * buckets,
        )
        .group_by(index)
    ).all()
    return [
        Bucket(int(i), int(n), int(tokens), float(latency or 0.0)) for i, n, tokens, latency in rows
    ]
