"""What a route answers, whoever serves it: a status, headers, and a whole
body or a stream of pieces."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

JSON = "application/json"


@dataclasses.dataclass
class Answer:
    """An HTTP answer: a whole body, or a stream of pieces (server-sent
    events) whose ``finish`` must run once the exchange ends, however it ends
    (also when the client leaves before the stream begins)."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes = b""
    events: AsyncIterator[bytes] | None = None
    finish: Callable[[], Awaitable[None]] | None = None


def json_answer(
    body: Any,
    status: int = 200,
    headers: Iterable[tuple[str, str]] = (),
    *,
    ensure_ascii: bool = True,
) -> Answer:
    """``body`` as JSON. ``ensure_ascii=False``: UTF-8 rather than ``\\u``
    escapes (a listing whose size bound counts a name's bytes)."""
    data = json.dumps(body, ensure_ascii=ensure_ascii).encode()
    return Answer(status, [("content-type", JSON), *headers], data)
