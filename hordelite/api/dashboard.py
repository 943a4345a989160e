"""The web dashboard and chat playground at ``/`` (decision 0044).

Server-rendered HTML from the same service calls as ``/api/v2/status/models``
and ``/api/v2/workers``; a static script refreshes it from those routes and
from ``/dashboard/activity``, the one route of its own (read-only, no input,
one aggregate query per cache period). The playground talks to ``/v1`` like
any OpenAI client. Names and replies come from strangers: the template
autoescapes, the script sets only ``textContent``, and the page's
Content-Security-Policy runs no script but the static file.
"""

from __future__ import annotations

import math
from typing import Any

import anyio
from quart import Blueprint, Response, current_app, render_template

from hordelite._request import horde
from hordelite.api import _render
from hordelite.api.native import json_response
from hordelite.contract.limits import (
    DASHBOARD_BUCKET_SECONDS,
    DASHBOARD_CACHE_SECONDS,
    DASHBOARD_WINDOW_SECONDS,
)
from hordelite.horde.service import Horde
from hordelite.storage.activity import done_jobs_per_bucket

dashboard = Blueprint(
    "dashboard",
    __name__,
    template_folder="templates",
    static_folder="static",
    static_url_path="/dashboard/static",
)

# Scripts and styles from this origin only (no inline script, so markup that
# slipped into the page could not run), calls to this origin only, and no
# framing, forms or base rewriting.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@dashboard.after_request
async def _headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def worker_status(worker: dict[str, Any]) -> str:
    if not worker["online"]:
        return "offline"
    return "maintenance" if worker["maintenance_mode"] else "online"


def workers_per_model(workers: list[dict[str, Any]]) -> dict[str, int]:
    """Online workers out of maintenance, per model they serve."""
    counts: dict[str, int] = {}
    for w in workers:
        if worker_status(w) == "online":
            for model in w["models"]:
                counts[model] = counts.get(model, 0) + 1
    return counts


@dashboard.get("/")
async def page() -> str:
    service = horde()
    models = [_render.model(m) for m in await service.model_stats(with_chat=True)]
    workers = [_render.worker(w) for w in await service.workers()]
    return await render_template(
        "dashboard.html",
        version=service.heartbeat()["version"],
        models=models,
        workers=workers,
        per_model=workers_per_model(workers),
        # The playground reaches only what /v1 can name: chat models without a colon.
        chat_models=[m["name"] for m in models if "chat" in m and ":" not in m["name"]],
        status=worker_status,
    )


class _Activity:
    """The activity figures as last read, for DASHBOARD_CACHE_SECONDS."""

    def __init__(self) -> None:
        self._lock = anyio.Lock()
        self._body: dict[str, Any] = {}
        self._read_at = -math.inf

    async def get(self, service: Horde) -> dict[str, Any]:
        async with self._lock:  # one read for every page polling at once
            now = service.clock.now()
            if not 0 <= now - self._read_at < DASHBOARD_CACHE_SECONDS:
                self._body = await activity(service, now)
                self._read_at = now
            return self._body


async def activity(service: Horde, now: float) -> dict[str, Any]:
    """Jobs done, their tokens and mean latency per bucket, oldest first; the
    last bucket is the current, partial one."""
    window = min(DASHBOARD_WINDOW_SECONDS, service.rules.retention)
    count = max(1, int(window // DASHBOARD_BUCKET_SECONDS))
    end = (math.floor(now / DASHBOARD_BUCKET_SECONDS) + 1) * DASHBOARD_BUCKET_SECONDS
    start = end - count * DASHBOARD_BUCKET_SECONDS
    found = {
        b.index: b
        for b in await service.db.read(done_jobs_per_bucket, start, DASHBOARD_BUCKET_SECONDS, count)
    }
    buckets = []
    for i in range(count):
        b = found.get(i)
        buckets.append(
            {
                "start": start + i * DASHBOARD_BUCKET_SECONDS,
                "jobs": b.jobs if b else 0,
                "tokens": b.tokens if b else 0,
                "latency": round(b.latency, 3) if b else None,
            }
        )
    return {
        "bucket_seconds": DASHBOARD_BUCKET_SECONDS,
        "window_seconds": count * DASHBOARD_BUCKET_SECONDS,
        "buckets": buckets,
    }


@dashboard.get("/dashboard/activity")
async def activity_route() -> Response:
    cache = current_app.config.setdefault("DASHBOARD_ACTIVITY", _Activity())
    return json_response(await cache.get(horde()))
