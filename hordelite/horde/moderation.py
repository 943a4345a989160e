"""Prompt filters (docs/reference/filters.md): admins manage them
(``/filters``), and every text and chat request is screened by them before
anything of it is stored or charged.

Screened: a text request's prompt (dry runs too: a dry run answers what the
request would get), and every message of a chat request as submitted, before
context_fit drops any; the OpenAI front's calls come through the same paths.
A refused request is answered 400 CorruptPrompt, whose message never echoes
what matched, and recorded as ``request.refused``; a flagged one is served
and recorded as ``request.flagged``; a replace rule's match is replaced in
what is stored and sent to the worker. Entries name the filters matched,
never the prompt.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from hordelite.contract import filters as rules_of
from hordelite.contract.chat_request import ChatRequest
from hordelite.contract.filters import Screened, Verdict
from hordelite.contract.limits import MAX_COUNT_DIGITS
from hordelite.contract.text import TextRequest
from hordelite.errors import RC, HordeError
from hordelite.horde._core import HordeCore
from hordelite.horde.keys import hash_key
from hordelite.storage.filters import FilterRecord

__all__ = ["FilterRecord", "Moderation"]

log = logging.getLogger("hordelite.moderation")
T = TypeVar("T")


class Moderation:
    """The admins' filters and the screen every request passes."""

    def __init__(self, core: HordeCore) -> None:
        self._core = core

    # Screening -------------------------------------------------------------

    async def screen_text(
        self, api_key: str, req: TextRequest, client: str | None, kind: str = "text"
    ) -> TextRequest:
        """``req`` as it may be queued (its prompt replaced where a replace
        rule matched); 400 CorruptPrompt when a refuse rule matched."""
        found = await self._core.filters.get()
        if not found:
            return req
        verdict = found.screen([req.prompt])
        await self._judged(api_key, client, verdict, kind)
        if verdict.texts[0] != req.prompt:
            return dataclasses.replace(req, prompt=verdict.texts[0])
        return req

    async def screen_chat(self, api_key: str, req: ChatRequest, client: str | None) -> ChatRequest:
        """``screen_text`` for a chat request: every text of every message
        as submitted (before context_fit drops any)."""
        found = await self._core.filters.get()
        if not found:
            return req
        places = rules_of.chat_texts(req.messages)
        verdict = found.screen([text for _i, _j, text in places])
        await self._judged(api_key, client, verdict, "chat")
        if verdict.replaced:
            messages = rules_of.with_chat_texts(req.messages, places, verdict.texts)
            return dataclasses.replace(req, messages=messages)
        return req

    async def _judged(self, api_key: str, client: str | None, verdict: Verdict, kind: str) -> None:
        """Record a refusal or a flag, and raise the refusal."""
        if verdict.refused:
            await self._record(api_key, Screened("request.refused", verdict.refused, kind, client))
            raise HordeError(RC.CorruptPrompt)
        if verdict.flagged:
            await self._record(api_key, Screened("request.flagged", verdict.flagged, kind, client))

    async def _record(self, api_key: str, screened: Screened) -> None:
        core = self._core
        await core.store.record_screened(
            key_hash=hash_key(api_key), screened=screened, now=core.clock.now()
        )

    # The admins' routes ----------------------------------------------------

    async def listing(
        self, api_key: str, filter_type: object, contains: str | None
    ) -> list[FilterRecord]:
        return await self._core.store.list_filters(
            key_hash=hash_key(api_key),
            filter_type=rules_of.parse_filter_type(filter_type),
            contains=contains or None,
        )

    async def one(self, api_key: str, filter_id: str) -> FilterRecord:
        return await self._core.store.one_filter(
            key_hash=hash_key(api_key), filter_id=_filter_id(filter_id)
        )

    async def create(self, api_key: str, body: object, address: str) -> tuple[FilterRecord, bool]:
        spec = rules_of.parse_filter(body)
        return await self._change(self._core.store.create_filter, api_key, address, spec=spec)

    async def edit(self, api_key: str, filter_id: str, body: object, address: str) -> FilterRecord:
        edit = rules_of.parse_filter_edit(body)
        return await self._change(
            self._core.store.edit_filter,
            api_key,
            address,
            filter_id=_filter_id(filter_id),
            edit=edit,
        )

    async def delete(self, api_key: str, filter_id: str, address: str) -> None:
        await self._change(
            self._core.store.delete_filter, api_key, address, filter_id=_filter_id(filter_id)
        )

    async def _change(
        self, change: Callable[..., Awaitable[T]], api_key: str, address: str, **what: Any
    ) -> T:
        """An admin's change to the filters (``change``, a Store method
        that checks the admin and audits it), made as ``api_key``'s from
        ``address`` now: this process screens the next request by the
        filters as changed (the others within FILTERS_CHECK_SECONDS)."""
        core = self._core
        done = await change(
            key_hash=hash_key(api_key), address=address, now=core.clock.now(), **what
        )
        core.filters.stale()
        return done

    async def test(self, api_key: str, body: object) -> tuple[int, list[str]]:
        """POST /filters: the suspicion of a prompt and what matched (the
        admin sent the prompt: its matches are shown)."""
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise HordeError(RC.BadRequest, "prompt: is required", errors={"prompt": "required"})
        # 0 asks for every type (the AI Horde reads it as none given).
        filter_type = rules_of.parse_filter_type(body.get("filter_type") or None)
        await self.listing(api_key, None, None)  # 403 NotModerator for anyone else
        found = await self._core.filters.get()
        return found.suspicion(body["prompt"], filter_type)

    async def regexes(self, api_key: str, filter_type: object) -> list[tuple[int, str]]:
        """GET /filters/regex: each type's rules as one regex."""
        records = await self.listing(api_key, filter_type, None)
        by_type: dict[int, list[str]] = {}
        for r in records:
            by_type.setdefault(r.filter_type, []).append(r.regex)
        return [(t, rules_of.combined_regex(by_type[t])) for t in sorted(by_type)]


def _filter_id(value: str) -> int:
    if not value.isdigit() or len(value) > MAX_COUNT_DIGITS:
        raise HordeError(RC.FilterNotFound, f"Filter with ID '{value[:64]}' not found.")
    return int(value)
