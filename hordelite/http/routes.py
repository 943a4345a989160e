"""The route table: every route the horde answers, with its method, its
handler and its envelope, in one list (``horde_routes``), and the apps that
serve it (``horde_app``, ``metrics_app``).

The one module of hordelite/http that knows the horde: it sits above the
native routes (hordelite/api) and the /v1 front (hordelite/front), which
never import each other, and the rest of hordelite/http sits below all three
(tests/unit/test_imports.py).
"""

from __future__ import annotations

import dataclasses
from typing import cast

from hordelite.api.blobs import BlobRoutes
from hordelite.api.dashboard import PAGE_HEADERS, STATIC_ROUTE, DashboardRoutes, files
from hordelite.api.health import HealthRoutes
from hordelite.api.metrics import MetricsRoutes
from hordelite.api.native import NativeRoutes
from hordelite.api.native_about import AboutRoutes
from hordelite.api.native_addresses import AddressRoutes
from hordelite.api.native_filters import FilterRoutes
from hordelite.api.native_keys import SharedKeyRoutes
from hordelite.api.native_modes import ModeRoutes
from hordelite.api.operations import OperationsRoutes
from hordelite.blobs import DirectoryStore
from hordelite.contract.signing import BLOB_ROUTE
from hordelite.front.messages import MessagesRoutes, probe
from hordelite.front.openai import Admission, OpenAIRoutes
from hordelite.front.responses import ResponsesRoutes
from hordelite.horde.service import Horde
from hordelite.http import envelopes
from hordelite.http.dispatch import Dispatcher, Handler, Route, Table
from hordelite.http.guard import ASGIApp
from hordelite.http.request import Settings
from hordelite.http.shell import shell_app

V2 = "/api/v2"


def _native(method: str, template: str, handler: Handler) -> Route:
    return Route(method, template, handler, envelopes.native)


def _openai(method: str, template: str, handler: Handler) -> Route:
    return Route(method, template, handler, envelopes.openai)


def _anthropic(method: str, template: str, handler: Handler) -> Route:
    return Route(method, template, handler, envelopes.anthropic)


def horde_routes(
    horde: Horde,
    front: OpenAIRoutes,
    blobs: DirectoryStore | None,
    counts: MetricsRoutes | None = None,
) -> list[Route]:
    """Every route of the horde's port, as its configuration has them:
    the dashboard with ``[dashboard] enabled``, ``/metrics`` with metrics on
    and no port of their own (``counts`` serves it), ``/blobs`` with a
    directory store."""
    native = NativeRoutes(horde)
    about = AboutRoutes(horde)
    keys = SharedKeyRoutes(horde)
    modes = ModeRoutes(horde)
    filters = FilterRoutes(horde)
    health = HealthRoutes(horde)
    addresses = AddressRoutes(horde)
    operations = OperationsRoutes(horde)
    responses = ResponsesRoutes(front)
    messages = MessagesRoutes(front)
    routes = [
        # Generation: clients submit and poll, workers pop, progress, submit.
        _native("POST", f"{V2}/generate/text/async", native.text_async),
        _native("POST", f"{V2}/generate/chat/async", native.chat_async),
        _native("GET", f"{V2}/generate/text/status/<request_id>", native.text_status),
        _native("DELETE", f"{V2}/generate/text/status/<request_id>", native.text_cancel),
        _native("GET", f"{V2}/generate/chat/status/<request_id>", native.chat_status),
        _native("DELETE", f"{V2}/generate/chat/status/<request_id>", native.chat_cancel),
        _native("GET", f"{V2}/generate/text/request/<request_id>", native.text_request),
        _native("POST", f"{V2}/generate/text/pop", native.text_pop),
        _native("POST", f"{V2}/generate/text/progress", native.text_progress),
        _native("POST", f"{V2}/generate/text/submit", native.text_submit),
        # The horde, its models and what it says of itself.
        _native("GET", f"{V2}/status/heartbeat", native.heartbeat),
        _native("GET", f"{V2}/status/models", native.status_models),
        _native("GET", f"{V2}/status/models/<path:name>", native.status_model),
        _native("GET", f"{V2}/status/performance", about.performance),
        _native("GET", f"{V2}/status/modes", modes.show),
        _native("PUT", f"{V2}/status/modes", modes.set),
        _native("GET", f"{V2}/status/news", about.news),
        _native("GET", f"{V2}/stats/text/totals", about.text_totals),
        _native("GET", f"{V2}/stats/text/models", about.text_models),
        _native("GET", f"{V2}/documents/terms", about.terms),
        _native("GET", f"{V2}/documents/privacy", about.privacy),
        _native("GET", f"{V2}/documents/sponsors", about.sponsors),
        _native("GET", f"{V2}/teams", about.teams),
        _native("GET", f"{V2}/teams/<team_id>", about.team),
        _native("GET", f"{V2}/styles/text", about.text_styles),
        # Workers and their messages.
        _native("GET", f"{V2}/workers", native.workers),
        _native("GET", f"{V2}/workers/<worker_id>", native.worker),
        _native("PUT", f"{V2}/workers/<worker_id>", native.worker_update),
        _native("DELETE", f"{V2}/workers/<worker_id>", native.worker_delete),
        _native("GET", f"{V2}/workers/name/<path:name>", native.worker_by_name),
        _native("GET", f"{V2}/workers/messages", native.worker_messages),
        _native("POST", f"{V2}/workers/messages", native.worker_message_send),
        _native("GET", f"{V2}/workers/messages/<message_id>", native.worker_message),
        _native("DELETE", f"{V2}/workers/messages/<message_id>", native.worker_message_delete),
        # Users, kudos and shared keys.
        _native("GET", f"{V2}/find_user", native.find_user),
        _native("GET", f"{V2}/users", native.users),
        _native("GET", f"{V2}/users/<user_id>", native.user),
        _native("PUT", f"{V2}/users/<user_id>", native.modify_user),
        _native("POST", f"{V2}/kudos/transfer", native.kudos_transfer),
        _native("PUT", f"{V2}/sharedkeys", keys.create),
        _native("GET", f"{V2}/sharedkeys/<key_id>", keys.details),
        _native("PATCH", f"{V2}/sharedkeys/<key_id>", keys.edit),
        _native("DELETE", f"{V2}/sharedkeys/<key_id>", keys.delete),
        # Timeouts and blocks by address (admins).
        _native("GET", f"{V2}/operations/ipaddr", addresses.listed),
        _native("POST", f"{V2}/operations/ipaddr", addresses.time_out),
        _native("DELETE", f"{V2}/operations/ipaddr", addresses.lift),
        _native("GET", f"{V2}/operations/ipaddr/<path:ipaddr>", addresses.one),
        _native("PUT", f"{V2}/operations/block_worker_ipaddr/<worker_id>", addresses.block_worker),
        _native(
            "DELETE", f"{V2}/operations/block_worker_ipaddr/<worker_id>", addresses.unblock_worker
        ),
        # hordelite's own admin routes (the AI Horde has none of them).
        _native("GET", f"{V2}/operations/audit", operations.audit),
        # The AI Horde's moderation review, for admins (native_api.md).
        _native("GET", f"{V2}/operations/moderation", operations.moderation),
        _native("GET", f"{V2}/operations/moderation/prompts", operations.prompt_events),
        _native(
            "POST", f"{V2}/operations/moderation/prompts/<event_id>/notes", operations.prompt_note
        ),
        _native(
            "GET",
            f"{V2}/operations/moderation/worker_suspicion_events",
            operations.suspicion_events,
        ),
        # Prompt filters, for admins (docs/reference/filters.md).
        _native("GET", f"{V2}/filters", filters.listing),
        _native("PUT", f"{V2}/filters", filters.create),
        _native("POST", f"{V2}/filters", filters.test),
        _native("GET", f"{V2}/filters/regex", filters.regex),
        _native("GET", f"{V2}/filters/<filter_id>", filters.one),
        _native("PATCH", f"{V2}/filters/<filter_id>", filters.edit),
        _native("DELETE", f"{V2}/filters/<filter_id>", filters.delete),
        # The OpenAI front.
        _openai("POST", "/v1/chat/completions", front.chat_completions),
        _openai("POST", "/v1/completions", front.completions),
        # OpenAI's shape, or Anthropic's for a client sending anthropic-version.
        _openai("GET", "/v1/models", messages.models),
        _openai("GET", "/v1/models/<path:model>", messages.model),
        # OpenAI's Responses API (decision 0078).
        _openai("POST", "/v1/responses", responses.create),
        _openai("GET", "/v1/responses/<response_id>", responses.retrieve),
        _openai("DELETE", "/v1/responses/<response_id>", responses.delete),
        # Anthropic's Messages API, run as chat requests by the same front.
        _anthropic("POST", "/v1/messages", messages.messages),
        _anthropic("POST", "/v1/messages/count_tokens", messages.count_tokens),
        # For process managers and load balancers.
        _native("GET", "/healthz", health.healthz),
        _native("GET", "/readyz", health.readyz),
    ]
    if horde.config.dashboard.enabled:
        dashboard = DashboardRoutes(horde)
        routes += [
            Route("GET", "/", None, envelopes.native, view=dashboard.page),
            Route("GET", f"{STATIC_ROUTE}/<path:filename>", None, envelopes.native),
            _native("GET", "/dashboard/pool", dashboard.pool),
            _native("GET", "/dashboard/activity", dashboard.activity),
        ]
    else:
        # Claude Code probes the root before its first call; the page's
        # route answers it when the dashboard is on.
        routes.append(_native("HEAD", "/", probe))
    if horde.config.metrics.enabled and not horde.config.metrics.port:
        routes.append(_native("GET", "/metrics", (counts or MetricsRoutes(horde)).metrics))
    if blobs is not None:
        routes.append(_native("GET", f"{BLOB_ROUTE}/<key>", BlobRoutes(blobs, horde.clock).blob))
    return routes


@dataclasses.dataclass(frozen=True)
class HordeApp:
    """The horde's port: its dispatcher (the ASGI app) and the front's open
    calls, which a stop drains."""

    dispatcher: Dispatcher
    admission: Admission


def horde_app(horde: Horde, backend: str = "trio", blobs: DirectoryStore | None = None) -> HordeApp:
    """The app serving ``horde``; with ``blobs``, also its blobs' signed
    URLs (``GET /blobs/<key>``)."""
    front = OpenAIRoutes(horde)
    counts = MetricsRoutes(horde)
    routes = horde_routes(horde, front, blobs, counts)
    shell: ASGIApp | None = None
    if any(route.handler is None for route in routes):
        # Quart types the ASGI call with its own message dicts.
        shell = cast(
            ASGIApp, shell_app(backend, routes, files(), PAGE_HEADERS, counts.count_refusal)
        )
    dispatcher = Dispatcher(
        Table(routes),
        Settings.of(horde.config.server),
        shell=shell,
        allowed_origins=horde.config.server.allowed_origins,
        # With metrics off nothing reads the count: no request pays for it.
        count_answer=counts.count_answer if horde.config.metrics.enabled else None,
        count_refusal=counts.count_refusal,
    )
    return HordeApp(dispatcher, front.admission)


def metrics_app(horde: Horde) -> Dispatcher:
    """The app of ``[metrics] port``: ``/metrics``, and a JSON 404 for the rest."""
    counts = MetricsRoutes(horde)
    routes = [_native("GET", "/metrics", counts.metrics)]
    return Dispatcher(
        Table(routes), Settings.of(horde.config.server), count_refusal=counts.count_refusal
    )
