"""The worker's one interface to the horde: pop, submit, progress, and
the notice that it stops."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from hordelite import __version__
from hordelite.errors import HordeliteError
from hordelite.worker._client import Reply, TransportError, open_client

BRIDGE_AGENT = f"hordelite-worker:{__version__}:hordelite"
# Seconds to connect to the horde, and past a pop's long-poll to wait for its answer.
_CONNECT = 10.0
_MARGIN = 30.0


# Route prefixes an operator may copy into the horde's URL with it: the
# native API's (which the worker adds), horde_sdk's AI_HORDE_URL, and the
# OpenAI front's. Longest first, so /api/v2 is not read as ending in /v2.
_API_SUFFIXES = ("/api/v2", "/api", "/v1")


def horde_base_url(url: str) -> tuple[str, str | None]:
    """The horde's base URL, and the route prefix taken off its end (None
    when there was none): ``http://h:7001/api/v2/`` is ``http://h:7001``."""
    trimmed = url.rstrip("/")
    for suffix in _API_SUFFIXES:
        if trimmed.endswith(suffix) and "://" in trimmed[: -len(suffix)]:
            base = trimmed[: -len(suffix)]
            if base.split("://", 1)[1]:  # a host is left
                return base, suffix
    return url, None


class HordeUnavailable(HordeliteError):
    """The horde did not answer (a connection error, a timeout) or answered 5xx."""


class HordeRefusal(HordeliteError):
    """The horde refused the request: its status, ``rc`` and message."""

    def __init__(self, status: int, rc: str, message: str, body: Mapping[str, Any]) -> None:
        super().__init__(f"{status} {rc}: {message}")
        self.status = status
        self.rc = rc
        self.message = message
        self.body = body


class HordeClient:
    """The native routes a worker calls, with the owner's key."""

    def __init__(self, url: str, api_key: str, request_timeout: float = 60.0) -> None:
        self.client = open_client(
            url.rstrip("/") + "/api/v2",
            {"apikey": api_key, "Client-Agent": BRIDGE_AGENT},
            request_timeout,
            _CONNECT,
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def pop(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The pop answer; a long-polled pop (``wait``) gets that much longer."""
        wait = float(body.get("wait", 0))
        response = await self._post("/generate/text/pop", body, wait + _MARGIN)
        return _answer(response)

    async def submit(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return _answer(await self._post("/generate/text/submit", body))

    async def progress(self, job_id: str, seq: int, content: str, reasoning: str) -> Reply:
        """One progress post; the raw answer (the caller reads its status)."""
        delta: dict[str, str] = {"content": content}
        if reasoning:
            delta["reasoning_content"] = reasoning
        return await self._post(
            "/generate/text/progress", {"id": job_id, "seq": seq, "delta": delta}
        )

    async def go_offline(self, name: str) -> bool:
        """Tell the horde this worker stops (hordelite's ``online: false`` on
        ``PUT /workers/{id}``): it leaves the pool now instead of when its
        last check-in runs out. False when the horde does not know the
        worker (it never popped). Raises HordeUnavailable or HordeRefusal."""
        try:
            found = await self.client.request("GET", f"/workers/name/{quote(name, safe='')}")
        except TransportError as exc:
            raise HordeUnavailable(f"GET /workers/name: {exc!r}") from exc
        if found.status_code == 404:
            return False
        worker_id = _answer(found).get("id")
        try:
            answer = await self.client.request("PUT", f"/workers/{worker_id}", {"online": False})
        except TransportError as exc:
            raise HordeUnavailable(f"PUT /workers/{worker_id}: {exc!r}") from exc
        _answer(answer)
        return True

    async def _post(self, path: str, body: Mapping[str, Any], limit: float | None = None) -> Reply:
        try:
            return await self.client.request("POST", path, body, within=limit)
        except TransportError as exc:
            raise HordeUnavailable(f"POST {path}: {exc!r}") from exc


def _answer(response: Reply) -> dict[str, Any]:
    if response.status_code >= 500:
        raise HordeUnavailable(f"{response.status_code}: {response.text[:200]}")
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    if not response.is_success:
        raise refusal(response.status_code, body)
    return body


def refusal(status: int, body: Mapping[str, Any]) -> HordeRefusal:
    return HordeRefusal(status, str(body.get("rc", "")), str(body.get("message", "")), body)
