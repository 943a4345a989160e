"""A few slots shared fairly between accounts (decision 0070).

One account's many waiters must not hold another account's one waiter back
behind all of theirs, as a FIFO limiter does: a freed slot goes to the
waiting account served least recently (one never served, or not waiting
since, first), and within an account to its oldest waiter. So an account
that asks while another floods waits for the turns in progress, and then at
most one turn of each other account waiting before it.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import AsyncIterator, Hashable

import anyio
import anyio.lowlevel


class FairTurns:
    """``capacity`` slots, handed round robin between the accounts waiting.

    What it keeps is bounded by its holders and waiters: an account with
    neither is forgotten (it then counts as never served when it asks
    again).
    """

    def __init__(self, capacity: int) -> None:
        self._free = capacity
        # The waiters of each account, oldest first.
        self._waiting: dict[Hashable, collections.deque[anyio.Event]] = {}
        # Slots held, by account.
        self._holding: collections.Counter[Hashable] = collections.Counter()
        # The number of the turn each account holding or waiting was last given.
        self._served: dict[Hashable, int] = {}
        self._turns = itertools.count(1)

    @property
    def waiting(self) -> int:
        """How many waiters there are, every account's together."""
        return sum(len(q) for q in self._waiting.values())

    @contextlib.asynccontextmanager
    async def turn(self, account: Hashable) -> AsyncIterator[None]:
        """Hold one slot for ``account`` for the block's length."""
        await self._acquire(account)
        try:
            yield
        finally:
            self._release(account)

    async def _acquire(self, account: Hashable) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            self._give(account)
            # Shielded: a cancellation here would leave the slot taken for good
            # (the caller's release is only armed once this returns).
            await anyio.lowlevel.cancel_shielded_checkpoint()
            return
        given = anyio.Event()
        self._waiting.setdefault(account, collections.deque()).append(given)
        try:
            await given.wait()
        except BaseException:
            if given.is_set():  # the slot came with the cancellation: passed on
                self._release(account)
            else:
                queue = self._waiting[account]
                queue.remove(given)
                if not queue:
                    del self._waiting[account]
                self._forget_idle(account)
            raise

    def _give(self, account: Hashable) -> None:
        self._holding[account] += 1
        self._served[account] = next(self._turns)

    def _forget_idle(self, account: Hashable) -> None:
        if not self._holding[account] and account not in self._waiting:
            del self._holding[account]
            self._served.pop(account, None)

    def _release(self, account: Hashable) -> None:
        self._holding[account] -= 1
        self._forget_idle(account)
        if not self._waiting:
            self._free += 1
            return
        # Least recently served first (never: 0); among equals, the first
        # to wait (dicts keep insertion order, and min keeps the first).
        chosen = min(self._waiting, key=lambda a: self._served.get(a, 0))
        queue = self._waiting[chosen]
        given = queue.popleft()
        if not queue:
            del self._waiting[chosen]
        self._give(chosen)
        given.set()
