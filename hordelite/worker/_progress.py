"""Streaming progress from the worker's side (worker guide, "Streaming progress").

A ``ProgressPoster`` posts the text a streamed job has produced since its
last accepted post, one post at a time, and reads each answer: ``cancelled``
or 404 ChatJobAborted stop the generation (and the submit), 409 resyncs to
``expected_seq``, 413, 404 ChatProgressNotStreaming, another refusal or
repeated 503s stop the posts while generation goes on.
"""

from __future__ import annotations

import logging
from typing import Any

from hordelite.errors import RC
from hordelite.worker._client import Reply
from hordelite.worker._horde import HordeClient, HordeUnavailable

log = logging.getLogger("hordelite.worker")

# Posts that get no answer or a 5xx, in a row, before the worker stops posting.
MAX_FAILED_POSTS = 3


class ProgressPoster:
    """The progress posts of one streamed job."""

    def __init__(self, horde: HordeClient, job_id: str) -> None:
        self.horde = horde
        self.job_id = job_id
        # (seq, content, reasoning) of each post the horde accepted, in order.
        self.accepted: list[tuple[int, str, str]] = []
        # The post sent and not yet answered: a retry sends it again as is.
        self.pending: tuple[int, str, str] | None = None
        self.stopped = False  # stop posting, keep generating
        self.cancelled = False  # stop generating and do not submit
        self.reason = ""  # why it stopped or was cancelled
        self.failures = 0

    @property
    def posts(self) -> int:
        return len(self.accepted)

    def posted(self) -> tuple[str, str]:
        """(reasoning, content) the horde holds."""
        return (
            "".join(r for _, _, r in self.accepted),
            "".join(c for _, c, _ in self.accepted),
        )

    async def post(self, reasoning: str, content: str) -> None:
        """Post what of ``(reasoning, content)`` the horde does not hold yet
        (or retry the unanswered post); nothing once stopped or cancelled."""
        if self.stopped or self.cancelled:
            return
        if self.pending is None:
            self.pending = self._next(reasoning, content)
            if self.pending is None:
                return
        seq, delta, thought = self.pending
        try:
            response = await self.horde.progress(self.job_id, seq, delta, thought)
        except HordeUnavailable as exc:
            self._failed(f"no answer ({exc})")
            return
        self._read(response)

    def _next(self, reasoning: str, content: str) -> tuple[int, str, str] | None:
        held_reasoning, held_content = self.posted()
        if not (content.startswith(held_content) and reasoning.startswith(held_reasoning)):
            self._stop("the text no longer extends what was posted")
            return None
        delta, thought = content[len(held_content) :], reasoning[len(held_reasoning) :]
        if not delta and not thought:
            return None
        seq = self.accepted[-1][0] + 1 if self.accepted else 1
        return seq, delta, thought

    def _read(self, response: Reply) -> None:
        body = _json(response)
        status = response.status_code
        if status == 200:
            assert self.pending is not None
            self.accepted.append(self.pending)
            self.pending = None
            self.failures = 0
            if body.get("cancelled") is True:
                self._cancel("the client cancelled the request")
        elif status == 409 and isinstance(body.get("expected_seq"), int):
            self._resync(body["expected_seq"])
        elif status == 404 and body.get("rc") == RC.ChatJobAborted.name:
            self._cancel("the job ended (ChatJobAborted)")
        elif status >= 500:
            self._failed(f"{status} {body.get('rc', '')}".strip())
        else:
            self._stop(f"{status} {body.get('rc', '')}".strip())

    def _resync(self, expected: int) -> None:
        """The horde holds seqs 1 to ``expected - 1``: keep the text under
        them (not posted again), post the rest from ``expected`` on."""
        held = expected - 1
        if self.pending is not None and self.pending[0] == held:
            self.accepted.append(self.pending)  # accepted before; its answer was lost
        self.pending = None
        kept = [entry for entry in self.accepted if entry[0] <= held]
        if (kept[-1][0] if kept else 0) != held:
            self._stop(f"the horde expects seq {expected}, past what this worker posted")
            return
        self.accepted = kept

    def _failed(self, why: str) -> None:
        self.failures += 1
        if self.failures >= MAX_FAILED_POSTS:
            self._stop(f"{why}, {self.failures} times in a row")

    def _stop(self, why: str) -> None:
        self.stopped = True
        self.reason = why
        log.info("job %s: progress posts stop (%s); generation goes on", self.job_id, why)

    def _cancel(self, why: str) -> None:
        self.cancelled = True
        self.reason = why
        log.info("job %s: %s; generation stops, nothing is submitted", self.job_id, why)


def _json(response: Reply) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
