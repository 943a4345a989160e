"""Relaying a plain streamed request's progress as SSE deltas (chat guide,
"Streaming"), in the API of the call's encoder (``_encoder``).

The worker posts about once a second; each post's text is spread evenly over
the estimated interval until the next post, so the client sees a steady flow
and pacing adds at most about one interval of latency. The final reply then
reconciles: a reply equal to or extending what was relayed completes the
stream with the remainder; one that diverges ends it with an error event.
A stream lost or never posted still ends with the full reply.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import anyio

from hordelite.errors import RC, HordeError
from hordelite.front import _shape
from hordelite.front._call import Call
from hordelite.front._encoder import CONTENT, REASONING, Encoder
from hordelite.horde.results import RequestStatus

# Each post leaves in about SLICES_PER_POST slices spread over the estimated
# interval until the next post (a moving average, bounded), at most one
# slice every MIN_TICK seconds: a steady flow without an event per character.
SLICES_PER_POST = 4
MIN_TICK = 0.05
FIRST_INTERVAL = 1.0
MIN_INTERVAL, MAX_INTERVAL = 0.05, 5.0


class Pacer:
    """Text waiting to leave, and the time by which it must all have left."""

    def __init__(self, paced: bool) -> None:
        self.paced = paced
        self.pending = ""
        self.sent = ""
        self.due = 0.0
        self.interval = FIRST_INTERVAL
        self.last_post: float | None = None
        self.last_slice = float("-inf")

    def add(self, text: str, now: float) -> None:
        if not text:
            return
        if self.last_post is not None:
            gap = min(max(now - self.last_post, MIN_INTERVAL), MAX_INTERVAL)
            self.interval = 0.5 * self.interval + 0.5 * gap
        self.last_post = now
        self.pending += text
        self.due = now + self.interval

    @property
    def tick(self) -> float:
        """Seconds between slices."""
        return max(MIN_TICK, self.interval / SLICES_PER_POST)

    def take(self, now: float) -> str:
        """The slice to send now: all of it unpaced or when due, else its
        share of the time left."""
        if not self.pending:
            return ""
        left = self.due - now
        if not self.paced or left <= self.tick:
            text, self.pending = self.pending, ""
        elif now - self.last_slice < self.tick:
            return ""  # at most one slice a tick, however often asked
        else:
            share = max(1, round(len(self.pending) * self.tick / left))
            text, self.pending = self.pending[:share], self.pending[share:]
        self.last_slice = now
        self.sent += text
        return text

    def rest_of(self, final: str) -> str | None:
        """What of ``final`` the client has not had, or None when ``final``
        does not extend what was relayed (pending text counts as relayed)."""
        relayed = self.sent + self.pending
        if not final.startswith(relayed):
            return None
        rest = self.pending + final[len(relayed) :]
        self.sent, self.pending = final, ""
        return rest


async def relay(
    call: Call, encoder: Encoder, include_reasoning: bool, paced: bool, keepalive: float
) -> AsyncIterator[bytes]:
    """The SSE bytes of a plain streamed request, in ``encoder``'s API:
    deltas as posted, then the reconciled end. Raises HordeError as
    ``Call.poll`` does, and ChatStreamDiverged when the final reply
    contradicts the relayed text."""
    signals, rid = call.horde.signals, call.request_id
    content, reasoning = Pacer(paced), Pacer(paced)
    relayed = reasoning if include_reasoning else None  # the reasoning relayed
    position, gen = 0, None

    def deltas(pieces: Iterator[tuple[str, str]]) -> Iterator[bytes]:
        for field, text in pieces:
            yield from encoder.delta(field, text)

    for piece in encoder.opening():
        yield piece
    status: RequestStatus | None = None
    recheck = 0.0  # read the status at once: it may have ended already
    next_keepalive = anyio.current_time() + keepalive
    with contextlib.ExitStack() as held:
        # Taken before each status read, kept until the next one: a
        # generation that lands in between sets it.
        finished = held.enter_context(signals.request_waiter(rid))
        while status is None:
            with signals.progress_waiter(rid) as posted:
                now = anyio.current_time()
                entries = await signals.read_progress(rid, position)
                position += len(entries)
                gen, encoder.model = _add_posts(entries, gen, encoder.model, content, relayed, now)
                if finished.is_set() or now >= recheck:
                    held.close()
                    finished = held.enter_context(signals.request_waiter(rid))
                    try:
                        status = await call.poll()
                    except HordeError:
                        # No reply will come, and the cancel settles on all
                        # the worker posted: the client gets all of it first.
                        entries = await signals.read_progress(rid, position)
                        _add_posts(entries, gen, encoder.model, content, relayed, now)
                        for piece in deltas(_flushed(content, relayed)):
                            yield piece
                        raise
                    recheck = call.next_recheck()
                    if status is not None:
                        break
                for piece in deltas(_slices(content, reasoning, now)):
                    yield piece
                if now >= next_keepalive:
                    next_keepalive = now + keepalive
                    yield encoder.keepalive()
                busy = bool(content.pending or reasoning.pending)
                until = now + content.tick if busy else min(recheck, next_keepalive)
                with anyio.move_on_after(max(until - anyio.current_time(), 0)):
                    await posted.wait()
    for piece in deltas(_rests(status, content, relayed)):
        yield piece
    for piece in encoder.closing(status):
        yield piece


def _add_posts(
    entries: Sequence[Mapping[str, Any]],
    gen: Any,
    model: str,
    content: Pacer,
    reasoning: Pacer | None,
    now: float,
) -> tuple[Any, str]:
    """Add the posts of the attempt relayed (the first seen: ``gen``) to the
    pacers (the reasoning's only when it is relayed); (gen, the model of its
    last post)."""
    for entry in entries:
        gen = entry["gen"] if gen is None else gen
        if entry["gen"] == gen:  # a later attempt is reconciled at the end
            model = entry["model"]
            content.add(entry["content"], now)
            if reasoning is not None:
                reasoning.add(entry["reasoning_content"], now)
    return gen, model


def _slices(content: Pacer, reasoning: Pacer, now: float) -> Iterator[tuple[str, str]]:
    """The deltas due now: the reasoning's slice, then the content's."""
    text = reasoning.take(now)
    if text:
        yield REASONING, text
    # Content waits until the reasoning before it has left:
    # OpenAI-style clients expect all the reasoning first.
    text = "" if reasoning.pending else content.take(now)
    if text:
        yield CONTENT, text


def _flushed(content: Pacer, reasoning: Pacer | None) -> Iterator[tuple[str, str]]:
    """The deltas of all text still paced: the reasoning's (when relayed),
    then the content's."""
    for pacer, field in ((reasoning, REASONING), (content, CONTENT)):
        if pacer is not None and pacer.pending:
            pacer.paced = False
            yield field, pacer.take(anyio.current_time())


def _rests(
    status: RequestStatus, content: Pacer, reasoning: Pacer | None
) -> Iterator[tuple[str, str]]:
    """The deltas that reconcile the relayed text with the final reply (the
    reasoning's only when it is relayed); ChatStreamDiverged when the reply
    does not extend the relayed content."""
    _, reply = _shape.reply_of(status)
    if reasoning is not None:
        rest = reasoning.rest_of(reply.reasoning_content or "")
        if rest:
            yield REASONING, rest
    rest = content.rest_of(reply.content or "")
    if rest is None:
        raise HordeError(
            RC.ChatStreamDiverged,
            "The final reply differs from the text already streamed, so the stream ends here; "
            "the whole reply is on the request's status.",
        )
    if rest:
        yield CONTENT, rest
