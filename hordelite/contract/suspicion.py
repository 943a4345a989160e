"""Worker suspicion (the AI Horde's ``horde/suspicions.py``): what makes a
worker suspicious and when it is paused for it. Pure: storage adds the
suspicion and pauses the worker in the transaction that found it.

A worker's suspicion is a count. A bad name counts once per reason (as on
the AI Horde); every job done at an implausible speed counts again. At
``THRESHOLD`` the worker is paused (the admin's pause: it keeps checking
in and gets no job) until an admin resets its suspicion. A trusted owner's
workers are never suspected, as on the AI Horde.
"""

from __future__ import annotations

import enum
from typing import Final


class Suspicion(enum.IntEnum):
    """The AI Horde's reasons, with its codes; hordelite raises the text ones."""

    WORKER_NAME_LONG = 0
    WORKER_NAME_EXTREME = 1
    WORKER_PROFANITY = 2
    UNREASONABLY_FAST = 5


# The AI Horde's: at 5 a worker is paused.
THRESHOLD: Final = 5
# The AI Horde's bounds of a worker name: past LONG_NAME characters it is
# suspicious, past EXTREME_NAME once more.
LONG_NAME: Final = 100
EXTREME_NAME: Final = 200
# The reasons that count each time they are found; the others once.
REPEATED: Final = frozenset({Suspicion.UNREASONABLY_FAST})


def name_suspicions(name: str, words: frozenset[str]) -> list[Suspicion]:
    """What a worker's name is suspected of: its length (the AI Horde's
    bounds) and holding one of ``words`` (``[moderation]
    suspicious_name_words``, compared case-insensitively as parts of the
    name: the AI Horde's profanity check, here the operator's list)."""
    found = []
    if len(name) > LONG_NAME:
        found.append(Suspicion.WORKER_NAME_LONG)
    if len(name) > EXTREME_NAME:
        found.append(Suspicion.WORKER_NAME_EXTREME)
    folded = name.casefold()
    if any(word in folded for word in words):
        found.append(Suspicion.WORKER_PROFANITY)
    return found


def name_words(setting: str) -> frozenset[str]:
    """The words of ``[moderation] suspicious_name_words`` (comma-separated),
    folded as names are compared."""
    return frozenset(w.strip().casefold() for w in setting.split(",") if w.strip())


def too_fast(tokens: float, seconds: float, bound: float) -> bool:
    """Whether a job's ``tokens`` (as billed) over the ``seconds`` from its
    pop to its submit are more than ``bound`` tokens per second (0: never)."""
    return bound > 0 and seconds > 0 and tokens / seconds > bound


def added(count: int, seen: int, reasons: list[Suspicion]) -> tuple[int, int]:
    """The suspicion count and the bitmask of reasons seen once ``reasons``
    are added to ``count`` and ``seen``: a reason outside REPEATED counts
    only the first time."""
    for reason in reasons:
        bit = 1 << int(reason)
        if reason not in REPEATED and seen & bit:
            continue
        count += 1
        seen |= bit
    return count, seen
