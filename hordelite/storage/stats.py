"""The horde's load as /status/performance reports it: its queue and its
pool summed, in three statements whose cost does not grow with what a
client sends."""

from __future__ import annotations

import dataclasses

from sqlalchemy import Connection, func, select

from hordelite.storage.schema import jobs, requests, workers


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


def horde_load(conn: Connection, now: float, since: float) -> HordeLoad:
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
