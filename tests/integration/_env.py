"""One set-up for the integration tests: a running horde on the test's
database, a client, a funded requester, a worker owner, and the fake workers
a test asks for.

    async with open_env() as env:
        worker = await env.text_worker(models=["m1"])
        request_id = await env.submit_text("Hello", models=["m1"])

The event loop comes from the ``anyio_backend`` fixture (tests/conftest.py,
trio and asyncio). The database is a temporary SQLite file unless the test
asks for the ``chat_database`` fixture (tests/integration/conftest.py), which
runs it on SQLite and on PostgreSQL; ``open_env(database=...)`` names one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar, TypeVar

import httpx

from hordelite.testing import FakeTextWorker, TestHorde, open_horde
from tests.integration import _helpers

# One TLS context for every client: httpx builds one per client otherwise.
TLS = ssl.create_default_context()

# The database of the running test, set by the chat_database fixture: None is
# open_horde's temporary SQLite file, else a postgresql:// URL whose
# connections live in a schema of the test's own.
_database: list[str | None] = [None]


def select_database(url: str | None) -> None:
    """The database the next hordes of this test open (the fixture calls it)."""
    _database[0] = url


def open_suite_horde(**config: Any) -> contextlib.AbstractAsyncContextManager[TestHorde]:
    """``open_horde`` on the test's database, unless ``database`` is given."""
    config.setdefault("database", _database[0])
    return open_horde(**config)


T = TypeVar("T")


def client_for(horde: TestHorde, **kwargs: Any) -> httpx.AsyncClient:
    """A client of ``horde`` (to be entered). Its timeout, 30 s unless
    given, is for a busy machine: a test's own deadline is what fails it."""
    kwargs.setdefault("timeout", 30)
    return httpx.AsyncClient(base_url=horde.url, verify=TLS, **kwargs)


@dataclasses.dataclass
class Env:
    """A running horde with a client, a requester (``alice``) and a worker
    owner (``bob``); the workers it makes close with it."""

    horde: TestHorde
    client: httpx.AsyncClient
    requester: str
    owner: str
    stack: contextlib.AsyncExitStack
    # The model a worker serves and a request asks for unless told otherwise.
    model: ClassVar[str] = "m1"

    async def enter(self, context: contextlib.AbstractAsyncContextManager[T]) -> T:
        """``context`` entered until the horde closes."""
        return await self.stack.enter_async_context(context)

    async def text_worker(
        self,
        name: str = "fake-worker",
        models: Sequence[str] | None = None,
        *,
        key: str | None = None,
        **kwargs: Any,
    ) -> FakeTextWorker:
        """A fake text worker of ``key`` (the owner's by default), not yet popped."""
        models = (self.model,) if models is None else models
        worker = FakeTextWorker(
            self.horde.url, key or self.owner, name=name, models=models, **kwargs
        )
        return await self.enter(worker)

    async def submit_text(
        self, prompt: str = "Once upon", *, key: str | None = None, **params: Any
    ) -> str:
        """Queue a text request of ``key`` (the requester's by default) for
        ``models=`` (the set-up's model by default; ``()``: any); ``params``
        are its generation parameters. Returns its id (fails the test on a
        refusal)."""
        models = params.pop("models", (self.model,))
        return await _helpers.submit_text(
            self.client, key or self.requester, prompt, models=models, **params
        )

    async def text_status(self, request_id: str) -> dict[str, Any]:
        return await _helpers.text_status(self.client, request_id)

    async def kudos(self, key: str | None = None) -> float:
        return await _helpers.kudos_of(self.client, key or self.requester)

    async def worker_details(self, name: str) -> dict[str, Any]:
        response = await self.client.get(f"/api/v2/workers/name/{name}")
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]


E = TypeVar("E", bound="Env")


@contextlib.asynccontextmanager
async def open_env_of(
    kind: type[E], *, requester_kudos: float = 100, owner_kudos: float = 0, **config: Any
) -> AsyncIterator[E]:
    """A horde (``config`` as ``open_horde`` takes it) on the test's database,
    with a client, a requester holding ``requester_kudos`` and a worker owner
    holding ``owner_kudos``. User names are unique: a test's other users
    take names other than alice and bob."""
    async with open_suite_horde(**config) as horde, contextlib.AsyncExitStack() as stack:
        requester = await horde.create_key("alice", kudos=requester_kudos)
        owner = await horde.create_key("bob", kudos=owner_kudos)
        client = await stack.enter_async_context(client_for(horde))
        yield kind(horde, client, requester, owner, stack)


def open_env(**config: Any) -> contextlib.AbstractAsyncContextManager[Env]:
    """``open_env_of(Env, ...)``: the text tests' set-up."""
    return open_env_of(Env, **config)
