"""The horde's figures as the AI Horde's /status/performance and
/stats/text report them: the queue and the pool summed, and the jobs done
per period and model, from the jobs still stored and the rollups of those
purged (``activity_minutes`` for the last hour, ``stats_days`` for ever)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from sqlalchemy import Integer, cast, func, select

from hordelite.storage.counts import add_counts
from hordelite.storage.schema import activity_minutes, jobs, requests, stats_days, workers
from hordelite.storage.transaction import Tx

DAY = 86400
# "month" of /stats/text: the last 30 UTC days, today included.
MONTH_DAYS = 30


@dataclasses.dataclass(frozen=True)
class HordeLoad:
    """Requests still waiting for a worker and the tokens they ask for
    (``max_length`` per job left), the online workers and their threads,
    and the tokens of the jobs done since ``since``."""

    queued_requests: int
    queued_tokens: int
    workers: int
    threads: int
    recent_tokens: int


def horde_load(conn: Tx, now: float, since: float) -> HordeLoad:
    queued = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(requests.c.remaining * requests.c.max_length), 0),
        ).where(requests.c.state == "waiting", requests.c.remaining > 0)
    ).one()
    online = conn.execute(
        select(func.count(), func.coalesce(func.sum(workers.c.threads), 0)).where(
            workers.c.online_until > now
        )
    ).one()
    recent = conn.execute(
        select(func.coalesce(func.sum(jobs.c.tokens), 0)).where(
            jobs.c.state == "done", jobs.c.submitted >= since
        )
    ).scalar_one()
    return HordeLoad(
        queued_requests=int(queued[0]),
        queued_tokens=int(queued[1]),
        workers=int(online[0]),
        threads=int(online[1]),
        recent_tokens=int(recent),
    )


def roll_up_days(conn: Tx, purged: Sequence[tuple[str, float | None, int | None, str]]) -> None:
    """Add the done jobs among ``purged`` (state, submitted, tokens, model of
    the jobs being deleted) to their day's and model's row of stats_days."""
    days: dict[tuple[int, str], list[int]] = {}
    for state, submitted, tokens, model in purged:
        if state != "done" or submitted is None:
            continue
        figures = days.setdefault((math.floor(submitted / DAY) * DAY, model), [0, 0])
        figures[0] += 1
        figures[1] += tokens or 0
    add_counts(
        conn,
        stats_days,
        ["day", "model"],
        [
            {"day": day, "model": model, "jobs": n, "tokens": t}
            for (day, model), (n, t) in sorted(days.items())
        ],
    )


@dataclasses.dataclass(frozen=True)
class TextStats:
    """Jobs done and their tokens in the last minute and hour, today (UTC),
    the last 30 days and ever; and per model, the jobs done today, in the
    last 30 days and ever."""

    totals: dict[str, tuple[int, int]]  # period -> (jobs, tokens)
    models: dict[str, dict[str, int]]  # day, month, total -> model -> jobs


def text_stats(conn: Tx, now: float) -> TextStats:
    today = math.floor(now / DAY) * DAY
    month_start = today - (MONTH_DAYS - 1) * DAY
    per: dict[tuple[int, str], list[int]] = {}
    # The stored done jobs, by day and model (a day's index, not a date).
    # CAST truncates on SQLite and rounds on PostgreSQL: floor first there
    # (as for the dashboard's buckets; times are never negative).
    offset = jobs.c.submitted / DAY
    day_of = cast(func.floor(offset) if conn.dialect.name == "postgresql" else offset, Integer)
    stored = conn.execute(
        select(day_of, jobs.c.model, func.count(), func.coalesce(func.sum(jobs.c.tokens), 0))
        .where(jobs.c.state == "done", jobs.c.submitted.is_not(None))
        .group_by(day_of, jobs.c.model)
    ).all()
    rolled = conn.execute(
        select(stats_days.c.day, stats_days.c.model, stats_days.c.jobs, stats_days.c.tokens)
    ).all()
    days = [(int(i) * DAY, m, n, t) for i, m, n, t in stored]
    for day, model, n, t in [*days, *((int(d), m, n, t) for d, m, n, t in rolled)]:
        figures = per.setdefault((day, model), [0, 0])
        figures[0] += int(n)
        figures[1] += int(t)
    models: dict[str, dict[str, int]] = {"day": {}, "month": {}, "total": {}}
    totals = {"day": [0, 0], "month": [0, 0], "total": [0, 0]}
    for (day, model), (n, t) in per.items():
        periods = ["total"] + (["month"] if day >= month_start else [])
        periods += ["day"] if day == today else []
        for period in periods:
            models[period][model] = models[period].get(model, 0) + n
            totals[period][0] += n
            totals[period][1] += t
    recent = {
        "minute": _done_since(conn, now - 60, rolled_too=False),
        "hour": _done_since(conn, now - 3600, rolled_too=True),
    }
    return TextStats(
        totals={**recent, **{k: (v[0], v[1]) for k, v in totals.items()}},
        models={k: dict(sorted(v.items())) for k, v in models.items()},
    )


def _done_since(conn: Tx, since: float, rolled_too: bool) -> tuple[int, int]:
    """Jobs done since ``since`` and their tokens: the stored ones, and with
    ``rolled_too`` those rolled up into activity_minutes (whole minutes)."""
    n, t = conn.execute(
        select(func.count(), func.coalesce(func.sum(jobs.c.tokens), 0)).where(
            jobs.c.state == "done", jobs.c.submitted >= since
        )
    ).one()
    if rolled_too:
        rn, rt = conn.execute(
            select(
                func.coalesce(func.sum(activity_minutes.c.jobs), 0),
                func.coalesce(func.sum(activity_minutes.c.tokens), 0),
            ).where(activity_minutes.c.minute >= since)
        ).one()
        n, t = n + rn, t + rt
    return int(n), int(t)
