"""When a worker counts as online: the time its check-in lasts until.

A pop is a check-in. The AI Horde counts a worker online for 300 seconds
(``horde.worker_online``) after its last pop, which is right for a worker
that polls without ``wait`` or goes off to generate a job: it may be
silent that long. A worker whose pop long-polled and found nothing proves
it is alive again as the wait ends (it pops at once), so its check-in
lasts only until the end of that wait plus the wait again (at least
``MIN_LONG_POLL_MARGIN`` seconds): a worker that died or stopped leaves the
pool within about twice its wait instead of 300 seconds. Never longer than
``worker_online``. A worker that says it stops (``PUT /workers/{id}`` with
``online: false``) is offline at once, until its next pop.
"""

from __future__ import annotations

from hordelite.contract.limits import MIN_LONG_POLL_MARGIN


def online_until(
    now: float, *, handed_job: bool, poll_left: float | None, wait: float, worker_online: float
) -> float:
    """Until when a worker that pops at ``now`` counts as online.

    ``handed_job``: this pop gave it a job. ``poll_left``: seconds the pop
    still long-polls after this attempt (0 on its last attempt), None when
    it does not long-poll. ``wait``: the pop's ``wait``.
    """
    if handed_job or poll_left is None or wait <= 0:
        return now + worker_online
    return now + min(poll_left + max(wait, MIN_LONG_POLL_MARGIN), worker_online)


def is_online(online_until: float, now: float) -> bool:
    """The one comparison every reader makes (offline from ``online_until`` on)."""
    return now < online_until
