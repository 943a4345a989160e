"""Streaming progress (the chat specification: "Streaming progress", "Streaming"): the rules
of a progress post and of its lease, as pure functions over a ``Lease``.

A job popped with ``stream_progress: true`` gets a lease: it authenticates the
worker's posts without a database read, orders them by ``seq``, caps them
(1000 posts, 16 bytes per max_length token, content and reasoning together),
and extends the job's life: each accepted post with new text ends the lease
150 s after the post, at most 600 s (trusted worker) or 200 s (untrusted)
after the pop. A retried post (same seq, same text) is accepted again without
appending or extending.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hordelite.contract._fields import parse_uuid
from hordelite.contract.chat_request import ChatRequest
from hordelite.contract.limits import (
    PROGRESS_BYTES_PER_TOKEN,
    PROGRESS_CAP_TRUSTED,
    PROGRESS_CAP_UNTRUSTED,
    PROGRESS_LEASE_SECONDS,
    PROGRESS_MAX_POSTS,
)
from hordelite.errors import RC, HordeError, bad_request


def streams_progress(req: ChatRequest) -> bool:
    """A plain streamed request: no tools, response_format absent or text.
    Only such a request's job is popped with ``stream_progress: true``."""
    return req.stream and not req.tools and req.response_format is None


@dataclasses.dataclass(frozen=True)
class ProgressPost:
    job_id: str
    seq: int
    content: str
    reasoning_content: str

    @property
    def size(self) -> int:
        return len(self.content.encode()) + len(self.reasoning_content.encode())


def parse_progress(body: Any) -> ProgressPost:
    if not isinstance(body, Mapping):
        raise bad_request("body", "expected a JSON object")
    job_id = parse_uuid(body.get("id"))
    if job_id is None:
        raise HordeError(RC.ChatProgressNotStreaming, "id: not a streamed job of this horde.")
    seq = body.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise bad_request("seq", "must be an integer of at least 1")
    delta = body.get("delta")
    if not isinstance(delta, Mapping):
        raise bad_request("delta", "expected an object with content and/or reasoning_content")
    content = delta.get("content") or ""
    reasoning = delta.get("reasoning_content") or ""
    if not isinstance(content, str):
        raise bad_request("delta.content", "expected a string")
    if not isinstance(reasoning, str):
        raise bad_request("delta.reasoning_content", "expected a string")
    return ProgressPost(job_id, seq, content, reasoning)


@dataclasses.dataclass
class Lease:
    """A streamed job's progress lease (held by the signal backend)."""

    job_id: str
    request_id: str
    key_hash: str  # the worker owner's key: posts authenticate against it
    worker_id: str
    worker_name: str
    model: str
    gen: int  # which attempt of the request this job is
    popped: float
    expires: float
    max_expires: float
    max_bytes: int
    posts: int = 0
    bytes: int = 0
    accepted_seq: int = 0
    last: tuple[str, str] = ("", "")
    content: str = ""  # all content posted so far
    reasoning: str = ""  # all reasoning posted so far
    cancelled: bool = False

    @classmethod
    def at_pop(
        cls,
        *,
        job_id: str,
        request_id: str,
        key_hash: str,
        worker_id: str,
        worker_name: str,
        model: str,
        gen: int,
        now: float,
        ttl: float,
        trusted: bool,
        max_length: int,
    ) -> Lease:
        cap = PROGRESS_CAP_TRUSTED if trusted else PROGRESS_CAP_UNTRUSTED
        return cls(
            job_id=job_id,
            request_id=request_id,
            key_hash=key_hash,
            worker_id=worker_id,
            worker_name=worker_name,
            model=model,
            gen=gen,
            popped=now,
            expires=now + ttl,
            max_expires=now + cap,
            max_bytes=PROGRESS_BYTES_PER_TOKEN * max_length,
        )


@dataclasses.dataclass(frozen=True)
class Accepted:
    """What a post did: the seq it accepted, whether the job was cancelled
    (its worker stops), and whether it appended an entry."""

    accepted_seq: int
    cancelled: bool
    appended: bool


def accept(lease: Lease, post: ProgressPost, now: float) -> Accepted:
    """Apply a post to its lease (mutating it) or raise the refusal.

    Raises 409 ChatProgressOutOfSequence (with expected_seq) for a gap, an
    old seq, or changed text under the accepted seq; 413
    ChatProgressCapReached past the caps; 404 ChatJobAborted past the lease.
    """
    if lease.cancelled:
        return Accepted(post.seq, True, False)
    if now > lease.expires:
        raise HordeError(
            RC.ChatJobAborted, "This job's lease ran out; stop generating, do not submit."
        )
    text = (post.content, post.reasoning_content)
    if post.seq == lease.accepted_seq and lease.accepted_seq:
        if text == lease.last:  # a retry of a lost answer
            return Accepted(post.seq, False, False)
        raise HordeError(
            RC.ChatProgressOutOfSequence,
            f"seq {post.seq} was accepted with other text; text already posted cannot change.",
            expected_seq=lease.accepted_seq + 1,
        )
    if post.seq != lease.accepted_seq + 1:
        raise HordeError(
            RC.ChatProgressOutOfSequence,
            f"seq {post.seq} is out of sequence; expected {lease.accepted_seq + 1}.",
            expected_seq=lease.accepted_seq + 1,
        )
    if lease.posts >= PROGRESS_MAX_POSTS:
        raise HordeError(
            RC.ChatProgressCapReached, f"A job may post progress {PROGRESS_MAX_POSTS} times."
        )
    if lease.bytes + post.size > lease.max_bytes:
        raise HordeError(
            RC.ChatProgressCapReached,
            f"A job may post {lease.max_bytes} bytes of progress ({PROGRESS_BYTES_PER_TOKEN} per max_length token).",
        )
    lease.posts += 1
    lease.bytes += post.size
    lease.accepted_seq = post.seq
    lease.last = text
    lease.content += post.content
    lease.reasoning += post.reasoning_content
    if post.size:
        lease.expires = min(now + PROGRESS_LEASE_SECONDS, lease.max_expires)
    return Accepted(post.seq, False, True)
