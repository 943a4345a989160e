from __future__ import annotations

import functools
import ssl
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

import httpx


@functools.cache
def _tls() -> ssl.SSLContext:
    # Built once: each new context costs tens of milliseconds.
    return ssl.create_default_context()


def echo(prompt: str) -> str:
    """The fake worker's default generation: deterministic, from the prompt."""
    return f"echo: {prompt[-200:]}"


class FakeTextWorker:
    """A text worker over real HTTP, the way AI Horde bridges behave.

    ``pop()`` returns the whole pop answer; ``serve_one()`` pops (long-polling
    up to ``wait`` seconds) and submits ``generate(prompt)``.
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        name: str = "fake-worker",
        models: Sequence[str] = ("fake-model",),
        max_length: int = 512,
        max_context_length: int = 4096,
        generate: Callable[[str], str] = echo,
        **pop_fields: Any,
    ) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.name = name
        self.models = list(models)
        self.max_length = max_length
        self.max_context_length = max_context_length
        self.generate = generate
        self.pop_fields = pop_fields
        self.client = httpx.AsyncClient(
            base_url=self.url + "/api/v2",
            headers={"apikey": api_key, "Client-Agent": "hordelite-fake-worker:1:test"},
            timeout=60,
            verify=_tls(),
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.client.aclose()

    def pop_body(self, wait: float = 0) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.name,
            "models": self.models,
            "max_length": self.max_length,
            "max_context_length": self.max_context_length,
            "bridge_agent": "hordelite-fake-worker:1:test",
            **self.pop_fields,
        }
        if wait:
            body["wait"] = wait
        return body

    async def pop(self, wait: float = 0) -> dict[str, Any]:
        """The pop answer (raises httpx.HTTPStatusError on a refusal)."""
        response = await self.client.post("/generate/text/pop", json=self.pop_body(wait))
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    async def submit(
        self, job_id: str, generation: str, state: str = "ok", **extra: Any
    ) -> dict[str, Any]:
        body = {"id": job_id, "generation": generation, "state": state, **extra}
        response = await self.client.post("/generate/text/submit", json=body)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    async def serve_one(self, wait: float = 10) -> dict[str, Any] | None:
        """Pop one job and submit its generation; returns the job, or None."""
        job = await self.pop(wait)
        if job["id"] is None:
            return None
        await self.submit(job["id"], self.generate(job["payload"]["prompt"]), seed=1)
        return job


def colour_reply(job: dict[str, Any]) -> dict[str, Any]:
    """The fake chat worker's default reply: a short answer naming the last user message."""
    messages = job["payload"].get("messages") or []
    last = next((m for m in reversed(messages) if m.get("role") == "user"), {"content": ""})
    content = last["content"]
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if p.get("type") == "text")
    return {
        "message": {"role": "assistant", "content": f"reply to: {content[-200:]}"},
        "finish_reason": "stop",
    }


class FakeChatWorker(FakeTextWorker):
    """A text worker that also declares chat on every pop (worker guide, step 1).

    ``reply(job)`` builds the structured submit (message, finish_reason and
    any token counts); ``serve_one()`` pops and submits it with the assigned
    ``model_id``. ``fault(job, reason)`` faults a job.
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        model_id: str = "fake-chat-model",
        chat_features: Sequence[str] = ("prompt_overflow_refused",),
        chat_limits: dict[str, Any] | None = None,
        image_transports: Sequence[str] = (),
        prompt_jobs: bool = True,
        reply: Callable[[dict[str, Any]], dict[str, Any]] = colour_reply,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", "fake-chat-worker")
        kwargs.setdefault("models", [model_id])
        super().__init__(url, api_key, **kwargs)
        self.model_id = model_id
        self.chat_features = list(chat_features)
        self.chat_limits = chat_limits or {"max_context_length": 8192, "max_length": 1024}
        self.image_transports = list(image_transports)
        self.prompt_jobs = prompt_jobs
        self.reply = reply

    def pop_body(self, wait: float = 0) -> dict[str, Any]:
        body = super().pop_body(wait)
        body.update(
            chat_jobs=True,
            chat_features=self.chat_features,
            chat_limits=self.chat_limits,
            model_id=self.model_id,
            image_transports=self.image_transports,
        )
        if not self.prompt_jobs:
            body["prompt_jobs"] = False
        return body

    async def submit_reply(self, job: dict[str, Any], reply: dict[str, Any]) -> httpx.Response:
        """Submit a structured reply; returns the raw response (refusals included)."""
        body = {"id": job["id"], "model_id": job["model"], "state": "ok", **reply}
        return await self.client.post("/generate/text/submit", json=body)

    async def fault(self, job: dict[str, Any], reason: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"id": job["id"], "state": "faulted", "model_id": job["model"]}
        if reason is not None:
            body["fault_reason"] = reason
        return await self.client.post("/generate/text/submit", json=body)

    async def serve_one(self, wait: float = 10) -> dict[str, Any] | None:
        """Pop one job; a chat job gets ``reply(job)``, a text job ``generate(prompt)``."""
        job = await self.pop(wait)
        if job["id"] is None:
            return None
        if job.get("chat"):
            response = await self.submit_reply(job, self.reply(job))
            response.raise_for_status()
        else:
            await self.submit(job["id"], self.generate(job["payload"]["prompt"]), seed=1)
        return job
