"""What a worker does: pop a job (long-polled), post a streamed job's
progress, submit the job's answer."""

from __future__ import annotations

from typing import Any

import anyio

from hordelite.contract._fields import parse_uuid
from hordelite.contract.chat_reply import (
    FAULT_REASONS,
    ChatSubmit,
    Verdict,
    answer_kind,
    build_worker_chat_extras,
    heavy_to_judge,
    is_chat_submit,
    judge_chat_reply,
    parse_chat_submit,
)
from hordelite.contract.chat_request import ChatRequest
from hordelite.contract.eligibility import WorkerView, skipped_counts
from hordelite.contract.progress import Lease, accept, parse_progress, streams_progress
from hordelite.contract.refusals import answers_only_a_text_job
from hordelite.contract.text import JobSubmit, PopRequest, parse_job_submit, parse_pop_request
from hordelite.errors import RC, HordeError
from hordelite.horde import request_images
from hordelite.horde._core import HordeCore, run_pure
from hordelite.horde.keys import hash_key
from hordelite.horde.messages import for_pop
from hordelite.horde.results import PopAnswer, PoppedJob, ProgressAnswer, SubmitAnswer
from hordelite.signals import ProgressEntry, look_again_by
from hordelite.storage.jobs import Unjudged
from hordelite.storage.ledger import SubmitResult
from hordelite.storage.pop import PoppedJob as ClaimedJob  # not the answer's PoppedJob
from hordelite.storage.pop import PopResult

# A chat reply is judged again when its job changed hands between the
# judging read and the write (storage raises Unjudged): this many tries.
_JUDGE_TRIES = 2


class Jobs:
    """The worker's room: each call is one transaction at most (a waiting
    pop, one per attempt), signals after commit, and the answer."""

    def __init__(self, core: HordeCore) -> None:
        self._core = core

    # Pop ---------------------------------------------------------------

    async def pop(
        self,
        api_key: str,
        body: Any,
        *,
        arrived: float | None = None,
        base_url: str = "",
        client: str | None = None,
    ) -> PopAnswer:
        """Check a worker in and hand it a job, waiting up to ``wait`` seconds for one.

        A waiting pop sleeps on the queue signal, woken when a job it can
        take is queued; each attempt is one transaction. ``base_url``: the
        horde's address as the worker reached it (the signed image URLs
        start with it). ``arrived`` (anyio's clock): when the request
        reached the server; the wait counts from then, so a pop that waited
        for a busy loop to run it is not answered that much later than its
        client asked. Cancelled while it waits, it passes a wake-up it took on.
        ``client``: the address it came from, refused when timed out or
        blocked (horde.addresses), kept on the worker.
        """
        await self._core.addresses.check(client, worker=True)
        # A name no worker can have, or more models than a worker may
        # declare, is refused here, before the key is read.
        config = self._core.config
        pop = parse_pop_request(body, config.horde.max_pop_wait, config.budgets.models_per_worker)
        key_hash = hash_key(api_key)
        await self._core.modes.admit_pop(key_hash, pop.name)  # invite-only, raid
        deadline = (anyio.current_time() if arrived is None else arrived) + pop.wait
        result = await self._wait_for_job(key_hash, pop, deadline, client)
        if isinstance(result, PopAnswer):
            return result
        return await self._hand_out(result, key_hash, pop, base_url)

    async def _wait_for_job(
        self, key_hash: str, pop: PopRequest, deadline: float, client: str | None
    ) -> PopResult | PopAnswer:
        """Attempts until one hands out a job (its PopResult), or the empty
        answer once the wait ran out or the horde stops."""
        core = self._core
        worker: WorkerView | None = None
        while True:
            with core.signals.queue_waiter(worker) as waiter:
                last = core.stopping or anyio.current_time() >= deadline
                if last and worker is not None:
                    # The wait ran out (or the horde stops) after an attempt
                    # found nothing, and any job queued since would have
                    # woken this pop: no transaction, only the counts. The
                    # check-in of that attempt lasts past this answer, and
                    # the worker's next pop is the next attempt. (So 1,000
                    # long-polls ending together cost no 1,000 writes.)
                    return await self._nothing_for(worker)
                result = await self._attempt(key_hash, pop, deadline, last, client)
                if result.job is not None:
                    return result
                if last:
                    return await self._nothing_for(result.worker)
                worker = result.worker
                await self._sleep(waiter.event, deadline)

    async def _attempt(
        self, key_hash: str, pop: PopRequest, deadline: float, last: bool, client: str | None
    ) -> PopResult:
        """One pop transaction. ``skipped`` is counted after it, and only when
        it hands out nothing: a pop that takes a job reads no sample."""
        core = self._core
        # How long this check-in lasts depends on how long the pop still waits.
        poll_left = None if pop.wait <= 0 else 0.0 if last else deadline - anyio.current_time()
        result = await core.store.pop_job(
            key_hash=key_hash, pop=pop, now=core.clock.now(), poll_left=poll_left, address=client
        )
        if result.pool_changed:
            await core.signals.notify_pool()
        return result

    async def _sleep(self, woken: anyio.Event, deadline: float) -> None:
        """Until the queue signal, the deadline, or the next look while signals
        are degraded; a wake-up taken by a cancelled pop goes to another."""
        signals = self._core.signals
        try:
            with anyio.move_on_after(look_again_by(signals, deadline) - anyio.current_time()):
                await woken.wait()
        except anyio.get_cancelled_exc_class():
            if woken.is_set():
                # Woken for a job we will not pop: pass it on.
                await signals.notify_queue()
            raise

    async def _nothing_for(self, worker: WorkerView) -> PopAnswer:
        """An empty pop's answer: what the worker skipped among the best
        waiting requests (read at most SKIPPED_SAMPLE_SECONDS ago)."""
        self._core.metrics.pops.labels("empty").inc()
        skipped = skipped_counts(worker, await self._core.skipped.get())
        return PopAnswer(None, skipped, await for_pop(self._core, worker.id))

    async def _hand_out(
        self, result: PopResult, key_hash: str, pop: PopRequest, base_url: str
    ) -> PopAnswer:
        """The popped job's answer, after its transaction: its progress lease
        when it streams, and the payload as the worker's declaration takes it
        (a chat job's stored request decoded here, once)."""
        core = self._core
        job = result.job
        assert job is not None
        core.metrics.pops.labels("job").inc()
        await core.signals.touch_request(job.request_id)
        payload = job.payload
        if job.chat:
            assert job.request is not None
            request = ChatRequest.from_json(job.request)
            stream = streams_progress(request)
            if stream:
                await core.signals.put_lease(self._lease(job, result.worker, key_hash, pop.name))
            payload = await self._chat_payload(job, request, result.worker, stream, base_url)
        popped = PoppedJob(job.id, job.model, payload, job.softprompt, job.ttl, job.chat)
        return PopAnswer(popped, {}, await for_pop(core, result.worker.id))

    def _lease(self, job: ClaimedJob, worker: WorkerView, key_hash: str, name: str) -> Lease:
        return Lease.at_pop(
            job_id=job.id,
            request_id=job.request_id,
            key_hash=key_hash,
            worker_id=worker.id,
            worker_name=name,
            model=job.model,
            gen=job.gen,
            now=self._core.clock.now(),
            ttl=job.ttl,
            trusted=worker.trusted,
            max_length=job.max_length,
        )

    async def _chat_payload(
        self, job: ClaimedJob, request: ChatRequest, worker: WorkerView, stream: bool, base_url: str
    ) -> dict[str, Any]:
        """The chat job's payload, narrowed to the worker's declaration; its
        images read (base64) or signed (url), or its messages offloaded.
        ``base_url`` is how the worker reached this horde."""
        core = self._core
        payload = build_worker_chat_extras(
            request,
            frozenset(worker.chat_features),
            job.max_length,
            job.max_context_length,
            stream_progress=stream,
        )
        if core.blobs is None:
            return payload
        return await request_images.hand_images(
            payload,
            core.blobs,
            worker,
            request_id=job.request_id,
            base_url=base_url,
            now=core.clock.now(),
            ttl=job.ttl,
            offload_bytes=core.config.images.offload_bytes,
        )

    # Progress ----------------------------------------------------------

    async def post_progress(self, api_key: str, body: Any) -> ProgressAnswer:
        """A streamed job's progress post, answered from its lease: no
        database read on this path (worker guide, "Streaming progress")."""
        core = self._core
        post = parse_progress(body)
        lease = await core.signals.lease(post.job_id)
        if lease is None and core.signals.degraded:
            # The leases are out of reach: the worker keeps generating and
            # submits; the stream gets the whole reply then.
            raise HordeError(RC.ChatProgressUnavailable)
        if lease is None:
            if await core.signals.ended(post.job_id):
                raise HordeError(RC.ChatJobAborted)
            raise HordeError(
                RC.ChatProgressNotStreaming,
                "This job was not popped with stream_progress (or is unknown): stop posting.",
            )
        if hash_key(api_key) != lease.key_hash:
            raise HordeError(RC.WrongCredentials, "This job was given to another user's worker.")
        accepted = accept(lease, post, core.clock.now())
        await core.signals.save_lease(lease)  # its counts, text and lease end moved
        if accepted.appended:
            await core.signals.append_progress(
                lease.request_id,
                ProgressEntry(
                    gen=lease.gen,
                    seq=post.seq,
                    content=post.content,
                    reasoning_content=post.reasoning_content,
                    worker=lease.worker_name,
                    model=lease.model,
                ),
            )
        core.metrics.progress_posts.inc()
        return ProgressAnswer(accepted.accepted_seq, accepted.cancelled)

    # Submit ------------------------------------------------------------

    async def submit(self, api_key: str, body: Any) -> SubmitAnswer:
        """A worker's answer to a job: a text generation, a chat reply or a fault.

        A chat reply is judged against its job before the write
        transaction; a refused one is recorded on its job (a fault that
        follows is counted by it) and then refused, after commit.
        """
        core = self._core
        key_hash = hash_key(api_key)
        sub = await self._parse_submit(api_key, body)
        text_only = answers_only_a_text_job(answer_kind(sub), sub.state == "faulted")
        lease = None if text_only else await core.signals.lease(sub.id)
        now = core.clock.now()
        result = await self._store_answer(key_hash, sub, now, lease.expires if lease else None)
        if result.refusal is not None:
            raise result.refusal
        self._count_submit(sub, result, now)
        if lease is not None and not lease.cancelled:
            await core.signals.end_lease(sub.id, now)  # the submit ends its posts
        if result.requeued:
            await core.queue_changed()
        await core.signals.notify_request(result.request_id)
        if result.request_ended and not text_only:
            await core.signals.end_stream(result.request_id, now)
        if result.hook_owed and result.request_ended:
            core.webhooks_due.set()
        return SubmitAnswer(result.reward)

    async def _parse_submit(self, api_key: str, body: Any) -> JobSubmit | ChatSubmit:
        """The parsed submit; a malformed chat reply is recorded on its job
        (for the message of a reply_refused fault) and then refused."""
        if not (isinstance(body, dict) and is_chat_submit(body)):
            return parse_job_submit(body)
        try:
            return parse_chat_submit(body)
        except HordeError as refusal:
            job_id = parse_uuid(body.get("id"))
            if refusal.rc is RC.ChatSubmitInvalid and job_id is not None:
                await self._core.store.record_refusal(
                    key_hash=hash_key(api_key), job_id=job_id, refusal=refusal
                )
            raise

    async def _store_answer(
        self, key_hash: str, sub: JobSubmit | ChatSubmit, now: float, lease_until: float | None
    ) -> SubmitResult:
        """The submit's transaction, with the chat reply's verdict; judged
        again when storage finds the job changed hands since (Unjudged)."""
        for attempt in range(_JUDGE_TRIES):
            verdict = await self._judge(key_hash, sub)
            try:
                return await self._core.store.submit_job(
                    key_hash=key_hash, sub=sub, now=now, lease_until=lease_until, verdict=verdict
                )
            except Unjudged:
                if attempt == _JUDGE_TRIES - 1:
                    raise
        raise AssertionError("unreachable: the last try returns or raises")

    async def _judge(self, key_hash: str, sub: JobSubmit | ChatSubmit) -> Verdict | None:
        """A chat reply judged against its job, outside any transaction, so
        that the write lock is not held while its content is parsed and
        checked against the request's schema; None for a text submit, a
        fault, or when the job is not the key's chat job in progress (the
        transaction then refuses it)."""
        if not isinstance(sub, ChatSubmit) or sub.reply is None:
            return None
        job = await self._core.store.chat_job_to_judge(key_hash=key_hash, job_id=sub.id)
        if job is None:
            return None
        model, stored = job
        req = ChatRequest.from_json(stored)
        return await run_pure(heavy_to_judge(sub.reply), judge_chat_reply, sub.id, model, req, sub)

    def _count_submit(self, sub: JobSubmit | ChatSubmit, result: SubmitResult, now: float) -> None:
        m = self._core.metrics
        if sub.state == "faulted":
            reason = sub.fault_reason if isinstance(sub, ChatSubmit) else None
            # Only the reasons the horde knows: a worker cannot grow the label set.
            m.faults.labels(reason if reason in FAULT_REASONS else "none").inc()
        m.kudos_rewarded.inc(result.reward)
        m.kudos_charged.inc(result.cost)
        if result.done_kind is not None:
            m.request_latency.labels(result.done_kind).observe(max(0.0, now - result.created))
