"""Client-side helpers for the chat integration tests (real HTTP, fake workers).

The chat suites run each test on SQLite and on PostgreSQL: their modules use
the ``chat_database`` fixture (tests/integration/conftest.py), which picks
the database ``open_suite_horde`` and ``open_chat_horde`` open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from hordelite.testing import FakeChatWorker, FakeTextWorker, TestHorde, open_horde

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


# One TLS context for every client: httpx builds one per client otherwise.
TLS = ssl.create_default_context()

CHAT_ASYNC = "/api/v2/generate/chat/async"
MODEL = "chat-model"
# Every strict request needs this guarantee (the conformance decision): a worker declaring
# only it serves plain strict requests.
STRICT = ("prompt_overflow_refused",)

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def chat_body(
    content: str = "Name one colour.",
    *,
    model: str | None = MODEL,
    max_tokens: int | None = 64,
    **fields: Any,
) -> dict[str, Any]:
    """A chat body with one user message; ``fields`` add or replace keys, and
    ``model`` or ``max_tokens`` None leaves that key out."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": content}]}
    if model is not None:
        body["model"] = model
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    body.update(fields)
    return body


def chat_status_path(request_id: str) -> str:
    return f"/api/v2/generate/chat/status/{request_id}"


def text_status_path(request_id: str) -> str:
    return f"/api/v2/generate/text/status/{request_id}"


async def pop_job(worker: FakeTextWorker) -> dict[str, Any]:
    """Pop once (no wait) and return the job; fails the test when there is none."""
    job = await worker.pop()
    assert job["id"] is not None, f"{worker.name} popped no job: {job}"
    return job


async def pop_nothing(worker: FakeTextWorker) -> None:
    """Pop once (no wait); fails the test when a job comes back."""
    job = await worker.pop()
    assert job["id"] is None, f"{worker.name} popped a job it should not get: {job}"


def assert_refused(response: httpx.Response, status: int, rc: str) -> dict[str, Any]:
    """The response is the AI Horde error envelope with this status and rc; returns its body."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["rc"] == rc, body
    assert isinstance(body["message"], str)
    assert body["message"]
    return body


@dataclasses.dataclass
class ChatEnv:
    """A running horde with a client, a requester and a worker owner."""

    horde: TestHorde
    client: httpx.AsyncClient
    requester: str
    owner: str
    stack: contextlib.AsyncExitStack

    async def chat_worker(
        self,
        name: str,
        features: Sequence[str] = STRICT,
        *,
        limits: dict[str, Any] | None = None,
        online: bool = True,
        **kwargs: Any,
    ) -> FakeChatWorker:
        """A fake chat worker of the owner; with ``online`` it pops once (finding nothing)."""
        kwargs.setdefault("model_id", MODEL)
        worker = FakeChatWorker(
            self.horde.url,
            self.owner,
            name=name,
            chat_features=features,
            chat_limits=limits,
            **kwargs,
        )
        await self.stack.enter_async_context(worker)
        if online:
            await pop_nothing(worker)
        return worker

    async def text_worker(
        self, name: str, models: Sequence[str] = (MODEL,), **kwargs: Any
    ) -> FakeTextWorker:
        """A fake text worker of the owner (no chat declaration), not yet popped."""
        worker = FakeTextWorker(self.horde.url, self.owner, name=name, models=models, **kwargs)
        return await self.stack.enter_async_context(worker)

    async def submit(
        self, body: Any, *, key: str | None = None, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        return await self.client.post(
            CHAT_ASYNC, headers={"apikey": key or self.requester, **(headers or {})}, json=body
        )

    async def queue(self, body: Any, *, key: str | None = None, **kwargs: Any) -> str:
        """Queue a chat request; returns its id (fails the test on a refusal)."""
        response = await self.submit(body, key=key, **kwargs)
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    async def submit_text(
        self, prompt: str = "Once upon", *, key: str | None = None, **params: Any
    ) -> str:
        response = await self.client.post(
            "/api/v2/generate/text/async",
            headers={"apikey": key or self.requester},
            json={"prompt": prompt, "params": params, "models": [MODEL]},
        )
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    async def status(self, request_id: str) -> dict[str, Any]:
        response = await self.client.get(chat_status_path(request_id))
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    async def worker_details(self, name: str) -> dict[str, Any]:
        response = await self.client.get(f"/api/v2/workers/name/{name}")
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    async def kudos(self, key: str | None = None) -> float:
        response = await self.client.get(
            "/api/v2/find_user", headers={"apikey": key or self.requester}
        )
        assert response.status_code == 200, response.text
        return float(response.json()["kudos"])


@contextlib.asynccontextmanager
async def open_chat_horde(
    *, requester_kudos: float = 10_000, **config: Any
) -> AsyncIterator[ChatEnv]:
    """A horde (``config`` overrides [horde] keys) with a funded requester and a worker owner."""
    async with open_suite_horde(**config) as horde, contextlib.AsyncExitStack() as stack:
        requester = await horde.create_key("alice", kudos=requester_kudos)
        owner = await horde.create_key("bob")
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=horde.url, verify=TLS))
        yield ChatEnv(horde, client, requester, owner, stack)
