"""The dashboard's activity figures: jobs done per time bucket, from the
jobs still stored and, for those purged with their ended requests past the
horde's retention, from the per-minute rollup the purge adds them to
(decision 0044). A done job is in one or the other, never both: the purge
rolls up and deletes it in one transaction."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from sqlalchemy import Integer, cast, delete, func, literal, select, union_all

from hordelite.contract.limits import DASHBOARD_BUCKET_SECONDS, DASHBOARD_WINDOW_SECONDS
from hordelite.storage.counts import add_counts
from hordelite.storage.schema import activity_minutes, jobs, requests
from hordelite.storage.transaction import Tx


@dataclasses.dataclass(frozen=True)
class Bucket:
    """The jobs submitted done in one bucket: how many, their tokens, and
    the seconds from their request's submit to the job's, summed."""

    index: int
    jobs: int
    tokens: int
    latency_sum: float


def done_jobs_per_bucket(conn: Tx, start: float, bucket_seconds: int, buckets: int) -> list[Bucket]:
    """The buckets from ``start`` (a whole minute) that saw a job done, by
    index (empty buckets are left out), stored and rolled up added together.

    One statement, so on PostgreSQL both parts read one snapshot: a purge
    committing meanwhile neither counts its jobs twice nor loses them.
    ``bucket_seconds`` must be a whole number of rollup minutes."""
    end = start + bucket_seconds * buckets
    offset = (jobs.c.submitted - start) / bucket_seconds
    # CAST truncates on SQLite and rounds on PostgreSQL: floor first there
    # (the offset is never negative, so truncation is the floor on SQLite,
    # whose floor() is an optional extension).
    postgres = conn.dialect.name == "postgresql"
    index = cast(func.floor(offset) if postgres else offset, Integer)
    stored = (
        select(
            index.label("i"),
            func.count().label("n"),
            func.coalesce(func.sum(jobs.c.tokens), 0).label("tokens"),
            func.coalesce(func.sum(jobs.c.submitted - requests.c.created), 0.0).label("latency"),
        )
        .join(requests, requests.c.id == jobs.c.request_id)
        .where(jobs.c.state == "done", jobs.c.submitted >= start, jobs.c.submitted < end)
        .group_by(index)
    )
    # Rollup minutes are whole seconds, never before the whole start: integer
    # division (``//``, no cast to a fraction) is their floor on both databases.
    rolled = select(
        ((activity_minutes.c.minute - int(start)) // literal(bucket_seconds, Integer)).label("i"),
        activity_minutes.c.jobs.label("n"),
        activity_minutes.c.tokens.label("tokens"),
        activity_minutes.c.latency_sum.label("latency"),
    ).where(activity_minutes.c.minute >= start, activity_minutes.c.minute < end)
    rows = conn.execute(union_all(stored, rolled)).all()
    found: dict[int, Bucket] = {}
    for i, n, tokens, latency in rows:
        was = found.get(int(i), Bucket(int(i), 0, 0, 0.0))
        found[int(i)] = Bucket(
            was.index, was.jobs + int(n), was.tokens + int(tokens), was.latency_sum + float(latency)
        )
    return sorted(found.values(), key=lambda b: b.index)


def roll_up(
    conn: Tx,
    purged: Sequence[tuple[str, str, float | None, int | None]],
    created: dict[str, float],
    now: float,
) -> None:
    """Add the done jobs among ``purged`` (request id, state, submitted,
    tokens of the jobs being deleted) to their minutes' rollup rows, and
    drop the rows older than the dashboard's window. ``created`` maps each
    purged request to its submit time."""
    cutoff = now - DASHBOARD_WINDOW_SECONDS
    minutes: dict[int, list[float]] = {}
    for request_id, state, submitted, tokens in purged:
        when = created.get(request_id)
        if state != "done" or submitted is None or when is None or submitted < cutoff:
            continue  # not done, or older than any window a read will ask for
        minute = math.floor(submitted / DASHBOARD_BUCKET_SECONDS) * DASHBOARD_BUCKET_SECONDS
        figures = minutes.setdefault(minute, [0, 0, 0.0])
        figures[0] += 1
        figures[1] += tokens or 0
        figures[2] += submitted - when
    # A minute whole past the hour is never read again (a read's first
    # bucket starts less than an hour before its now).
    conn.execute(delete(activity_minutes).where(activity_minutes.c.minute < cutoff))
    add_counts(
        conn,
        activity_minutes,
        ["minute"],
        [
            {"minute": m, "jobs": int(n), "tokens": int(t), "latency_sum": float(s)}
            for m, (n, t, s) in sorted(minutes.items())
        ],
    )
