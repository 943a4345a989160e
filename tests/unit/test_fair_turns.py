"""FairTurns (horde/fair_turns.py, decision 0070): the normalising slots
handed round robin between accounts, so that one account's flood cannot
hold another's image back by more than the turns in progress."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import anyio
import anyio.lowlevel
import pytest

from hordelite.horde.fair_turns import FairTurns

pytestmark = pytest.mark.anyio


async def until(condition: Callable[[], bool], seconds: float = 5) -> None:
    """Checkpoints until ``condition`` holds, within a deadline."""
    with anyio.fail_after(seconds):
        while not condition():
            await anyio.lowlevel.checkpoint()


class Turns:
    """Waiters on one FairTurns, each holding its slot until let go, the
    order of the grants recorded."""

    def __init__(self, turns: FairTurns, tg: anyio.abc.TaskGroup) -> None:
        self.turns, self.tg = turns, tg
        self.order: list[str] = []
        self.go: dict[str, anyio.Event] = {}
        self.scopes: dict[str, anyio.CancelScope] = {}

    async def ask(self, name: str, account: Hashable) -> None:
        """Start a waiter and return once it holds a slot or waits for one."""
        self.go[name] = anyio.Event()
        self.scopes[name] = anyio.CancelScope()
        before = self.turns.waiting
        self.tg.start_soon(self._hold, name, account)
        await until(lambda: name in self.order or self.turns.waiting > before)

    async def _hold(self, name: str, account: Hashable) -> None:
        with self.scopes[name]:
            async with self.turns.turn(account):
                self.order.append(name)
                await self.go[name].wait()

    async def let_go(self, name: str) -> str | None:
        """End ``name``'s turn; the next one granted, if any."""
        granted = len(self.order)
        self.go[name].set()
        if not self.turns.waiting and granted == len(self.order):
            await until(lambda: not self.turns._holding)
            return None
        await until(lambda: len(self.order) > granted)
        return self.order[-1]


async def test_an_account_asking_while_another_floods_has_the_next_turn() -> None:
    async with anyio.create_task_group() as tg:
        t = Turns(FairTurns(1), tg)
        await t.ask("flood-0", "anonymous")
        for n in range(1, 6):
            await t.ask(f"flood-{n}", "anonymous")
        await t.ask("registered", 7)
        # A FIFO would give the five flood waiters their turns first.
        assert await t.let_go("flood-0") == "registered"
        assert await t.let_go("registered") == "flood-1"
        for n in range(1, 6):
            await t.let_go(f"flood-{n}")
    assert t.order == ["flood-0", "registered", *(f"flood-{n}" for n in range(1, 6))]


async def test_accounts_waiting_take_turns_round_robin() -> None:
    async with anyio.create_task_group() as tg:
        t = Turns(FairTurns(1), tg)
        await t.ask("a0", "a")
        for name, account in [("a1", "a"), ("a2", "a"), ("b0", "b"), ("b1", "b"), ("c0", "c")]:
            await t.ask(name, account)
        for name in ["a0", "b0", "c0", "a1", "b1", "a2"]:
            await t.let_go(name)
    assert t.order == ["a0", "b0", "c0", "a1", "b1", "a2"]


async def test_no_more_turns_at_once_than_the_capacity() -> None:
    async with anyio.create_task_group() as tg:
        t = Turns(FairTurns(2), tg)
        for n in range(5):
            await t.ask(f"w{n}", n % 2)
        assert t.order == ["w0", "w1"]
        assert t.turns.waiting == 3
        assert await t.let_go("w0") in {"w2", "w3"}
        assert len(t.order) == 3
        for name in list(t.go):
            t.go[name].set()
    assert sorted(t.order) == [f"w{n}" for n in range(5)]
    # Every account forgotten.
    assert not t.turns._served
    assert not t.turns._holding


async def test_a_cancelled_waiter_gives_up_its_place() -> None:
    async with anyio.create_task_group() as tg:
        t = Turns(FairTurns(1), tg)
        await t.ask("a0", "a")
        await t.ask("b0", "b")
        await t.ask("c0", "c")
        t.scopes["b0"].cancel()
        await until(lambda: t.turns.waiting == 1)
        assert await t.let_go("a0") == "c0"
        assert await t.let_go("c0") is None
    assert t.order == ["a0", "c0"]
    assert not t.turns._served
    assert not t.turns._holding
    assert t.turns._free == 1


async def test_a_turn_granted_as_its_waiter_is_cancelled_passes_on() -> None:
    turns = FairTurns(1)
    async with anyio.create_task_group() as tg:
        t = Turns(turns, tg)
        await turns._acquire("a")
        await t.ask("b0", "b")
        await t.ask("c0", "c")
        # The slot is handed to b0, and b0 cancelled before it runs again
        # (no checkpoint between the two): the slot must reach c0, not be lost.
        turns._release("a")
        t.scopes["b0"].cancel()
        await until(lambda: "c0" in t.order)
        t.go["c0"].set()
    assert t.order[-1] == "c0"
    assert turns._free == 1
    assert not turns._holding
    assert not turns._served


async def test_a_free_slot_taken_by_a_cancelled_caller_is_not_lost() -> None:
    turns = FairTurns(1)
    for _ in range(3):
        with anyio.CancelScope() as scope:
            scope.cancel()
            async with turns.turn("a"):
                await anyio.lowlevel.checkpoint()
    assert turns._free == 1
    assert not turns._holding
