"""What the horde says of itself: its load, the operator's news and
documents (the AI Horde's /status and /documents routes; its modes are
hordelite.horde.modes)."""

from __future__ import annotations

import html
from typing import Literal

import anyio

from hordelite.contract.limits import PERFORMANCE_TTL, STATS_TTL
from hordelite.errors import bad_request
from hordelite.horde._core import HordeCore
from hordelite.horde.results import Document, NewsPiece, Performance
from hordelite.storage.stats import TextStats

# The documents the operator writes in [notices], by their route's name.
DocumentName = Literal["terms", "privacy", "sponsors"]
DOCUMENT_FORMATS = ("html", "markdown")
# "The last minute" of past_minute_tokens.
_MINUTE = 60.0


class About:
    """The horde's own status, as every client may read it."""

    def __init__(self, core: HordeCore) -> None:
        self._core = core
        self._lock = anyio.Lock()
        self._performance: tuple[float, Performance] | None = None
        self._stats_lock = anyio.Lock()
        self._stats: tuple[float, TextStats] | None = None

    async def performance(self) -> Performance:
        """The load, summed over the queue and the pool at most once per
        PERFORMANCE_TTL however many clients ask."""
        async with self._lock:
            now = self._core.clock.now()
            cached = self._performance
            if cached is None or not 0 <= now - cached[0] < PERFORMANCE_TTL:
                load = await self._core.store.horde_load(now=now, since=now - _MINUTE)
                cached = (
                    now,
                    Performance(
                        queued_requests=load.queued_requests,
                        queued_tokens=load.queued_tokens,
                        workers=load.workers,
                        threads=load.threads,
                        past_minute_tokens=load.recent_tokens,
                    ),
                )
                self._performance = cached
            return cached[1]

    async def stats(self) -> TextStats:
        """Jobs done per period and model, summed at most once per STATS_TTL."""
        async with self._stats_lock:
            now = self._core.clock.now()
            cached = self._stats
            if cached is None or not 0 <= now - cached[0] < STATS_TTL:
                cached = (now, await self._core.store.text_stats(now=now))
                self._stats = cached
            return cached[1]

    def news(self) -> tuple[NewsPiece, ...]:
        n = self._core.config.notices
        if not n.news:
            return ()
        return (NewsPiece(n.news_title, n.news, n.news_importance, n.news_published),)

    def document(self, name: DocumentName, fmt: str | None) -> Document:
        """The operator's ``terms``, ``privacy`` or ``sponsors``, as written (Markdown) or as
        HTML (the AI Horde's default format): escaped, one paragraph for each
        block between blank lines."""
        fmt = "html" if fmt is None else fmt
        if fmt not in DOCUMENT_FORMATS:
            raise bad_request("format", "must be html or markdown")
        text: str = getattr(self._core.config.notices, name)
        if fmt == "markdown":
            return Document(fmt, text)
        blocks = [b.strip() for b in text.replace("\r\n", "\n").split("\n\n")]
        return Document(fmt, "".join(f"<p>{html.escape(b)}</p>" for b in blocks if b))
