"""hordelite.http.connection.Inbox: what Hypercorn hands an application on trio,
with a memory channel's semantics and a call when the client leaves."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from hordelite.http.connection import Inbox

BODY = {"type": "http.request", "body": b"x", "more_body": True}
LEFT = {"type": "http.disconnect"}


def test_messages_come_out_in_order_and_a_get_waits_for_the_next() -> None:
    async def main() -> None:
        inbox = Inbox(10)
        got: list[dict[str, object]] = []
        async with trio.open_nursery() as nursery:

            async def reader() -> None:
                for _ in range(3):
                    got.append(dict(await inbox.get()))

            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # nothing put yet: the get waits
            for i in range(3):
                await inbox.put({"type": "http.request", "body": bytes([i])})
        assert [m["body"] for m in got] == [b"\x00", b"\x01", b"\x02"]

    trio.run(main)


def test_a_put_waits_while_the_inbox_is_full_until_a_get_makes_room() -> None:
    async def main() -> None:
        inbox = Inbox(2)
        await inbox.put(BODY)
        await inbox.put(BODY)
        third = trio.Event()
        async with trio.open_nursery() as nursery:

            async def writer() -> None:
                await inbox.put(LEFT)
                third.set()

            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            assert not third.is_set()  # held back: the application has not read
            assert await inbox.get() == BODY
            await third.wait()
        assert [await inbox.get(), await inbox.get()] == [BODY, LEFT]

    trio.run(main)


def test_the_client_leaving_calls_on_leave_at_once_and_is_remembered() -> None:
    async def main() -> None:
        inbox = Inbox(10)
        calls: list[str] = []
        inbox.on_leave = lambda: calls.append("left")
        await inbox.put(BODY)
        assert calls == []
        assert not inbox.left
        await inbox.put(LEFT)
        assert calls == ["left"]
        assert inbox.left
        inbox.on_leave = None
        # The message is still there for a reader that reads on.
        assert [await inbox.get(), await inbox.get()] == [BODY, LEFT]

    trio.run(main)


@pytest.mark.parametrize("side", ["get", "put"])
def test_get_and_put_are_checkpoints_even_when_they_need_not_wait(side: str) -> None:
    async def main() -> None:
        inbox = Inbox(10)
        await inbox.put(BODY)
        with trio.CancelScope() as scope:
            scope.cancel()
            if side == "get":
                await inbox.get()
            else:
                await inbox.put(BODY)
        assert scope.cancelled_caught
        # A cancelled get took nothing, a cancelled put added nothing.
        assert await inbox.get() == BODY
        got: list[object] = []
        async with trio.open_nursery() as nursery:

            async def reader() -> None:
                got.append(await inbox.get())

            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # the inbox is empty: the get waits
            nursery.cancel_scope.cancel()

    trio.run(main)
