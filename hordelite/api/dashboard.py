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

import dataclasses
from typing import Any

from quart import Blueprint, Response, current_app, render_template

from hordelite._request import horde
from hordelite.api import _render
from hordelite.api.native import json_response
from hordelite.horde.activity import Activity, ActivityCache

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
    models = [_render.model(m) for m in await service.directory.model_stats(with_chat=True)]
    workers = [_render.worker(w) for w in await service.directory.workers()]
    return await render_template(
        "dashboard.html",
        version=service.upkeep.heartbeat()["version"],
        models=models,
        workers=workers,
        per_model=workers_per_model(workers),
        # The playground reaches only what /v1 can name: chat models without a colon.
        chat_models=[m["name"] for m in models if "chat" in m and ":" not in m["name"]],
        status=worker_status,
    )


def _activity_cache() -> ActivityCache:
    cache = current_app.config.get("DASHBOARD_ACTIVITY")
    if cache is None:
        service = horde()
        cache = ActivityCache(service.store, service.clock)
        current_app.config["DASHBOARD_ACTIVITY"] = cache
    return cache


@dashboard.get("/dashboard/activity")
async def activity() -> Response:
    return json_response(_render_activity(await _activity_cache().get()))


def _render_activity(a: Activity) -> dict[str, Any]:
    return {
        "bucket_seconds": a.bucket_seconds,
        "window_seconds": a.window_seconds,
        "buckets": [dataclasses.asdict(m) for m in a.buckets],
    }
