"""Signals: wake waiting pops when the queue changes, waiting clients when a
request ends; request versions, progress leases and progress streams.

In-process by default (``LocalSignals``); through Redis when ``[signals] url``
names one (``RedisSignals``), so several processes act as one horde. The
truth is always in storage, so a lost signal only delays an answer until the
waiter's own re-check."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio

from hordelite.contract.limits import DEGRADED_POLL_SECONDS
from hordelite.signals._local import LocalSignals, ProgressEntry, Signals

__all__ = ["LocalSignals", "ProgressEntry", "Signals", "look_again_by", "open_signals"]


def look_again_by(signals: Signals, deadline: float) -> float:
    """When a waiter looks again without a signal (anyio's clock): at its
    ``deadline``, or within DEGRADED_POLL_SECONDS while signals may be lost.

    The one place of the rule every wait follows (pops, long-polled
    statuses, OpenAI calls): a lost signal only delays an answer.
    """
    if signals.degraded:
        return min(deadline, anyio.current_time() + DEGRADED_POLL_SECONDS)
    return deadline


@contextlib.asynccontextmanager
async def open_signals(url: str) -> AsyncIterator[Signals]:
    """The signal backend ``url`` names (empty: in-process) for the block."""
    if not url:
        yield LocalSignals()
        return
    from hordelite.signals._redis import open_redis_signals

    async with open_redis_signals(url) as signals:
        yield signals
