"""What both envelopes read from an HTTP request: the horde serving it, the
checked JSON body and the client agent.

The native routes (``hordelite.api``) and the OpenAI front (``hordelite.front``)
each render their own envelope; this module is what they share, so that
neither imports the other.
"""

from __future__ import annotations

from typing import Any, cast

import anyio.to_thread
from quart import current_app, request

from hordelite.contract import forwarded
from hordelite.contract.headers import client_agent_of
from hordelite.contract.json_body import decode_json_body
from hordelite.errors import RC
from hordelite.horde.service import Horde

# Bodies larger than this are decoded in a worker thread: a few megabytes of
# JSON take the parser tens of milliseconds, which every other connection
# would otherwise wait out.
_DECODE_OFF_LOOP_BYTES = 256 * 1024


def horde() -> Horde:
    return current_app.config["HORDE"]  # type: ignore[no-any-return]


async def json_body(*, optional: bool = False) -> Any:
    """The decoded, checked body (contract.json_body): 400 naming the field
    when it is not JSON or holds a value no route accepts; 413 past the cap.
    ``optional``: no body at all reads as ``{}`` (a route whose every field
    is optional, as the AI Horde's parsers read a missing body)."""
    raw = cast(bytes, await request.get_data(cache=False, as_text=False))
    if optional and not raw:
        return {}
    if len(raw) > _DECODE_OFF_LOOP_BYTES:
        return await anyio.to_thread.run_sync(decode_json_body, raw)
    return decode_json_body(raw)


def client_agent() -> str:
    return client_agent_of(request.headers.get("Client-Agent"), request.headers.get("client_agent"))


def public_base_url() -> str:
    """Where this request's client reached the horde, which every signed URL
    handed to it starts with: ``server.public_url`` when set, else the
    request's scheme and Host, or what a trusted proxy forwarded
    (contract.forwarded)."""
    server = horde().config.server
    if server.public_url:
        return server.public_url.rstrip("/")
    peer = request.scope.get("client")
    listening = request.scope.get("server")
    headers = request.headers
    return forwarded.request_base_url(
        scheme=request.scheme,
        host=headers.get("Host", ""),
        server=_address(listening) if listening else "localhost",
        peer=peer[0] if peer else None,
        trusted=forwarded.parse_trusted_proxies(server.trusted_proxies),
        forwarded=_joined(headers.getlist("Forwarded")),
        forwarded_proto=_joined(headers.getlist("X-Forwarded-Proto")),
        forwarded_host=_joined(headers.getlist("X-Forwarded-Host")),
    )


def client_address() -> str | None:
    """The client's address as the anonymous budgets count it: the peer's,
    or what a trusted proxy forwarded (contract.forwarded.client_address)."""
    peer = request.scope.get("client")
    return forwarded.client_address(
        peer[0] if peer else None,
        forwarded.parse_trusted_proxies(horde().config.server.trusted_proxies),
        _joined(request.headers.getlist("X-Forwarded-For")),
    )


def _joined(values: list[str]) -> str | None:
    # Repeated header lines are one comma-separated list (RFC 9110 5.3).
    return ", ".join(values) if values else None


def _address(listening: tuple[str, int | None]) -> str:
    host, port = listening
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}" if port else host


def count_refusal(rc: RC) -> None:
    """A refusal answered, in the metrics by its return code (a closed set)."""
    horde().metrics.refusals.labels(rc.name).inc()
