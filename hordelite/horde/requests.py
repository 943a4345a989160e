"""What a requester does: queue a text or chat request, read its status
(at once or long-polled), cancel it."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio

from hordelite.contract import budgets
from hordelite.contract import kudos as kudos_rules
from hordelite.contract._fields import parse_uuid
from hordelite.contract.chat_request import ChatRequest, image_count, parse_chat_request
from hordelite.contract.completion_request import (
    CompletionRequest,
    Context,
    completion_context,
    completion_offers,
    with_context,
)
from hordelite.contract.limits import (
    ANONYMOUS_API_KEY,
    IMAGE_FETCHES_PER_PROCESS,
    IMAGES_NORMALISED_AT_ONCE,
    UPFRONT_MAX_LENGTH,
)
from hordelite.contract.text import TextRequest, parse_text_request
from hordelite.errors import RC, HordeError
from hordelite.horde import chat, request_images
from hordelite.horde._core import HordeCore
from hordelite.horde.admission import (
    ChatAdmission,
    new_text_request,
    text_ceiling,
    text_quote,
)
from hordelite.horde.caches import StatusKey
from hordelite.horde.fair_turns import FairTurns
from hordelite.horde.image_allowance import ImageAllowance, IntakeLedger
from hordelite.horde.keys import hash_key, scoped_operation_key
from hordelite.horde.moderation import Moderation
from hordelite.horde.results import (
    Queued,
    Quote,
    RequestStatus,
    RequestWarning,
    SubmittedRequest,
)
from hordelite.horde.status import status_of
from hordelite.signals import look_again_by
from hordelite.storage.requests import FirstRequest, Intake, Submitted

log = logging.getLogger("hordelite.requests")
# A request the screen takes and answers: a text or a chat request.
R = TypeVar("R", TextRequest, ChatRequest)


@dataclasses.dataclass(frozen=True, slots=True)
class Submitter:
    """Who sent a request, as each step of queueing it takes it: the
    requester's API key, the client agent it named (Client-Agent), its
    operation key (Idempotency-Key; None: none), the address it came from
    (contract.forwarded; an anonymous request's budgets are counted by it,
    None: none known), and the process holding the OpenAI call that is the
    request's only reader (None: a native request, read by whoever polls)."""

    api_key: str
    client_agent: str
    operation_key: str | None = None
    client: str | None = None
    reader: str | None = None

    def intake(self, request_id: str, response: dict[str, Any] | None = None) -> Intake:
        """How the request came in, as storage keeps it with the request
        queued under ``request_id``; ``response``: a stored Response's
        record, kept with the key hash and address it is read back by."""
        if response is not None:
            response = {**response, "key": hash_key(self.api_key), "client": self.client}
        return Intake(request_id, self.client_agent, self.reader, self.client, response)


class Requests:
    """The requester's room. A resubmit with the same operation key
    (Idempotency-Key) answers the first request again, queues and charges
    nothing (ignored for the anonymous user)."""

    def __init__(self, core: HordeCore) -> None:
        self._core = core
        self._admission = ChatAdmission(core)
        # The normalising threads, shared round robin by account, and the
        # image bytes each account is taking in (decision 0070).
        self._normalising = FairTurns(IMAGES_NORMALISED_AT_ONCE)
        self._intakes = IntakeLedger()
        self._fetching: anyio.CapacityLimiter | None = None
        self._moderation = Moderation(core)  # the prompt filters' screen

    # Queueing ----------------------------------------------------------

    def quote(self, req: TextRequest) -> float:
        """The dry-run price of a text request."""
        return text_quote(self._core.models, req)

    async def submit_text(self, submitter: Submitter, body: Any) -> Queued | Quote:
        """Queue a text request; answers the 202 body (or the dry-run quote)."""
        core = self._core
        req = parse_text_request(body, http_webhooks=core.config.webhooks.call_private)
        if req.dry_run:
            await self._moderation.screen_text(submitter.api_key, req, submitter.client)
            # A shared key is served as its lender's key, and checked as
            # its request would be (the AI Horde's dry run checks it so).
            quote = self.quote(req)
            online = [] if req.models else await core.pool.get(core.clock.now())
            ceiling = text_ceiling(core.models, req, online)
            await core.store.requester_by_key(
                key_hash=hash_key(submitter.api_key),
                now=core.clock.now(),
                max_length=req.max_length,
                quote=quote if ceiling is None else max(quote, ceiling),
            )
            return Quote(quote)
        return await self.queue_text(submitter, req)

    async def queue_text(self, submitter: Submitter, req: TextRequest) -> Queued:
        """Queue a validated text request; answers the 202 body."""
        core = self._core
        key_hash = hash_key(submitter.api_key)
        async with self._refusals_counted(key_hash, submitter.client):
            req = await self._screened(submitter, self._moderation.screen_text, req)
            online = await core.pool.get(core.clock.now())
            new = new_text_request(
                req,
                self.quote,
                scoped_operation_key(submitter.api_key, submitter.operation_key),
                ceiling=lambda r: text_ceiling(core.models, r, online),
            )
            submitted = await core.store.submit_request(
                key_hash=key_hash,
                new=new,
                request_id=str(uuid.uuid4()),
                now=core.clock.now(),
                upfront_max_length=UPFRONT_MAX_LENGTH,
                client_agent=submitter.client_agent,
                online=online,
                reader=submitter.reader,
                client=submitter.client,
            )
        if not submitted.replayed:
            await core.queue_changed(submitted.view)
        return self._text_queued(req, submitted)

    async def queue_completion(
        self, submitter: Submitter, req: CompletionRequest
    ) -> tuple[Queued, Context]:
        """Queue an OpenAI legacy completion as a text request, routed with
        the context ``completion_context`` chooses from the workers online
        now that could take it; answers the 202 body and that context."""
        core = self._core
        online = await core.pool.get(core.clock.now())
        context = completion_context(req, completion_offers(req.text, online))
        queued = await self.queue_text(submitter, with_context(req, context))
        return queued, context

    def _text_queued(self, req: TextRequest, submitted: Submitted) -> Queued:
        warnings = []
        if submitted.queued.max_length != req.max_length:
            warnings.append(
                RequestWarning(
                    "MaxLengthDowngraded",
                    f"params.max_length was lowered from {req.max_length} to "
                    f"{submitted.queued.max_length} because of allow_downgrade.",
                )
            )
        message = None
        if not submitted.possible:
            expiry = int(self._core.config.horde.request_expiry)
            message = (
                "No worker online can serve this request now; it waits for one "
                f"and expires {expiry} s after its last chance."
            )
            warnings.append(RequestWarning("NoAvailableWorker", message))
        return Queued(
            submitted.request_id, submitted.queued.quote, message=message, warnings=tuple(warnings)
        )

    async def submit_chat(self, submitter: Submitter, body: Any) -> Queued:
        """Queue a chat request (see contract.chat_admission.admit_within for what is refused)."""
        return await self.queue_chat(submitter, parse_chat_request(body))

    async def queue_chat(
        self, submitter: Submitter, req: ChatRequest, response: dict[str, Any] | None = None
    ) -> Queued:
        """Queue a validated chat request; answers the 202 body (its budget
        refusals counted toward the rate). ``response``: the record of a
        stored Response, kept with the request (``stored_response``)."""
        async with self._refusals_counted(hash_key(submitter.api_key), submitter.client):
            req = await self._screened(submitter, self._moderation.screen_chat, req)
            return await self._queue_chat(submitter, req, response)

    async def _queue_chat(
        self, submitter: Submitter, req: ChatRequest, response: dict[str, Any] | None = None
    ) -> Queued:
        """As ``queue_chat``.

        A resubmit with the same operation key answers the first request
        before anything else is checked (the workers may have changed
        since), and before its images are fetched or stored. The request is
        fingerprinted once, as the client sent it: its images are stored
        under a request id of their own, which the fingerprint must not see.
        """
        operation_key = scoped_operation_key(submitter.api_key, submitter.operation_key)
        fingerprint = req.fingerprint() if operation_key is not None else None
        key_hash = hash_key(submitter.api_key)
        if req.has_images and operation_key is not None:
            first = await self._core.store.first_request(
                key_hash=key_hash, operation_key=operation_key, kind="chat", fingerprint=fingerprint
            )
            if first is not None:
                return self._first_again(first)
        allowance = None
        if req.has_images:
            allowance = await self._image_allowance(key_hash, req, submitter.client)
        intake = submitter.intake(str(uuid.uuid4()), response)
        async with self._images_taken(req, intake.request_id, allowance) as taken:
            outcome = await self._admission.queue(
                key_hash=key_hash,
                req=taken,
                operation_key=operation_key,
                fingerprint=fingerprint,
                intake=intake,
            )
            if isinstance(outcome, FirstRequest):
                await self._drop_images(taken, intake.request_id)  # the first request has its own
                return self._first_again(outcome)
        await self._core.queue_changed(outcome.view)
        return _chat_queued(outcome)

    @contextlib.asynccontextmanager
    async def _images_taken(
        self, req: ChatRequest, request_id: str, allowance: ImageAllowance | None
    ) -> AsyncIterator[ChatRequest]:
        """``req`` with its images taken in under ``request_id`` while the
        block admits it: dropped again when the block fails (not queued:
        its images go), and ``allowance`` released at the end (its images
        are held in storage then, or gone)."""
        try:
            taken = await self._take_images(req, request_id, allowance)
            try:
                yield taken
            except BaseException:
                await self._drop_images(taken, request_id)
                raise
        finally:
            if allowance is not None:
                allowance.release()

    def _first_again(self, first: FirstRequest) -> Queued:
        """The answer to a resubmit: the first request's id and quote."""
        billions = max(self._core.models.billions(m) for m in first.models)
        return Queued(first.id, kudos_rules.request_quote(first.max_length, 1, billions))

    async def _screened(
        self,
        submitter: Submitter,
        screen: Callable[[str, R, str | None], Awaitable[R]],
        req: R,
    ) -> R:
        """``req`` admitted by the horde's modes (maintenance, raid) and
        screened by the prompt filters (refused, or with its replacements).
        Called inside ``_refusals_counted``, after the client's address was
        checked: a timed-out client is refused before its prompt is read,
        and a filter's refusal is its address's offence."""
        await self._core.modes.admit_request(submitter.api_key, submitter.client)
        return await screen(submitter.api_key, req, submitter.client)

    @contextlib.asynccontextmanager
    async def _refusals_counted(self, key_hash: str, client: str | None) -> AsyncIterator[None]:
        """A budget refusal raised inside counted toward the requester's
        rate (its anonymous client's), as a request queued would be
        (decision 0071): a flooder past a budget is then refused by the
        rate's one read. Counting is best-effort: the refusal stands.
        First, a client timed out or blocked is refused (TimeoutIP), and a
        filter's or budget's refusal inside counts as its offence
        (horde.addresses)."""
        core = self._core
        await core.addresses.check(client)
        try:
            yield
        except HordeError as exc:
            await core.addresses.offended(client, exc.rc.name)
            if exc.rc in budgets.COUNTED_REFUSALS:
                try:
                    await core.store.count_refusal(
                        key_hash=key_hash, client=client, now=core.clock.now()
                    )
                except Exception as failure:  # the refusal is the answer either way
                    log.warning("a budget refusal went uncounted: %s", failure)
            raise

    async def _image_allowance(
        self, key_hash: str, req: ChatRequest, client: str | None
    ) -> ImageAllowance:
        """Before any image is fetched, decoded or stored: 429
        RequestRateExceeded past its requester's rate, 413 TooManyImages
        when the request has more than its user's role may send in one, 429
        StoredBytesExceeded when the user's image budget has no room left
        (what its requests hold, read now, and what it is taking in); else
        the allowance its intake counts its images against (decision 0070).
        The other budgets are checked where the request is stored. An
        anonymous request's image budget is its client address's (decision
        0071)."""
        core = self._core
        user = await core.store.image_holdings(
            key_hash=key_hash, client=client, now=core.clock.now()
        )
        budget = core.store.rules.budgets.of(
            anonymous=user.anonymous, trusted=user.trusted, admin=user.admin
        )
        role = budgets.role_of(anonymous=user.anonymous, trusted=user.trusted)
        refusal = budgets.too_many_images(budget, role, image_count(req.messages)[0])
        if refusal is not None:
            raise refusal
        allowance = ImageAllowance(self._intakes, user.account, budget, role, user.image_bytes)
        allowance.check_open()
        return allowance

    async def _take_images(
        self, req: ChatRequest, request_id: str, allowance: ImageAllowance | None
    ) -> ChatRequest:
        """``req`` with its images fetched, checked and stored under
        ``request_id``, counted against ``allowance``."""
        if not req.has_images:
            return req
        blobs = self._core.blobs
        if blobs is None:
            raise HordeError(RC.ChatRequestInvalid, "This horde keeps no images.", param="messages")
        if self._fetching is None:  # the same; shared by every request's fetches
            self._fetching = anyio.CapacityLimiter(IMAGE_FETCHES_PER_PROCESS)
        return await request_images.take_images(
            req,
            blobs,
            request_id,
            fetch_private=self._core.config.images.fetch_private,
            turns=self._normalising,
            allowance=allowance,
            fetches=self._fetching,
        )

    async def _drop_images(self, req: ChatRequest, request_id: str) -> None:
        if req.has_images and self._core.blobs is not None:
            with anyio.CancelScope(shield=True):
                await self._core.blobs.delete(request_images.image_keys(request_id, req))

    # Status ------------------------------------------------------------

    async def submitted_text(self, api_key: str, request_id: str) -> SubmittedRequest:
        """A text request as it was queued (GET /generate/text/request/{id}),
        for the user who queued it or an admin."""
        canonical = parse_uuid(request_id)
        if canonical is None:
            raise HordeError(RC.RequestNotFound, f"No request with id {request_id[:64]!r}.")
        return await self._core.store.submitted_text(
            key_hash=hash_key(api_key), request_id=canonical
        )

    async def status(
        self,
        kind: str,
        request_id: str,
        *,
        with_position: bool = True,
        with_free_threads: bool = False,
        wait: float = 0.0,
    ) -> RequestStatus:
        """A ``kind`` ("text" or "chat") request's status: for a chat one also
        its structured replies, why no online worker can take it
        (``impossible``), and the fault.

        ``with_position`` False answers queue_position 0 and a wait_time
        without the queue ahead, for the front's re-checks (cheaper).
        ``with_free_threads`` also counts the eligible threads not busy with
        a job (one more read), for the front's fail_fast check. ``wait``
        long-polls (``_long_polled``).
        """
        key = StatusKey(kind, _canonical(kind, request_id), with_position, with_free_threads)
        if wait > 0:
            return await self._long_polled(key, wait)
        return await self._read(key)

    async def _long_polled(self, key: StatusKey, wait: float) -> RequestStatus:
        """A status read that waits for news (GET .../status/{id}?wait=N, a
        hordelite extension): the status at once when the request has ended,
        else at its next change (a job handed out or given back, a
        generation, the end) or after ``wait`` seconds, whichever is first.

        The waiter is taken before the first read, so that a change committed
        during it is not missed; the process stopping wakes it.
        """
        core = self._core
        with core.signals.status_waiter(key.request_id) as changed:
            status = await self._read(key)
            if status.done or status.faulted or core.stopping:
                return status
            deadline = anyio.current_time() + wait
            while not changed.is_set() and anyio.current_time() < deadline:
                with anyio.move_on_after(
                    look_again_by(core.signals, deadline) - anyio.current_time()
                ):
                    await changed.wait()
                if core.signals.degraded:  # the change may have gone unsignalled
                    fresh = await self._read(key)
                    if fresh != status:
                        return fresh
        return await self._read(key)

    async def _read(self, key: StatusKey) -> RequestStatus:
        """The status ``key`` asks for, from the cache while its request's
        version is the one it was read under."""
        core = self._core
        now = core.clock.now()
        # Read before the database: a change committed after this read
        # bumps the version, so what is cached below is not served for it.
        version = await core.signals.request_version(key.request_id)
        cached = core.statuses.get(key, version, now)
        if cached is not None:
            return cached
        parts = await core.store.request_status(
            request_id=key.request_id,
            kind=key.kind,
            now=now,
            with_position=key.with_position,
            with_free_threads=key.with_free_threads,
            online=await core.pool.get(now),
        )
        status = status_of(parts, core.config.horde.request_expiry)
        core.statuses.put(key, version, now, status)
        return status

    # Stored Responses ----------------------------------------------------

    async def stored_response(
        self, api_key: str, client: str | None, request_id: str
    ) -> dict[str, Any] | None:
        """The record a stored Response keeps with its chat request
        (decision 0078), for the key that queued it only (the anonymous
        key's, which everyone shares, for its address only); None for
        anyone else, and when there is none."""
        canonical = parse_uuid(request_id)
        if canonical is None:
            return None
        record = await self._core.store.stored_response(request_id=canonical)
        if record is None or record.get("key") != hash_key(api_key):
            return None
        if api_key == ANONYMOUS_API_KEY and record.get("client") != client:
            return None
        return record

    async def delete_response(self, api_key: str, client: str | None, request_id: str) -> bool:
        """Forget a stored Response, and cancel its request if it still
        waits (its reply would be read by nobody: it charges nothing, as an
        abandoned call's); False when it is not the caller's to delete."""
        canonical = parse_uuid(request_id)
        if canonical is None or await self.stored_response(api_key, client, canonical) is None:
            return False
        await self._core.store.forget_response(request_id=canonical)
        status = await self.status("chat", canonical, with_position=False)
        if not (status.done or status.faulted):
            await self.abandon(canonical)
        return True

    # Cancel ------------------------------------------------------------

    async def cancel(self, kind: str, request_id: str) -> RequestStatus:
        """End the request; answers its status as the cancel left it.

        Streamed jobs are settled on what their workers posted before the
        cancel: their leases take no more text from here on, and the next
        progress answer says cancelled. Kudos move in the cancel's own
        transaction.
        """
        return await self._cancel(kind, _canonical(kind, request_id), unread=False)

    async def abandon(
        self, request_id: str, kind: str = "chat", *, orphaned: bool = False
    ) -> RequestStatus:
        """Cancel a request whose only reader, an OpenAI call, is gone
        without its answer (decision 0051): as ``cancel``, and a job still
        out that settles later charges the requester nothing. ``orphaned``:
        the call's process is gone (a take-over or a lapsed reader lease):
        its streamed jobs are settled charging nothing too (decision 0073)."""
        canonical = _canonical(kind, request_id)
        return await self._cancel(kind, canonical, unread=True, orphaned=orphaned)

    async def _cancel(
        self, kind: str, canonical: str, *, unread: bool, orphaned: bool = False
    ) -> RequestStatus:
        core = self._core
        now = core.clock.now()
        parts = await core.store.cancel_request(
            request_id=canonical,
            kind=kind,
            now=now,
            posted=await self._streams_stopped(canonical),
            unread=unread,
            orphaned=orphaned,
        )
        if parts.request.image_bytes and core.blobs is not None:
            # Its images go now, not at the retention's purge: whatever a
            # job still out would read of them, nobody reads its reply.
            with anyio.CancelScope(shield=True):
                await core.blobs.delete_prefixed([canonical])
        core.metrics.kudos_rewarded.inc(parts.settled[0])
        core.metrics.kudos_charged.inc(parts.settled[1])
        await core.signals.notify_request(canonical)
        await core.signals.end_stream(canonical, now)
        core.webhooks_due.set()
        return status_of(parts, core.config.horde.request_expiry)

    async def _streams_stopped(self, canonical: str) -> dict[str, int]:
        """The request's streamed jobs stopped: their leases cancelled, so
        that they take no more text and the next progress answer says
        cancelled. Answers what each job's worker posted before (characters
        of content and reasoning), which the job is settled on."""
        signals = self._core.signals
        leases = await signals.request_leases(canonical)
        for lease in leases:
            lease.cancelled = True
            await signals.save_lease(lease)
        return {lease.job_id: len(lease.content) + len(lease.reasoning) for lease in leases}


def _canonical(kind: str, request_id: str) -> str:
    canonical = parse_uuid(request_id)
    if canonical is None:
        raise HordeError(RC.RequestNotFound, f"No {kind} request with id {request_id[:64]!r}.")
    return canonical


def _chat_queued(submitted: Submitted) -> Queued:
    message = None
    if not submitted.possible:
        reason = chat.impossible_reason(submitted.view, submitted.online or [])
        message = (
            reason.message if reason else "No worker online can take this request now."
        ) + " It waits for one."
    return Queued(
        submitted.request_id,
        submitted.queued.quote,
        context_adjustments=submitted.queued.context_adjustments or None,
        message=message,
        warnings=() if message is None else (RequestWarning("NoAvailableWorker", message),),
    )
