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

from hordelite.contract.json_body import decode_json_body
from hordelite.errors import RC
from hordelite.horde.service import Horde

# Bodies larger than this are decoded in a worker thread: a few megabytes of
# JSON take the parser tens of milliseconds, which every other connection
# would otherwise wait out.
_DECODE_OFF_LOOP_BYTES = 256 * 1024


def horde() -> Horde:
    return current_app.config["HORDE"]  # type: ignore[no-any-return]


async def json_body() -> Any:
    """The decoded, checked body (contract.json_body): 400 naming the field
    when it is not JSON or holds a value no route accepts; 413 past the cap."""
    raw = cast(bytes, await request.get_data(cache=False, as_text=False))
    if len(raw) > _DECODE_OFF_LOOP_BYTES:
        return await anyio.to_thread.run_sync(decode_json_body, raw)
    return decode_json_body(raw)


def client_agent() -> str:
    # koboldcpp and most tools send Client-Agent; horde_sdk sends client_agent.
    return (
        request.headers.get("Client-Agent")
        or request.headers.get("client_agent")
        or "unknown:0:unknown"
    )


def count_refusal(rc: RC) -> None:
    """A refusal answered, in the metrics by its return code (a closed set)."""
    horde().metrics.refusals.labels(rc.name).inc()
