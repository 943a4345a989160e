"""Signals: wake waiting pops when the queue changes, waiting clients when a
request ends. In-process by default; the truth is always in storage, so a
lost signal only delays an answer until the waiter's own re-check."""

from hordelite.signals._local import LocalSignals, ProgressEntry, Signals

__all__ = ["LocalSignals", "ProgressEntry", "Signals"]
