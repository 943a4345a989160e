"""Capped exponential backoff with jitter, for retries against the horde and
the backend."""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Delays for successive failed attempts.

    Attempt ``n`` (from 0) waits a random time in ``[d / 2, d]`` with
    ``d = min(maximum, initial * 2**n)``: exponential, capped, and spread so
    that many workers cut off by one outage do not come back in step.
    """

    def __init__(
        self, initial: float, maximum: float, rng: Callable[[], float] = random.random
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self._rng = rng

    def ceiling(self, attempt: int) -> float:
        """The longest delay of ``attempt``."""
        # 2**n overflows a float past n = 1023; the cap is reached long before.
        return min(self.maximum, self.initial * 2.0 ** min(attempt, 64))

    def delay(self, attempt: int) -> float:
        """A delay for ``attempt``, jittered between half its ceiling and the ceiling."""
        ceiling = self.ceiling(attempt)
        return ceiling / 2 + self._rng() * ceiling / 2
