"""A full horde in your test's event loop, and a fake text worker.

    async with open_horde() as horde:
        key = await horde.create_key("alice", kudos=100)
        async with FakeTextWorker(horde.url, key, name="w1", models=["m"]) as worker:
            ...

Public API for users' CI: runs on trio and asyncio (whichever loop calls it),
on 127.0.0.1 with an ephemeral port and a temporary SQLite database.
"""

from hordelite.clock import ManualClock
from hordelite.testing._fake_worker import FakeChatWorker, FakeTextWorker
from hordelite.testing._instance import TestHorde, open_horde
from hordelite.worker.fake_backend import FakeBackend, FakeBackendConfig, open_fake_backend

__all__ = [
    "FakeBackend",
    "FakeBackendConfig",
    "FakeChatWorker",
    "FakeTextWorker",
    "ManualClock",
    "TestHorde",
    "open_fake_backend",
    "open_horde",
]
