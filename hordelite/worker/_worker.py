"""The reference worker: pop, fit, generate, stream progress, submit.

One process, one task group: ``threads`` slots, each its own long-polled pop
loop serving one job at a time, and a summary logger. ``Worker.stop()``
cancels the pops in flight and gives the jobs in hand the grace period;
a job still running then is faulted, so the horde gives it to another
worker at once instead of after its lease. Once no pop is in flight, the
worker tells the horde it stops, so that new requests stop waiting for it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import random
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc

from hordelite.config import WorkerConfig
from hordelite.contract.chat_reply import FaultReason
from hordelite.contract.limits import DEFAULT_JOB_TTL, PROGRESS_CAP_TRUSTED
from hordelite.errors import RC
from hordelite.worker._backend import Backend, BackendError, Counter, TemplateBound
from hordelite.worker._backoff import Backoff
from hordelite.worker._declare import Declaration, WorkerError, declare
from hordelite.worker._horde import (
    BRIDGE_AGENT,
    HordeClient,
    HordeRefusal,
    HordeUnavailable,
    horde_base_url,
)
from hordelite.worker._job_images import ImageFetcher, ImageUnavailable, has_images
from hordelite.worker._progress import ProgressPoster
from hordelite.worker._reply import (
    StreamedChat,
    UnsendableJob,
    chat_completion_body,
    chat_reply_fields,
    check_sendable,
    reported_counts,
    text_completion_body,
)
from hordelite.worker._trim import PromptTrimmer, prompt_trimmer

log = logging.getLogger("hordelite.worker")

# Seconds a fault sent at shutdown (or on cancellation) may take.
_LAST_FAULT = 5.0
# Seconds between pops when the horde answers an empty pop at once (it does
# not long-poll, or it is stopping).
_IDLE_POLL = 1.0
# Pop refusals that pass (maintenance lifted by the operator, a busy horde):
# retried with backoff. Any other (a wrong key, an invalid declaration) stops
# the worker.
_RETRYABLE_POP_REFUSALS = (RC.WorkerMaintenance.name, RC.TooManyPrompts.name)
# The error codes of a backend refusing a prompt over its context: vLLM's
# (OpenAI's) and llama.cpp's server's (its error "type").
_OVERFLOW_CODES = ("context_length_exceeded", "exceed_context_size_error")
# Submit refusals meaning the job has ended on the horde: nothing more to send.
_ENDED = (RC.AbortedGen.name, RC.InvalidJobID.name)
# Pop refusals of the key itself: no user has it (or it was revoked), or it
# is the anonymous key, which can run no worker.
_KEY_REFUSALS = (RC.InvalidAPIKey.name, RC.AnonForbiddenWorker.name)


@dataclasses.dataclass(frozen=True)
class WorkerStatistics:
    """What the worker has done since it started. Each job ends in exactly
    one of done, faulted, refused, cancelled, aborted and lost."""

    pops: int  # pops the horde answered
    jobs: int  # jobs received
    done: int  # replies the horde accepted
    faulted: int  # jobs faulted: overflow, backend failure, unsendable payload, shutdown
    overflows: int  # of which with prompt_overflow
    unsendable: int  # of which could not be encoded for the backend (unsupported_input)
    refused: int  # replies the horde refused, then faulted with reply_refused
    cancelled: int  # streamed jobs the client cancelled (nothing submitted)
    aborted: int  # jobs that had ended on the horde when submitted
    lost: int  # jobs whose submit found the horde unreachable until their lease ended
    tokens: int  # completion tokens the backend reported
    kudos: float  # rewards of the accepted replies
    horde_errors: int  # horde requests that got no answer (or a 5xx)
    backend_errors: int  # jobs the backend failed
    progress_posts: int  # progress posts the horde accepted
    withdrawn: tuple[str, ...]  # features withdrawn after nonconformant refusals


@dataclasses.dataclass
class _Run:
    """One job in hand."""

    job: dict[str, Any]
    started: float
    outcome: str = "unsettled"
    category: str = "lost"  # one of WorkerStatistics' job outcomes
    settled: bool = False  # submitted, faulted, or not to be submitted
    tokens: int | None = None
    # The chat body sent without an exact count (the bound cleared it).
    uncounted: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return str(self.job["id"])

    @property
    def chat(self) -> bool:
        return bool(self.job.get("chat"))

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = self.job.get("payload") or {}
        return payload

    @property
    def expires(self) -> float:
        """When retrying its submit stops making sense: the job's lease, or
        the longest a streamed job's lease can be extended to."""
        ttl = float(self.job.get("ttl") or DEFAULT_JOB_TTL)
        if self.payload.get("stream_progress"):
            ttl = max(ttl, PROGRESS_CAP_TRUSTED)
        return self.started + ttl

    def settle(self, category: str, outcome: str | None = None) -> None:
        self.category = category
        self.outcome = outcome or category
        self.settled = True


class Worker:
    """A horde worker in front of one OpenAI-compatible backend.

    ``await worker.serve()`` runs it until ``worker.stop()``;
    ``worker.statistics()`` tells what it did. ``rng`` feeds the backoff's
    jitter (a test may pin it).
    """

    def __init__(self, config: WorkerConfig, *, rng: Callable[[], float] = random.random) -> None:
        for key in ("key", "name", "backend"):
            if not getattr(config, key):
                how = "HORDELITE_WORKER_KEY, or --key" if key == "key" else f"--{key}"
                raise WorkerError(f"worker.{key} is required ({how})")
        base, suffix = horde_base_url(config.horde)
        if suffix is not None:
            # A copied API URL would pop /api/v2/api/v2/... and get a bare 404.
            log.warning(
                "worker.horde %s ends in %s, which is not part of the horde's base URL: "
                "using %s (the worker adds /api/v2 itself)",
                config.horde,
                suffix,
                base,
            )
            config = dataclasses.replace(config, horde=base)
        self.config = config
        self.backoff = Backoff(config.backoff_initial, config.backoff_max, rng)
        self.declaration: Declaration | None = None
        self._wait = config.wait  # lowered to 0 if the horde allows no such long-poll
        self._counter: Counter | None = None
        self._bound: TemplateBound | None = None
        self._trimmer = PromptTrimmer(None)
        self._backend: Backend | None = None
        self._horde: HordeClient | None = None
        self._images: ImageFetcher | None = None
        self._backend_lock: anyio.Lock | None = None
        self._backend_up = True
        self._stopping = False
        self._serving = False  # the horde has answered a pop (accepted the key)
        self._drain_deadline = math.inf
        self._start_scope: anyio.CancelScope | None = None
        self._pop_scopes: set[anyio.CancelScope] = set()
        self._pops_over = anyio.Event()  # stopping, and no pop in flight
        self._job_scopes: set[anyio.CancelScope] = set()
        self._counts: collections.Counter[str] = collections.Counter()
        self._kudos = 0.0
        self._nonconformant: collections.Counter[str] = collections.Counter()
        self._withdrawn: list[str] = []

    # Running --------------------------------------------------------------------

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[Declaration] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Probe the backend (waiting for it to answer), report the
        declaration as started, then pop and serve jobs until ``stop()``.

        Returns once the jobs in hand are settled. Raises WorkerError when
        the backend proves too little or the horde refuses the worker's pops.
        Cancelled, it faults the jobs in hand (shielded, briefly) and exits.
        """
        async with contextlib.AsyncExitStack() as stack:
            backend_url = await self._backend_url(stack)
            self._backend = Backend(backend_url, self.config.backend_timeout)
            stack.push_async_callback(self._backend.aclose)
            self._horde = HordeClient(self.config.horde, self.config.key)
            stack.push_async_callback(self._horde.aclose)
            self._images = ImageFetcher()
            stack.push_async_callback(self._images.aclose)
            self._backend_lock = anyio.Lock()
            with anyio.CancelScope() as self._start_scope:
                if self._stopping:
                    self._start_scope.cancel()
                self.declaration, self._counter, self._bound, self._trimmer = await self._declare()
            if self.declaration is None:
                return  # stopped before the backend answered
            task_status.started(self.declaration)
            await self._serve_slots()

    def stop(self, grace: float | None = None) -> None:
        """Stop popping; the jobs in hand get ``grace`` seconds (default
        ``grace_period``) to finish, then they are faulted. A later call may
        shorten the grace. Call it from a task of the worker's event loop."""
        grace = self.config.grace_period if grace is None else grace
        self._drain_deadline = min(self._drain_deadline, anyio.current_time() + grace)
        if not self._stopping:
            log.info(
                "stopping: no more pops; %d job(s) in hand get %g s to finish",
                len(self._job_scopes),
                grace,
            )
        self._stopping = True
        if self._start_scope is not None:
            self._start_scope.cancel()
        for scope in self._pop_scopes:
            scope.cancel()
        if not self._pop_scopes:
            self._pops_over.set()
        for scope in self._job_scopes:
            scope.deadline = min(scope.deadline, self._drain_deadline)

    def statistics(self) -> WorkerStatistics:
        c = self._counts
        return WorkerStatistics(
            pops=c["pops"],
            jobs=c["jobs"],
            done=c["done"],
            faulted=c["faulted"],
            overflows=c["overflows"],
            unsendable=c["unsendable"],
            refused=c["refused"],
            cancelled=c["cancelled"],
            aborted=c["aborted"],
            lost=c["lost"],
            tokens=c["tokens"],
            kudos=self._kudos,
            horde_errors=c["horde_errors"],
            backend_errors=c["backend_errors"],
            progress_posts=c["progress_posts"],
            withdrawn=tuple(self._withdrawn),
        )

    def pop_body(self) -> dict[str, Any]:
        """The body of every pop: the text limits and the chat declaration."""
        d = self.declaration
        assert d is not None
        return {
            "name": self.config.name,
            "models": [d.model_id],
            "max_length": d.max_length,
            "max_context_length": d.context,
            "threads": self.config.threads,
            "bridge_agent": BRIDGE_AGENT,
            "wait": self._wait,
            **d.chat_fields(self._withdrawn),
        }

    async def _backend_url(self, stack: contextlib.AsyncExitStack) -> str:
        if self.config.backend != "fake":
            return self.config.backend
        from hordelite.worker.fake_backend import open_fake_backend

        fake = await stack.enter_async_context(open_fake_backend())
        log.info("serving from the fake backend at %s (no model: replies are echoes)", fake.url)
        return fake.url

    async def _declare(
        self,
    ) -> tuple[Declaration, Counter, TemplateBound | None, PromptTrimmer]:
        """The declaration and how text prompts are trimmed, once the
        backend answers (retried with backoff)."""
        assert self._backend is not None
        attempt = 0
        while True:
            try:
                declaration, counter, bound = await declare(self._backend, self.config)
                trimmer = await prompt_trimmer(
                    self._backend, declaration.backend_kind, declaration.backend_model
                )
                log.info(
                    "text prompts over the context: trimmed from their start, %s", trimmer.name
                )
                return declaration, counter, bound, trimmer
            except BackendError as exc:
                if not exc.down:
                    raise WorkerError(f"the backend refused the start probe: {exc}") from exc
                delay = self.backoff.delay(attempt)
                attempt += 1
                log.warning("the backend does not answer (%s); trying again in %.1f s", exc, delay)
                await anyio.sleep(delay)

    async def _serve_slots(self) -> None:
        # Not "serving" yet: the horde has not seen the key (see _pop).
        log.info(
            "worker %r starting: popping for %r at %s with %d thread(s)",
            self.config.name,
            self.declaration.model_id if self.declaration else "",
            self.config.horde,
            self.config.threads,
        )
        refused = False
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._summaries)
                async with anyio.create_task_group() as slots:
                    for index in range(self.config.threads):
                        slots.start_soon(self._slot, index)
                    slots.start_soon(self._announce_stop)
                tg.cancel_scope.cancel()
        except* WorkerError as group:
            # One slot's fatal error (a refused key, say) stops the worker:
            # raise it as itself, not in a group.
            first: BaseException = group
            while isinstance(first, BaseExceptionGroup):  # nested task groups nest groups
                first = first.exceptions[0]
            refused = not self._serving
            raise first from None
        finally:
            if not refused:  # refused before any pop was answered: nothing to sum up
                self._log_summary("final summary")

    async def _summaries(self) -> None:
        while True:
            await anyio.sleep(self.config.summary_interval)
            self._log_summary("summary")

    def _log_summary(self, title: str) -> None:
        s = self.statistics()
        log.info(
            "%s: %d jobs (%d done, %d faulted of which %d prompt_overflow and %d unsendable, "
            "%d refused, %d cancelled, %d aborted, %d lost), %d tokens, %.1f kudos; "
            "%d horde errors, %d backend errors%s",
            title,
            s.jobs,
            s.done,
            s.faulted,
            s.overflows,
            s.unsendable,
            s.refused,
            s.cancelled,
            s.aborted,
            s.lost,
            s.tokens,
            s.kudos,
            s.horde_errors,
            s.backend_errors,
            f"; withdrawn: {', '.join(s.withdrawn)}" if s.withdrawn else "",
        )

    async def _announce_stop(self) -> None:
        """Once stopping and no pop is in flight (none starts after), tell the
        horde the worker is offline: requests for its model then stop waiting
        for it. The jobs in hand still finish and are submitted. A horde that
        does not answer loses nothing: the worker's check-in runs out."""
        await self._pops_over.wait()
        assert self._horde is not None
        try:
            with anyio.fail_after(_LAST_FAULT):
                if await self._horde.go_offline(self.config.name):
                    log.info("told the horde this worker is offline")
        except (HordeUnavailable, HordeRefusal, TimeoutError) as exc:
            log.warning("could not tell the horde this worker is offline: %r", exc)

    # Popping --------------------------------------------------------------------

    async def _slot(self, index: int) -> None:
        """One pop loop: a job at a time until the worker stops."""
        failures = 0
        while not self._stopping:
            job = None
            with anyio.CancelScope() as scope:
                self._pop_scopes.add(scope)
                try:
                    await self._backend_ready()
                    job, failures = await self._pop(failures)
                finally:
                    self._pop_scopes.discard(scope)
                    if self._stopping and not self._pop_scopes:
                        self._pops_over.set()
            if job is not None:
                try:
                    await self._serve(job)
                except Exception:
                    # Whatever a job holds, the loop pops on: _run faults
                    # what it cannot serve, and a job that fails even its
                    # fault (a horde answering nonsense) is left to its lease.
                    log.exception("job %r: could not be served or faulted", job.get("id"))

    async def _backend_ready(self) -> None:
        """Return at once while the backend is up; after a failure, once it
        answers its health check again (checked with backoff)."""
        if self._backend_up:
            return
        assert self._backend_lock is not None
        assert self._backend is not None
        async with self._backend_lock:
            attempt = 0
            while not self._backend_up:
                if await self._backend.healthy():
                    self._backend_up = True
                    log.info("the backend answers again: popping resumes")
                    break
                await anyio.sleep(self.backoff.delay(attempt))
                attempt += 1

    async def _pop(self, failures: int) -> tuple[dict[str, Any] | None, int]:
        """(a job or None, the failures in a row after this pop)."""
        assert self._horde is not None
        started = anyio.current_time()
        body = self.pop_body()
        check_in = not self._serving
        if check_in:
            # The first pops do not long-poll: the horde's answer tells at
            # once whether it takes the key, which an empty long-poll would
            # tell only as its wait ends.
            body["wait"] = 0
        try:
            answer = await self._horde.pop(body)
        except HordeUnavailable as exc:
            self._counts["horde_errors"] += 1
            delay = self.backoff.delay(failures)
            log.warning("the horde does not answer (%s); popping again in %.2f s", exc, delay)
            await anyio.sleep(delay)
            return None, failures + 1
        except HordeRefusal as exc:
            return None, await self._pop_refusal(exc, failures)
        self._pop_answered(failures)
        if answer.get("id") is None:
            await self._pause_after_empty_pop(started, check_in)
            return None, 0
        return answer, 0

    async def _pop_refusal(self, exc: HordeRefusal, failures: int) -> int:
        """The failures in a row after a refused pop: a refused long-poll
        turns to polling, a passing refusal waits its backoff, and any other
        stops the worker (raises WorkerError)."""
        errors = exc.body.get("errors")
        if self._wait and isinstance(errors, dict) and "wait" in errors:
            log.warning("the horde refuses a %g s long-poll (%s); polling instead", self._wait, exc)
            self._wait = 0
            return failures
        if exc.rc not in _RETRYABLE_POP_REFUSALS:
            raise self._pop_refused(exc) from exc
        delay = self.backoff.delay(failures)
        log.warning("the horde refuses the pop (%s); popping again in %.1f s", exc, delay)
        await anyio.sleep(delay)
        return failures + 1

    def _pop_answered(self, failures: int) -> None:
        """Count an answered pop; the first says the worker is serving."""
        if failures:
            log.info("the horde answers again")
        if not self._serving:
            self._serving = True
            log.info(
                "worker %r serving %r at %s with %d thread(s)",
                self.config.name,
                self.declaration.model_id if self.declaration else "",
                self.config.horde,
                self.config.threads,
            )
        self._counts["pops"] += 1

    async def _pause_after_empty_pop(self, started: float, check_in: bool) -> None:
        held = anyio.current_time() - started >= self._wait / 2
        if not check_in and (not held or not self._wait):
            await anyio.sleep(_IDLE_POLL)  # the horde did not hold the pop

    def _pop_refused(self, exc: HordeRefusal) -> WorkerError:
        """The error that stops the worker for a pop refusal that will not
        pass: what the operator should change, in one line."""
        if exc.rc in _KEY_REFUSALS:
            return WorkerError(
                f"the horde at {self.config.horde} refuses the worker's key ({exc}); "
                "give the worker owner's key (hordelite keys create NAME on the horde) "
                "in HORDELITE_WORKER_KEY or worker.key"
            )
        if exc.status == 404:
            return WorkerError(
                f"the horde refuses this worker's pops: {exc} (is {self.config.horde} the "
                "horde's base URL? the worker adds /api/v2 itself)"
            )
        return WorkerError(f"the horde refuses this worker's pops: {exc}")

    # Serving a job ----------------------------------------------------------------

    async def _serve(self, job: dict[str, Any]) -> None:
        run = _Run(job, anyio.current_time())
        self._counts["jobs"] += 1
        try:
            with anyio.CancelScope(deadline=self._drain_deadline) as scope:
                self._job_scopes.add(scope)
                try:
                    await self._run(run)
                finally:
                    self._job_scopes.discard(scope)
            if not run.settled:  # the grace period ran out
                with anyio.move_on_after(_LAST_FAULT):
                    await self._fault(run, None, "faulted (shutdown)")
        except anyio.get_cancelled_exc_class():
            if not run.settled:
                with anyio.move_on_after(_LAST_FAULT, shield=True):
                    await self._fault(run, None, "faulted (cancelled)")
            raise
        finally:
            self._finish(run)

    def _finish(self, run: _Run) -> None:
        self._counts[run.category] += 1
        self._counts["tokens"] += run.tokens or 0
        log.info(
            "job %s %s model=%s tokens=%s seconds=%.2f outcome=%s",
            run.id,
            "chat" if run.chat else "text",
            run.job.get("model"),
            "-" if run.tokens is None else run.tokens,
            anyio.current_time() - run.started,
            run.outcome,
        )

    async def _run(self, run: _Run) -> None:
        try:
            if run.chat:
                await self._chat_job(run)
            else:
                await self._text_job(run)
        except BackendError as exc:
            self._counts["backend_errors"] += 1
            if exc.down and self._backend_up:
                log.warning("the backend failed (%s): no pops until it answers again", exc)
                self._backend_up = False
            log.info("job %s: the backend failed: %s", run.id, exc)
            # A backend refusing an overflowing prompt (a 400 from vLLM or
            # llama.cpp) refused it rather than trimming it: the reason holds.
            reason = FaultReason.PROMPT_OVERFLOW if exc.code in _OVERFLOW_CODES else None
            if reason is None and not exc.down and run.uncounted is not None:
                reason = await self._unrenderable(run, run.uncounted)
            await self._fault(run, reason)
        except UnsendableJob as exc:
            # The request's text, not the backend: fault it once with the
            # reason for an input the worker cannot process, and pop on.
            log.warning("job %s: %s; faulted with unsupported_input", run.id, exc)
            await self._fault(run, FaultReason.UNSUPPORTED_INPUT)
        except ImageUnavailable as exc:
            # The horde's link failed, not the request nor the backend: the
            # generic fault, so that another worker may try it.
            log.warning("job %s: an image could not be fetched: %s", run.id, exc)
            await self._fault(run, None)
        except HordeUnavailable as exc:
            log.warning("job %s: the horde did not answer its submit in time: %s", run.id, exc)
            run.settle("lost")
        except Exception:
            # A job this worker cannot handle (a payload it does not
            # understand, say) must not stop the others: fault it.
            log.exception("job %s: failed", run.id)
            if not run.settled:
                await self._fault(run, None)

    def _backend_body(
        self, run: _Run, build: Callable[[Mapping[str, Any], str, str], dict[str, Any]]
    ) -> dict[str, Any]:
        """The body ``build`` makes of ``run``'s job for the declared backend
        model and kind; UnsendableJob when it cannot be sent."""
        assert self.declaration is not None
        d = self.declaration
        body = build(run.payload, d.backend_model, d.backend_kind)
        check_sendable(body)
        return body

    async def _text_job(self, run: _Run) -> None:
        assert self._backend is not None
        body = self._backend_body(run, text_completion_body)
        await self._trim(run, body)
        answer = await self._backend.complete(body)
        choice = _first_choice(answer)
        run.tokens = reported_counts(answer.get("usage")).get("completion_tokens")
        text = choice.get("text")
        await self._submit_reply(
            run, {"id": run.id, "state": "ok", "generation": text if isinstance(text, str) else ""}
        )

    async def _trim(self, run: _Run, body: dict[str, Any]) -> None:
        """Trim a text prompt that does not fit from its start, keeping its
        end (KoboldAI's way; text jobs carry no guarantee against it)."""
        assert self.declaration is not None
        context = min(
            int(run.payload.get("max_context_length") or self.declaration.context),
            self.declaration.context,
        )
        max_length = int(run.payload["max_length"])
        trimmed = await self._trimmer.fit(body["prompt"], context - max_length)
        if trimmed is None:
            return
        log.info(
            "job %s: the prompt plus max_length %d does not fit the context of %d: "
            "trimmed from its start, %d %s to %d",
            run.id,
            max_length,
            context,
            trimmed.before,
            trimmed.unit,
            trimmed.after,
        )
        body["prompt"] = trimmed.prompt

    async def _chat_job(self, run: _Run) -> None:
        assert self._backend is not None
        body = self._backend_body(run, chat_completion_body)
        if await self._overflows(run, body):
            return
        if has_images(body):
            # After the fit check, which counts the conversation as the
            # horde sent it, not the images' base64.
            assert self._images is not None
            body = await self._images.inline(body)
        if run.payload.get("stream_progress"):
            fields = await self._streamed(run, body)
            if fields is None:
                return  # cancelled: nothing to submit
        else:
            answer = await self._backend.chat(body)
            choice = _first_choice(answer)
            message = choice.get("message")
            fields = chat_reply_fields(
                message if isinstance(message, Mapping) else {},
                choice.get("finish_reason"),
                answer.get("usage"),
            )
        run.tokens = fields.get("completion_tokens")
        await self._submit_reply(
            run, {"id": run.id, "model_id": run.job["model"], "state": "ok", **fields}
        )

    async def _overflows(self, run: _Run, body: dict[str, Any]) -> bool:
        """Fault the job with prompt_overflow when the conversation plus
        max_length does not fit (never trim it); True when it did."""
        assert self._counter is not None
        assert self.declaration is not None
        limit = min(int(run.payload["max_context_length"]), self.declaration.context)
        max_length = int(run.payload["max_length"])
        # The cheap bound first: a conversation it shows to fit is sent
        # without a call to count it (one backend call a job); one it cannot
        # clear, or cannot bound (tools, images), is counted exactly.
        bound = self._bound.tokens(body) if self._bound is not None else None
        if bound is not None and bound + max_length <= limit:
            run.uncounted = body
            return False
        try:
            counted = await self._counter.count(body)
        except BackendError as exc:
            if exc.down:
                raise
            log.info("job %s: the conversation cannot be rendered: %s", run.id, exc)
            await self._fault(run, FaultReason.TEMPLATE_ERROR)
            return True
        if body.get("tools"):
            counted += self.config.template_overhead
        if counted + max_length <= limit:
            return False
        log.info(
            "job %s: %d prompt tokens + max_length %d exceed the context of %d",
            run.id,
            counted,
            run.payload["max_length"],
            limit,
        )
        await self._fault(run, FaultReason.PROMPT_OVERFLOW)
        return True

    async def _unrenderable(self, run: _Run, body: dict[str, Any]) -> str | None:
        """``template_error`` when the backend refused a conversation sent
        uncounted because its template cannot render it (what counting it
        first would have found), else None."""
        assert self._counter is not None
        try:
            await self._counter.count(body)
        except BackendError as exc:
            if exc.down:
                return None
            log.info("job %s: the conversation cannot be rendered: %s", run.id, exc)
            return FaultReason.TEMPLATE_ERROR
        return None

    async def _streamed(self, run: _Run, body: dict[str, Any]) -> dict[str, Any] | None:
        """Generate while posting progress: the first text as soon as the
        backend yields it (so the client's first token comes as fast as the
        backend's), then about every ``progress_interval``; the reply's
        fields, or None when the job was cancelled."""
        assert self._backend is not None
        assert self._horde is not None
        backend = self._backend
        answer = StreamedChat()
        poster = ProgressPoster(self._horde, run.id)
        finished = anyio.Event()
        first_text = anyio.Event()  # set by the first visible text (and by the end)
        failure: list[BackendError] = []
        ended: list[bool] = []

        def feed(chunk: dict[str, Any]) -> None:
            answer.feed(chunk)
            if not first_text.is_set() and any(answer.visible()):
                first_text.set()

        async def generate() -> None:
            try:
                ended.append(await backend.stream_chat(body, feed))
            except BackendError as exc:
                failure.append(exc)
            finally:
                finished.set()
                first_text.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(generate)
            wake = first_text
            while not finished.is_set():
                with anyio.move_on_after(self.config.progress_interval):
                    await wake.wait()
                if finished.is_set():
                    break
                if first_text.is_set():
                    wake = finished  # past the first text: a post an interval
                await poster.post(*answer.visible())
                if poster.cancelled:
                    tg.cancel_scope.cancel()
        self._counts["progress_posts"] += poster.posts
        if poster.cancelled:
            run.settle("cancelled", f"cancelled ({poster.reason})")
            return None
        if failure:
            raise failure[0]
        if not (ended and ended[0]) and not answer.finished:
            raise BackendError("the stream ended before its finish", down=True)
        return answer.reply_fields()

    # Submitting -------------------------------------------------------------------

    async def _submit(self, run: _Run, body: dict[str, Any]) -> dict[str, Any]:
        """Submit, retrying with backoff while the horde does not answer and
        the job's lease may still hold; raises HordeRefusal, or
        HordeUnavailable past the lease."""
        assert self._horde is not None
        attempt = 0
        while True:
            try:
                return await self._horde.submit(body)
            except HordeUnavailable as exc:
                self._counts["horde_errors"] += 1
                if anyio.current_time() >= run.expires:
                    raise
                delay = self.backoff.delay(attempt)
                attempt += 1
                log.warning(
                    "job %s: the horde does not answer the submit (%s); again in %.1f s",
                    run.id,
                    exc,
                    delay,
                )
                await anyio.sleep(delay)

    async def _submit_reply(self, run: _Run, body: dict[str, Any]) -> None:
        try:
            answer = await self._submit(run, body)
        except HordeRefusal as exc:
            await self._refused(run, exc)
            return
        reward = answer.get("reward")
        self._kudos += float(reward) if isinstance(reward, int | float) else 0.0
        run.settle("done")

    async def _refused(self, run: _Run, exc: HordeRefusal) -> None:
        """A refused reply: nothing more for a job that ended; otherwise a
        fault with reply_refused, the reply never resubmitted."""
        if exc.rc in _ENDED:
            run.settle("aborted", f"aborted ({exc.rc})")
            return
        if exc.rc == RC.DuplicateGen.name:
            run.settle("done", "done (already submitted)")
            return
        log.warning("job %s: the horde refused the reply: %s", run.id, exc)
        if exc.rc == RC.ChatSubmitNonconformant.name:
            self._note_nonconformant(run, exc)
        await self._fault(run, FaultReason.REPLY_REFUSED, f"refused ({exc.rc})", category="refused")

    def _note_nonconformant(self, run: _Run, exc: HordeRefusal) -> None:
        """Count the refusal against the declared features it implicates;
        withdraw one refused ``nonconformant_limit`` times."""
        declared = self.declaration.features if self.declaration else ()
        for name in implicated_features(run.payload, exc.body):
            if name not in declared or name in self._withdrawn:
                continue
            self._nonconformant[name] += 1
            if self._nonconformant[name] >= self.config.nonconformant_limit:
                self._withdrawn.append(name)
                log.warning(
                    "withdrawing %s from the declaration: the horde refused %d replies "
                    "as nonconformant to it (the backend does not keep it)",
                    name,
                    self._nonconformant[name],
                )

    async def _fault(
        self,
        run: _Run,
        reason: str | None,
        outcome: str | None = None,
        *,
        category: str = "faulted",
    ) -> None:
        """Fault the job (with ``reason`` for a chat job); settles it."""
        body: dict[str, Any] = {"id": run.id, "state": "faulted"}
        if run.chat:
            body["model_id"] = run.job["model"]
            if reason is not None:
                body["fault_reason"] = reason
        else:
            body["generation"] = ""
        if reason == FaultReason.PROMPT_OVERFLOW:
            self._counts["overflows"] += 1
        elif reason == FaultReason.UNSUPPORTED_INPUT:
            self._counts["unsendable"] += 1
        outcome = outcome or (f"faulted ({reason})" if reason else "faulted")
        try:
            await self._submit(run, body)
        except HordeRefusal as exc:
            log.info("job %s: the fault was refused: %s", run.id, exc)
        except HordeUnavailable:
            run.settle("lost", f"{outcome}, not delivered")
            return
        run.settle(category, outcome)


def _first_choice(answer: Any) -> Mapping[str, Any]:
    choices = answer.get("choices") if isinstance(answer, Mapping) else None
    if not choices or not isinstance(choices[0], Mapping):
        raise BackendError("the answer has no choice", down=False)
    choice: Mapping[str, Any] = choices[0]
    return choice


def implicated_features(payload: Mapping[str, Any], refusal: Mapping[str, Any]) -> list[str]:
    """The declared features a ChatSubmitNonconformant refusal shows the
    backend did not keep, from the fields it names: a forced tool choice not
    followed breaks tool_choice_enforced; content outside a strict schema
    structured_output_enforced, outside a plain json_schema or json_object
    request that capability."""
    errors = refusal.get("errors")
    fields = list(errors) if isinstance(errors, Mapping) else []
    names = []
    if any(str(f).startswith("message.tool_calls") for f in fields):
        names.append("tool_choice_enforced")
    if any(str(f).startswith("message.content") for f in fields):
        fmt = payload.get("response_format")
        kind = fmt.get("type") if isinstance(fmt, Mapping) else None
        spec = fmt.get("json_schema") if isinstance(fmt, Mapping) else None
        if kind == "json_schema" and isinstance(spec, Mapping) and spec.get("strict"):
            names.append("structured_output_enforced")
        elif kind in ("json_schema", "json_object"):
            names.append(str(kind))
    return names
