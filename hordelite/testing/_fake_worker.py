from __future__ import annotations

import functools
import ssl
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

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

    async def __aenter__(self) -> FakeTextWorker:
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
