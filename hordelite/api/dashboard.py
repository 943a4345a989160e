"""The web dashboard and chat playground at ``/`` (decisions 0044, 0048).

Server-rendered HTML of the pool, capped (the models with most threads, the
workers with most jobs done, each list with how many more there are); a
static script refreshes it from the dashboard's own read-only routes,
``/dashboard/pool`` (the same figures as JSON) and ``/dashboard/activity``.
The page and the pool are rendered at most once per DASHBOARD_POOL_SECONDS
and the bytes reused for every client, so neither their size nor their cost
grows with the pool or the pages open. The playground talks to ``/v1`` like
any OpenAI client. Names and replies come from strangers: the template
autoescapes, the script sets only ``textContent``, and the page's
Content-Security-Policy runs no script but the static file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from quart import Blueprint, Response, render_template

from hordelite.clock import Clock
from hordelite.contract.limits import DASHBOARD_POOL_SECONDS, DASHBOARD_WORKER_MODELS
from hordelite.horde.activity import Activity, ActivityCache
from hordelite.horde.results import PoolOverview, WorkerAnswer
from hordelite.horde.service import Horde
from hordelite.http.answer import Answer, json_answer
from hordelite.http.request import Request

# Where the page's static files are served (by the shell, hordelite/http/shell.py).
STATIC_ROUTE = "/dashboard/static"

# Scripts and styles from this origin only (no inline script, so markup that
# slipped into the page could not run), calls to this origin only, and no
# framing, forms or base rewriting.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


# On every answer of the dashboard: its page, its files and its JSON.
PAGE_HEADERS = (
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
)


def files() -> Blueprint:
    """The page's template and static files, for the shell to serve."""
    return Blueprint(
        "dashboard",
        __name__,
        template_folder="templates",
        static_folder="static",
        static_url_path=STATIC_ROUTE,
    )


def worker_status(w: WorkerAnswer) -> str:
    if not w.online:
        return "offline"
    return "maintenance" if w.maintenance else "online"


def render_pool(pool: PoolOverview) -> dict[str, Any]:
    """The dashboard's pool (``GET /dashboard/pool``, and what ``/`` renders):
    every list capped, each with how many more there are, so that its size
    does not grow with the pool (decision 0048)."""
    return {
        "models": [
            {
                "name": m.name,
                "workers": m.workers,
                "threads": m.count,
                "jobs": m.jobs,
                "queued": m.queued,
                "eta": m.eta,
                "performance": m.performance,
                "chat_features": None if m.chat is None else m.chat["features"],
            }
            for m in pool.models
        ],
        "more_models": pool.models_total - len(pool.models),
        "workers": [
            {
                "name": w.name,
                "models": list(w.models[:DASHBOARD_WORKER_MODELS]),
                "more_models": max(len(w.models) - DASHBOARD_WORKER_MODELS, 0),
                "performance": f"{w.speed:.1f} tokens per second",
                "threads": w.threads,
                "jobs_done": w.requests_fulfilled,
                "status": worker_status(w),
            }
            for w in pool.workers
        ],
        "more_workers": pool.workers_total - len(pool.workers),
        "chat_models": list(pool.chat_models),
        "more_chat_models": pool.chat_models_total - len(pool.chat_models),
    }


class RenderedPages:
    """The dashboard's pool answers as bytes, each rendered at most once per
    DASHBOARD_POOL_SECONDS (of the horde's clock) and the same bytes sent to
    every client meanwhile: the pages polling cost one rendering a period,
    not one each."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = anyio.Lock()
        self._pages: dict[str, tuple[float, bytes]] = {}

    async def get(self, name: str, render: Callable[[], Awaitable[bytes]]) -> bytes:
        async with self._lock:  # the first caller renders, the others wait for its bytes
            now = self._clock.now()
            cached = self._pages.get(name)
            if cached is None or now - cached[0] >= DASHBOARD_POOL_SECONDS:
                cached = (now, await render())
                self._pages[name] = cached
            return cached[1]


class DashboardRoutes:
    """The page (a shell view: a template) and its two JSON routes."""

    def __init__(self, horde: Horde) -> None:
        self.horde = horde
        self._pages = RenderedPages(horde.clock)
        self._activity = ActivityCache(horde.store, horde.clock)

    async def page(self) -> Response:
        """``GET /``, rendered by the shell (Quart's templates)."""

        async def render() -> bytes:
            html = await render_template(
                "dashboard.html",
                version=self.horde.upkeep.heartbeat()["version"],
                pool=render_pool(await self.horde.directory.pool_overview()),
            )
            return html.encode()

        body = await self._pages.get("page", render)
        return Response(body, content_type="text/html; charset=utf-8")

    async def pool(self, request: Request) -> Answer:
        async def render() -> bytes:
            # UTF-8 rather than \u escapes: a character of a name takes at
            # most 6 bytes (a control character's escape), not 12 (one
            # outside the BMP), which keeps the bound the docs state.
            pool = render_pool(await self.horde.directory.pool_overview())
            return json.dumps(pool, ensure_ascii=False).encode()

        body = await self._pages.get("pool", render)
        return Answer(200, [("content-type", "application/json"), *PAGE_HEADERS], body)

    async def activity(self, request: Request) -> Answer:
        return json_answer(_render_activity(await self._activity.get()), headers=PAGE_HEADERS)


def _render_activity(a: Activity) -> dict[str, Any]:
    return {
        "bucket_seconds": a.bucket_seconds,
        "window_seconds": a.window_seconds,
        "buckets": [dataclasses.asdict(m) for m in a.buckets],
    }
