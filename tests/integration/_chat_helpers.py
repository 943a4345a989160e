"""Client-side helpers for the chat integration tests (real HTTP, fake workers).

The chat suites run each test on SQLite and on PostgreSQL: their modules use
the ``chat_database`` fixture (tests/integration/conftest.py), which picks
the database ``open_chat_horde`` opens (tests/integration/_env.py).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import httpx

from hordelite.testing import FakeChatWorker, FakeTextWorker
from tests.chat_shapes import function_tool
from tests.integration._env import Env, open_env_of

CHAT_ASYNC = "/api/v2/generate/chat/async"
MODEL = "chat-model"
# Every strict request needs this guarantee (the conformance decision): a worker declaring
# only it serves plain strict requests.
STRICT = ("prompt_overflow_refused",)

WEATHER_TOOL: dict[str, Any] = function_tool(
    "get_weather", "The weather in a city.", strings=["city"]
)
TIME_TOOL: dict[str, Any] = function_tool("get_time", "The local time in a city.", strings=["city"])


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


def chat_price(chars: int, max_length: int, billions: float) -> tuple[float, float]:
    """(reward, charge) by the chat guide's "Pricing": tokens = min(max_length, max(20,
    ceil(chars / 4))), reward = round(tokens x billions / 21, 2), and the
    requester pays the reward plus 1."""
    tokens = min(max_length, max(20, math.ceil(chars / 4)))
    reward = round(tokens * billions / 21, 2)
    return reward, round(reward + 1, 2)


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


class ChatEnv(Env):
    """The chat tests' set-up: a requester with 10,000 kudos, workers of
    ``MODEL`` by default, and chat's own calls."""

    model: ClassVar[str] = MODEL

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

    async def status(self, request_id: str) -> dict[str, Any]:
        response = await self.client.get(chat_status_path(request_id))
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]


def open_chat_horde(
    *, requester_kudos: float = 10_000, **config: Any
) -> contextlib.AbstractAsyncContextManager[ChatEnv]:
    """A horde (``config`` overrides [horde] keys) with a funded requester and a worker owner."""
    return open_env_of(ChatEnv, requester_kudos=requester_kudos, **config)
