"""The horde service: what the routes call.

Each method validates through ``hordelite.contract``, runs one transaction
through ``Database``, signals waiters, and returns the answer's fields as a
frozen result (``hordelite.horde.results``). It raises HordeError for every
refusal; routes only render.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import secrets
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import anyio
import anyio.to_thread

from hordelite import __version__
from hordelite.blobs import BlobStore
from hordelite.clock import Clock, SystemClock
from hordelite.config import Config
from hordelite.contract import kudos as kudos_rules
from hordelite.contract._fields import parse_uuid
from hordelite.contract.chat_reply import (
    FAULT_REASONS,
    ChatReply,
    ChatSubmit,
    Verdict,
    heavy_to_judge,
    is_chat_submit,
    judge_chat_reply,
    parse_chat_submit,
)
from hordelite.contract.chat_request import ChatRequest, parse_chat_request
from hordelite.contract.eligibility import RequestView, WorkerView, can_serve, skipped_counts
from hordelite.contract.faults import Fault
from hordelite.contract.limits import (
    ANONYMOUS_API_KEY,
    DEGRADED_POLL_SECONDS,
    IMAGES_NORMALISED_AT_ONCE,
    MAX_USER_ID_DIGITS,
    MODEL_STATS_TTL,
    POOL_SNAPSHOT_SECONDS,
    READY_CHECK_SECONDS,
    SKIPPED_SAMPLE_SECONDS,
    STATUS_CACHE_ENTRIES,
    STATUS_POSITION_SECONDS,
    UPFRONT_MAX_LENGTH,
)
from hordelite.contract.models import ModelReference
from hordelite.contract.presence import is_online
from hordelite.contract.progress import Lease, accept, parse_progress
from hordelite.contract.text import (
    JobSubmit,
    TextRequest,
    parse_job_submit,
    parse_pop_request,
    parse_text_request,
)
from hordelite.contract.unicode_rules import worker_name_key
from hordelite.errors import RC, HordeError, HordeliteError, StorageUnavailable, bad_request
from hordelite.horde import chat, images
from hordelite.horde.metrics import HordeMetrics
from hordelite.horde.results import (
    Generation,
    ModelStats,
    PopAnswer,
    PoppedJob,
    ProgressAnswer,
    Queued,
    Quote,
    RequestStatus,
    RequestWarning,
    SubmitAnswer,
    UserAnswer,
    WorkerAnswer,
    WorkerUpdate,
)
from hordelite.signals import LocalSignals, ProgressEntry, Signals
from hordelite.storage import queries as q
from hordelite.storage.database import Database
from hordelite.storage.ledger import SubmitResult
from hordelite.storage.migrations import upgrade
from hordelite.storage.store import Store

P = ParamSpec("P")
T = TypeVar("T")

# Chat admission outside the write transaction: tries before admitting
# inside it, and how many sets of models keep their last capacity.
ADMISSION_TRIES = 3
CAPACITY_CACHE = 256


def new_text_request(
    req: TextRequest, quote: Callable[[TextRequest], float], operation_key: str | None = None
) -> q.NewRequest:
    """What storage queues for a validated text request (and its
    allow_downgrade alternative at the up-front threshold)."""

    def build(r: TextRequest) -> q.NewRequest:
        return q.NewRequest(
            eligibility=RequestView(
                models=r.models,
                max_length=r.max_length,
                max_context_length=r.max_context_length,
                trusted_workers=r.trusted_workers,
                slow_workers=r.slow_workers,
                nsfw=r.nsfw,
                worker_ids=r.workers,
                worker_blacklist=r.worker_blacklist,
            ),
            prompt=r.prompt,
            params=r.params,
            n=r.n,
            quote=quote(r),
            softprompt=r.softprompt,
            proxied_account=r.proxied_account,
            webhook=r.webhook,
            operation_key=operation_key,
            fingerprint=_fingerprint(dataclasses.asdict(r)) if operation_key else None,
        )

    new = build(req)
    if req.allow_downgrade and req.max_length > UPFRONT_MAX_LENGTH:
        lowered = {**req.params, "max_length": UPFRONT_MAX_LENGTH}
        low = dataclasses.replace(req, max_length=UPFRONT_MAX_LENGTH, params=lowered)
        new = dataclasses.replace(new, downgrade=build(low))
    return new


async def run_pure(heavy: bool, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Pure CPU work (no I/O, no shared state): on the event loop when light,
    in a worker thread when ``heavy``, so that the loop keeps serving while
    it runs. Never inside a transaction: the caller holds no lock."""
    if not heavy:
        return fn(*args, **kwargs)
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


class _Replan(HordeliteError):
    """Chat admission was worked out for another capacity than the write
    transaction finds: roll back (nothing is written yet), admit again."""

    def __init__(self, capacity: chat.Capacity) -> None:
        super().__init__("the capacity changed")
        self.capacity = capacity


def _admission(
    req: ChatRequest, cap: chat.Capacity, models: ModelReference, operation_key: str | None
) -> q.NewRequest | HordeError:
    """``chat.admit_within``, its refusal returned (raised later, in order)."""
    try:
        return chat.admit_within(req, cap, models, operation_key)
    except HordeError as refusal:
        return refusal


def _fingerprint(data: Any) -> str:
    raw = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


def _scoped_operation_key(api_key: str, operation_key: str | None) -> str | None:
    """The operation key a submit is stored under: None for the anonymous user.

    Keys are scoped to the user, and every anonymous caller is the same
    user: a key would let one anonymous caller get another's request (or
    its 409) back by guessing or reusing the key, so it is ignored there.
    """
    return None if api_key == ANONYMOUS_API_KEY else operation_key


class _PoolSnapshot:
    """The online workers, read at most POOL_SNAPSHOT_SECONDS ago and under
    the current pool version (decision 0038): a worker joining, coming back,
    declaring anew or changed by its owner bumps the version, so only what
    a worker's own jobs change (its measured speed) can be that old. A
    worker whose check-in ends leaves the snapshot at its ``until``."""

    def __init__(self, db: Database, signals: Signals) -> None:
        self._db = db
        self._signals = signals
        self._lock = anyio.Lock()
        self._workers: list[q.OnlineWorker] = []
        self._read_at = -math.inf
        self._version = -1

    def _current(self) -> bool:
        fresh = anyio.current_time() - self._read_at < POOL_SNAPSHOT_SECONDS
        return fresh and self._version == self._signals.pool_version()

    async def get(self, now: float) -> list[WorkerView]:
        if not self._current():
            async with self._lock:  # one read for every caller that needs a fresh one
                if not self._current():
                    version = self._signals.pool_version()  # before the read, as for statuses
                    self._workers = await self._db.read(q.online_pool, now)
                    self._read_at = anyio.current_time()
                    self._version = version
        return [w.view for w in self._workers if w.until > now]


_StatusKey = tuple[str, str, bool, bool]  # kind, request id, with_position, with_free_threads


class _StatusCache:
    """Statuses as last read, each under its request's version (decision 0038).

    An entry answers while the version is the one it was read under and, for
    a request still waiting for a worker (its position, wait time and
    is_possible move with the rest of the queue), for STATUS_POSITION_SECONDS
    at most. The least recently read entries go past STATUS_CACHE_ENTRIES.
    """

    def __init__(self) -> None:
        self._entries: OrderedDict[_StatusKey, tuple[int, float, RequestStatus]] = OrderedDict()

    def get(self, key: _StatusKey, version: int, now: float) -> RequestStatus | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] != version or now >= entry[1]:
            return None
        self._entries.move_to_end(key)
        return entry[2]

    def put(self, key: _StatusKey, version: int, now: float, status: RequestStatus) -> None:
        until = now + STATUS_POSITION_SECONDS if _moves_with_queue(status) else math.inf
        self._entries[key] = (version, until, status)
        self._entries.move_to_end(key)
        if len(self._entries) > STATUS_CACHE_ENTRIES:
            self._entries.popitem(last=False)


def _moves_with_queue(status: RequestStatus) -> bool:
    """Whether parts of this status follow other requests and the pool, not
    only its own request: while it waits for a worker to take a job."""
    return not (status.done or status.faulted) and status.waiting > 0


class _SkippedSample:
    """The waiting requests an empty pop counts ``skipped`` over, read at most
    SKIPPED_SAMPLE_SECONDS ago (the counts are advice to the worker's owner;
    reading and decoding them cost an empty pop most of its time)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._lock = anyio.Lock()
        self._sample: list[RequestView] = []
        self._read_at = -math.inf

    def stale(self) -> None:
        self._read_at = -math.inf

    async def get(self) -> list[RequestView]:
        async with self._lock:  # one read for every pop that needs a fresh one
            if anyio.current_time() - self._read_at > SKIPPED_SAMPLE_SECONDS:
                self._sample = await self._db.read(q.skipped_sample)
                self._read_at = anyio.current_time()
            return self._sample


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def new_api_key() -> str:
    """16 random bytes, url-safe; never starting with "-", which command
    lines would read as a flag (``--key -abc``)."""
    while True:
        key = secrets.token_urlsafe(16)
        if not key.startswith("-"):
            return key


class Horde:
    def __init__(
        self,
        config: Config,
        db: Database,
        *,
        clock: Clock | None = None,
        signals: Signals | None = None,
        models: ModelReference | None = None,
        blobs: BlobStore | None = None,
    ) -> None:
        self.config = config
        self.db = db
        self.clock = clock or SystemClock()
        self.signals = signals or LocalSignals()
        # Where images taken in at submit are kept (hordelite.horde.images);
        # without a store, a request with an image is refused.
        self.blobs = blobs
        self._normalising: anyio.CapacityLimiter | None = None
        self.models = models or ModelReference.load(config.horde.model_reference or None)
        h = config.horde
        self.rules = q.Rules(
            job_ttl=h.job_ttl,
            request_expiry=h.request_expiry,
            retention=h.retention,
            worker_online=h.worker_online,
            max_faults=h.max_faults,
            maintenance_aborts=h.maintenance_aborts,
            concurrency=h.concurrency,
            anonymous_concurrency=h.anonymous_concurrency,
            allow_anonymous=h.allow_anonymous,
        )
        self.store = Store(db, self.rules, self.models.billions)
        self._model_stats: (
            tuple[float, tuple[tuple[ModelStats, ...], tuple[ModelStats, ...]]] | None
        ) = None
        self._stopping = False
        # The capacity each set of chat models last had (chat admission).
        self._capacities: dict[tuple[str, ...], chat.Capacity] = {}
        self._skipped_sample = _SkippedSample(db)
        self._statuses = _StatusCache()
        self._pool = _PoolSnapshot(db, self.signals)
        # Counters only on the hot paths; /metrics reads the rest (decision 0043).
        self.metrics = HordeMetrics()

    async def _queue_changed(self, request: RequestView | None = None) -> None:
        """Wake the pops that may take ``request`` (any pop: None), and let
        the next empty pop count ``skipped`` over the queue as it is now."""
        self._skipped_sample.stale()
        await self.signals.notify_queue(request)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def begin_shutdown(self) -> None:
        """Stop holding waits: each waiting pop answers now (a last try, then
        empty), each waiting OpenAI call gets its final answer."""
        self._stopping = True
        self._skipped_sample.stale()
        self.signals.notify_all_requests()  # this process's pops, calls, streams and reads

    async def unready(self) -> str | None:
        """Why this horde should get no new traffic now (``/readyz``), or
        None: it is stopping, its database does not answer within
        READY_CHECK_SECONDS, or its Redis signals are down."""
        if self._stopping:
            return "stopping"
        try:
            with anyio.fail_after(READY_CHECK_SECONDS):
                await self.db.ping()
        except (StorageUnavailable, TimeoutError):
            return "database"
        if self.signals.degraded:
            return "signals"
        return None

    async def online_workers(self, now: float) -> list[WorkerView]:
        """The online workers, from the pool snapshot (no read of its own
        while it is current)."""
        return await self._pool.get(now)

    def signals_ping(self) -> Callable[[], Awaitable[None]] | None:
        """A round trip to Redis when the signals go through it, else None.

        Only RedisSignals has ``ping``: in-process signals have nothing to
        reach, so the Signals protocol does not ask for one."""
        ping = getattr(self.signals, "ping", None)
        return ping if callable(ping) else None

    # Set-up ------------------------------------------------------------

    def migrate(self) -> tuple[int, int]:
        """Bring the schema up to date and make sure the anonymous user exists."""
        result = self.db.run_sync(upgrade, True)
        self.db.run_sync(q.ensure_anonymous, True, hash_key(ANONYMOUS_API_KEY), self.clock.now())
        return result

    async def create_user(
        self, username: str, *, kudos: float = 0.0, admin: bool = False, trusted: bool = False
    ) -> tuple[int, str]:
        """A new user and its API key (shown once: only its hash is stored)."""
        key = new_api_key()
        user_id = await self.db.write(
            q.create_user, username, hash_key(key), kudos, admin, trusted, self.clock.now()
        )
        return user_id, key

    # Requests ----------------------------------------------------------

    def quote(self, req: TextRequest) -> float:
        """The dry-run price: every job at full max_length on the largest model asked for."""
        sizes = [self.models.billions(m) for m in req.models] or [self.models.billions("")]
        return kudos_rules.request_quote(req.max_length, req.n, max(sizes))

    async def submit_text(
        self, api_key: str, body: Any, client_agent: str, operation_key: str | None = None
    ) -> Queued | Quote:
        """Queue a text request; answers the 202 body (or the dry-run quote).

        A resubmit with the same ``operation_key`` (Idempotency-Key) answers
        the first request again and queues and charges nothing (ignored for
        the anonymous user).
        """
        req = parse_text_request(body)
        if req.dry_run:
            await self.db.read(q.user_by_key, hash_key(api_key), self.rules)
            return Quote(self.quote(req))
        new = self._new_text(req, _scoped_operation_key(api_key, operation_key))
        submitted = await self._submit(api_key, new, client_agent)
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
            message = (
                "No worker online can serve this request now; it waits for one "
                f"and expires {int(self.config.horde.request_expiry)} s after its last chance."
            )
            warnings.append(RequestWarning("NoAvailableWorker", message))
        return Queued(
            submitted.request_id,
            submitted.queued.quote,
            message=message,
            warnings=tuple(warnings),
        )

    async def _submit(self, api_key: str, new: q.NewRequest, client_agent: str) -> q.Submitted:
        submitted = await self.db.write(
            q.submit_request,
            hash_key(api_key),
            new,
            str(uuid.uuid4()),
            self.clock.now(),
            self.rules,
            UPFRONT_MAX_LENGTH,
            client_agent,
            await self._pool.get(self.clock.now()),
        )
        if not submitted.replayed:
            await self._queue_changed(submitted.view)
        return submitted

    def _new_text(self, req: TextRequest, operation_key: str | None) -> q.NewRequest:
        return new_text_request(req, self.quote, operation_key)

    async def submit_chat(
        self, api_key: str, body: Any, client_agent: str, operation_key: str | None = None
    ) -> Queued:
        """Queue a chat request (see horde.chat.admit_within for what is refused)."""
        return await self.queue_chat(api_key, parse_chat_request(body), client_agent, operation_key)

    async def queue_chat(
        self, api_key: str, req: ChatRequest, client_agent: str, operation_key: str | None = None
    ) -> Queued:
        """Queue a validated chat request; answers the 202 body.

        A resubmit with the same operation key answers the first request
        before anything else is checked (the workers may have changed since);
        otherwise admission (horde.chat.admit_within) and queueing, in one
        write transaction whose admission was worked out just before it.
        """
        # Only a resubmit with an operation key is compared with its first request.
        fingerprint = req.fingerprint() if operation_key is not None else None
        operation_key = _scoped_operation_key(api_key, operation_key)
        key_hash = hash_key(api_key)
        request_id = str(uuid.uuid4())
        if req.has_images:
            if self.blobs is None:
                raise HordeError(
                    RC.ChatRequestInvalid, "This horde keeps no images.", param="messages"
                )
            if self._normalising is None:  # made on the loop that runs the horde
                self._normalising = anyio.CapacityLimiter(IMAGES_NORMALISED_AT_ONCE)
            req = await images.take_images(
                req,
                self.blobs,
                request_id,
                fetch_private=self.config.images.fetch_private,
                limiter=self._normalising,
            )
        try:
            return await self._queue_taken(
                key_hash, req, client_agent, operation_key, fingerprint, request_id
            )
        except BaseException:
            # Not queued (refused, or a resubmit answered by its first
            # request): the images taken in for it go.
            if req.has_images and self.blobs is not None:
                with anyio.CancelScope(shield=True):
                    await self.blobs.delete(images.image_keys(request_id, req))
            raise

    async def _queue_taken(
        self,
        key_hash: str,
        req: ChatRequest,
        client_agent: str,
        operation_key: str | None,
        fingerprint: str | None,
        request_id: str,
    ) -> Queued:
        # Admission is pure work over the whole conversation: it runs before
        # the write transaction, against the capacity the last transaction
        # for these models saw. The transaction reads the workers anyway and
        # uses the outcome when their capacity is the same (nearly always);
        # otherwise it gives up before writing anything, and admission runs
        # again outside it against what it saw. The last try admits inside.
        outcome: q.Submitted | q.FirstRequest | None = None
        for attempt in range(ADMISSION_TRIES):
            last = attempt == ADMISSION_TRIES - 1
            seen = self._capacities.get(req.models)
            planned = None
            if seen is not None:
                heavy = chat.heavy_to_admit(req)
                planned = await run_pure(heavy, _admission, req, seen, self.models, operation_key)

            def admit(
                online: list[WorkerView],
                seen: chat.Capacity | None = seen,
                planned: q.NewRequest | HordeError | None = planned,
                last: bool = last,
            ) -> q.NewRequest:
                cap = chat.capacity(req, online)
                if planned is None or cap != seen:
                    if not last:
                        raise _Replan(cap)
                    return chat.admit_within(req, cap, self.models, operation_key)
                if isinstance(planned, HordeError):
                    raise planned
                return planned

            try:
                outcome = await self.db.write(
                    q.submit_chat_request,
                    key_hash,
                    operation_key,
                    fingerprint,
                    admit,
                    request_id,
                    self.clock.now(),
                    self.rules,
                    UPFRONT_MAX_LENGTH,
                    client_agent,
                )
                break
            except _Replan as replan:
                self._remember_capacity(req.models, replan.capacity)
        assert outcome is not None
        if not isinstance(outcome, q.Submitted):
            billions = max(self.models.billions(m) for m in outcome.models)
            quote = kudos_rules.request_quote(outcome.max_length, 1, billions)
            if req.has_images and self.blobs is not None:  # the first request has its own
                await self.blobs.delete(images.image_keys(request_id, req))
            return Queued(outcome.id, quote)
        submitted = outcome
        await self._queue_changed(submitted.view)
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

    def _remember_capacity(self, models: tuple[str, ...], cap: chat.Capacity) -> None:
        self._capacities.pop(models, None)
        self._capacities[models] = cap
        if len(self._capacities) > CAPACITY_CACHE:
            # Model names are the clients': keep only the latest sets.
            del self._capacities[next(iter(self._capacities))]

    async def text_status(
        self, request_id: str, *, cancel: bool = False, wait: float = 0.0
    ) -> RequestStatus:
        """The status; with ``cancel``, end the request (answering its state
        before); with ``wait``, answer at the request's next change or after
        ``wait`` seconds (``long_polled``)."""
        if wait > 0 and not cancel:
            return await self.long_polled("text", request_id, wait)
        return await self._status("text", request_id, cancel)

    async def chat_status(
        self,
        request_id: str,
        *,
        cancel: bool = False,
        with_position: bool = True,
        with_free_threads: bool = False,
        wait: float = 0.0,
    ) -> RequestStatus:
        """A chat request's status: the text fields, the structured replies,
        why no online worker can take it (``impossible``), and the fault.

        ``with_position`` False answers queue_position 0 and a wait_time
        without the queue ahead, for the front's re-checks (cheaper).
        ``with_free_threads`` also counts the eligible threads not busy with
        a job (one more read), for the front's fail_fast check.
        """
        if wait > 0 and not cancel:
            return await self.long_polled("chat", request_id, wait)
        return await self._status("chat", request_id, cancel, with_position, with_free_threads)

    async def long_polled(self, kind: str, request_id: str, wait: float) -> RequestStatus:
        """A status read that waits for news (GET .../status/{id}?wait=N, a
        hordelite extension): the status at once when the request has ended,
        else at its next change (a job handed out or given back, a
        generation, the end) or after ``wait`` seconds, whichever is first.

        The waiter is taken before the first read, so that a change committed
        during it is not missed; the process stopping wakes it.
        """
        canonical = parse_uuid(request_id) or request_id
        with self.signals.status_waiter(canonical) as changed:
            status = await self._status(kind, request_id, cancel=False)
            if status.done or status.faulted or self._stopping:
                return status
            deadline = anyio.current_time() + wait
            while not changed.is_set() and anyio.current_time() < deadline:
                # While signals may be lost, look again every DEGRADED_POLL_SECONDS.
                left = deadline - anyio.current_time()
                with anyio.move_on_after(
                    min(left, DEGRADED_POLL_SECONDS) if self.signals.degraded else left
                ):
                    await changed.wait()
                if self.signals.degraded:
                    fresh = await self._status(kind, request_id, cancel=False)
                    if fresh != status:
                        return fresh
        return await self._status(kind, request_id, cancel=False)

    async def _status(
        self,
        kind: str,
        request_id: str,
        cancel: bool,
        with_position: bool = True,
        with_free_threads: bool = False,
    ) -> RequestStatus:
        canonical = parse_uuid(request_id)
        if canonical is None:
            raise HordeError(RC.RequestNotFound, f"No {kind} request with id {request_id[:64]!r}.")
        now = self.clock.now()
        if cancel:
            # Streamed jobs are settled on what their workers posted before
            # the cancel: their leases take no more text from here on, and
            # the next progress answer says cancelled.
            leases = await self.signals.request_leases(canonical)
            for lease in leases:
                lease.cancelled = True
                await self.signals.save_lease(lease)
            posted = {lease.job_id: len(lease.content) + len(lease.reasoning) for lease in leases}
            parts = await self.db.write(
                q.cancel_request, canonical, kind, now, self.rules, posted, self.models.billions
            )
            self.metrics.kudos_rewarded.inc(parts.settled[0])
            self.metrics.kudos_charged.inc(parts.settled[1])
            await self.signals.notify_request(canonical)
            await self.signals.end_stream(canonical, now)
            return self._status_of(parts)
        # Read before the database: a change committed after this read
        # bumps the version, so what is cached below is not served for it.
        version = await self.signals.request_version(canonical)
        key = (kind, canonical, with_position, with_free_threads)
        cached = self._statuses.get(key, version, now)
        if cached is not None:
            return cached
        parts = await self.db.read(
            q.request_status,
            canonical,
            kind,
            now,
            self.rules,
            with_position,
            with_free_threads,
            await self._pool.get(now),
        )
        status = self._status_of(parts)
        self._statuses.put(key, version, now, status)
        return status

    def _status_of(self, parts: q.StatusSnapshot) -> RequestStatus:
        req = parts.request
        done_jobs = [j for j in parts.jobs if j.state == "done"]
        processing = len(parts.jobs) - len(done_jobs)
        queued = req.queued
        eligible = [w for w in parts.online if can_serve(w, req.view)]
        wait_time = self._wait_time(req, parts.position, processing, eligible) if queued else 0
        impossible = None
        if req.kind == "chat" and queued and not eligible:
            impossible = chat.impossible_reason(req.view, parts.online)
        faulted = req.state in ("faulted", "expired")
        free_threads = None
        if queued and parts.busy is not None:
            busy = parts.busy
            free_threads = sum(max(w.threads - busy.get(w.id, 0), 0) for w in eligible)
        return RequestStatus(
            kind=req.kind,
            finished=len(done_jobs),
            processing=processing,
            restarted=req.restarts,
            waiting=req.remaining if req.state == "waiting" else 0,
            done=req.state in ("done", "cancelled"),
            faulted=faulted,
            wait_time=wait_time,
            queue_position=parts.position,
            kudos=round(req.kudos, 2),
            is_possible=bool(eligible) if queued else True,
            generations=tuple(self._generation(j) for j in done_jobs),
            impossible=impossible,
            context_adjustments=req.context_adjustments if req.kind == "chat" else None,
            fault=self._fault_of(req) if faulted else None,
            free_threads=free_threads,
        )

    def _fault_of(self, req: q.StoredRequest) -> Fault:
        """The last fault a faulted or expired request shows (decision 0022)."""
        if req.fault_rc:
            return Fault(req.fault_rc, req.fault_message or "")
        expiry = int(self.config.horde.request_expiry)
        return Fault(
            RC.RequestExpired.name, f"The request expired: no worker took it within {expiry} s."
        )

    @staticmethod
    def _generation(job: q.StoredJob) -> Generation:
        return Generation(
            worker_id=job.worker_id,
            worker_name=job.worker_name,
            model=job.model,
            state=job.gen_state,
            text=job.text,
            seed=job.seed if job.seed is not None else 0,
            gen_metadata=tuple(job.gen_metadata or ()),
            reply=None if job.reply is None else ChatReply.from_json(job.reply),
            kudos=job.cost if job.kind == "chat" else None,
            charge_basis=job.charge_basis,
        )

    def _wait_time(
        self, req: q.StoredRequest, position: int, processing: int, eligible: list[WorkerView]
    ) -> int:
        """Seconds until the request is done, from the throughput of the workers that can serve it."""
        if not eligible:
            return 0
        throughput = sum(w.speed * w.threads for w in eligible)
        tokens = (position + req.remaining + processing) * req.view.max_length
        return math.ceil(tokens / throughput)

    # Jobs --------------------------------------------------------------

    async def pop(
        self, api_key: str, body: Any, *, arrived: float | None = None, base_url: str = ""
    ) -> PopAnswer:
        """Check a worker in and hand it a job, waiting up to ``wait`` seconds for one.

        A waiting pop sleeps on the queue signal, woken when a job it can
        take is queued; each attempt is one transaction. The last attempt
        (or the only one, without ``wait``) also counts what was skipped; a
        pop whose wait runs out after an attempt answers without another.
        ``base_url``: the horde's address as the worker reached it (the
        signed image URLs start with it). ``arrived`` (anyio's clock): when
        the request reached the server; the
        wait counts from then, so a pop that waited for a busy loop to run
        it is not answered that much later than its client asked.
        """
        pop = parse_pop_request(body, self.config.horde.max_pop_wait)
        worker_name_key(pop.name)  # a name no worker can have is refused before the key is read
        key_hash = hash_key(api_key)
        deadline = (anyio.current_time() if arrived is None else arrived) + pop.wait
        worker: WorkerView | None = None
        while True:
            with self.signals.queue_waiter(worker) as waiter:
                last = self._stopping or anyio.current_time() >= deadline
                # How long this check-in lasts depends on how long the pop still waits.
                poll_left = (
                    None if pop.wait <= 0 else 0.0 if last else deadline - anyio.current_time()
                )
                if last and worker is not None:
                    # The wait ran out (or the horde stops) after an attempt
                    # found nothing, and any job queued since would have
                    # woken this pop: no transaction, only the counts. The
                    # check-in of that attempt lasts past this answer, and
                    # the worker's next pop is the next attempt. (So 1,000
                    # long-polls ending together cost no 1,000 writes.)
                    return await self._nothing_for(worker)
                # ``skipped`` is counted after the transaction, and only
                # when it hands out nothing: a pop that takes a job reads
                # no sample.
                result = await self.db.write(
                    q.pop_job,
                    key_hash,
                    pop,
                    self.clock.now(),
                    self.rules,
                    not self.db.is_sqlite,
                    poll_left,
                )
                if result.pool_changed:
                    await self.signals.notify_pool()
                if result.job is not None:
                    break
                if last:
                    return await self._nothing_for(result.worker)
                worker = result.worker
                until = deadline - anyio.current_time()
                if self.signals.degraded:
                    until = min(until, DEGRADED_POLL_SECONDS)  # no signal may come
                try:
                    with anyio.move_on_after(until):
                        await waiter.event.wait()
                except anyio.get_cancelled_exc_class():
                    if waiter.event.is_set():
                        # Woken for a job we will not pop: pass it on.
                        await self.signals.notify_queue()
                    raise
        job = result.job  # the loop ends only with a job
        self.metrics.pops.labels("job").inc()
        await self.signals.touch_request(job.request_id)
        if job.stream:
            await self.signals.put_lease(
                Lease.at_pop(
                    job_id=job.id,
                    request_id=job.request_id,
                    key_hash=key_hash,
                    worker_id=result.worker.id,
                    worker_name=pop.name,
                    model=job.model,
                    gen=job.gen,
                    now=self.clock.now(),
                    ttl=job.ttl,
                    trusted=result.worker.trusted,
                    max_length=job.max_length,
                )
            )
        payload = job.payload
        if job.chat and self.blobs is not None:
            # After the transaction: reading images for a base64 worker, or
            # storing offloaded messages, holds no lock. ``base_url`` is how
            # the worker reached this horde.
            payload = await images.hand_images(
                job.payload,
                self.blobs,
                result.worker,
                request_id=job.request_id,
                base_url=base_url,
                now=self.clock.now(),
                ttl=job.ttl,
                offload_bytes=self.config.images.offload_bytes,
            )
        popped = PoppedJob(job.id, job.model, payload, job.softprompt, job.ttl, job.chat)
        return PopAnswer(popped, {})

    async def _nothing_for(self, worker: WorkerView) -> PopAnswer:
        """An empty pop's answer: what the worker skipped among the best
        waiting requests (read at most SKIPPED_SAMPLE_SECONDS ago)."""
        self.metrics.pops.labels("empty").inc()
        return PopAnswer(None, skipped_counts(worker, await self._skipped_sample.get()))

    async def post_progress(self, api_key: str, body: Any) -> ProgressAnswer:
        """A streamed job's progress post, answered from its lease: no
        database read on this path (worker guide, "Streaming progress")."""
        post = parse_progress(body)
        lease = await self.signals.lease(post.job_id)
        if lease is None and self.signals.degraded:
            # The leases are out of reach: the worker keeps generating and
            # submits; the stream gets the whole reply then.
            raise HordeError(RC.ChatProgressUnavailable)
        if lease is None:
            if await self.signals.ended(post.job_id):
                raise HordeError(RC.ChatJobAborted)
            raise HordeError(
                RC.ChatProgressNotStreaming,
                "This job was not popped with stream_progress (or is unknown): stop posting.",
            )
        if hash_key(api_key) != lease.key_hash:
            raise HordeError(RC.WrongCredentials, "This job was given to another user's worker.")
        accepted = accept(lease, post, self.clock.now())
        await self.signals.save_lease(lease)  # its counts, text and lease end moved
        if accepted.appended:
            await self.signals.append_progress(
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
        self.metrics.progress_posts.inc()
        return ProgressAnswer(accepted.accepted_seq, accepted.cancelled)

    async def submit(self, api_key: str, body: Any) -> SubmitAnswer:
        """A worker's answer to a job: a text generation, a chat reply or a fault.

        A refused chat reply is recorded on its job (a fault that follows is
        counted by it) and then refused: the refusal is raised after commit.
        """
        key_hash = hash_key(api_key)
        verdict: Verdict | None = None
        if isinstance(body, dict) and is_chat_submit(body):
            chat_sub = await self._parse_chat_submit(api_key, body)
            if chat_sub.reply is not None:
                verdict = await self._judge(key_hash, chat_sub)
            sub: JobSubmit | ChatSubmit = chat_sub
        else:
            sub = parse_job_submit(body)
        lease = await self.signals.lease(sub.id)
        now = self.clock.now()
        result = await self.db.write(
            q.submit_job,
            key_hash,
            sub,
            now,
            self.rules,
            self.models.billions,
            lease.expires if lease else None,
            verdict,
        )
        if result.refusal is not None:
            raise result.refusal
        self._count_submit(sub, result, now)
        if lease is not None and not lease.cancelled:
            await self.signals.end_lease(sub.id, now)  # the submit ends its posts
        if result.requeued:
            await self._queue_changed()
        await self.signals.notify_request(result.request_id)
        if result.request_ended:
            await self.signals.end_stream(result.request_id, now)
        return SubmitAnswer(result.reward)

    def _count_submit(self, sub: JobSubmit | ChatSubmit, result: SubmitResult, now: float) -> None:
        m = self.metrics
        if sub.state == "faulted":
            reason = sub.fault_reason if isinstance(sub, ChatSubmit) else None
            # Only the reasons the horde knows: a worker cannot grow the label set.
            m.faults.labels(reason if reason in FAULT_REASONS else "none").inc()
        m.kudos_rewarded.inc(result.reward)
        m.kudos_charged.inc(result.cost)
        if result.done_kind is not None:
            m.request_latency.labels(result.done_kind).observe(max(0.0, now - result.created))

    async def _judge(self, key_hash: str, sub: ChatSubmit) -> Verdict | None:
        """The reply judged against its job before the write transaction, so
        that the write lock is not held while its content is parsed and
        checked against the request's schema; None when the job is not the
        key's chat job in progress (the transaction then refuses it)."""
        job = await self.db.read(q.chat_job_to_judge, key_hash, sub.id)
        if job is None:
            return None
        model, stored = job
        req = ChatRequest.from_json(stored)
        assert sub.reply is not None
        heavy = heavy_to_judge(sub.reply)
        return await run_pure(heavy, judge_chat_reply, sub.id, model, req, sub)

    async def _parse_chat_submit(self, api_key: str, body: dict[str, Any]) -> ChatSubmit:
        """The parsed chat submit; a malformed reply is recorded on its job
        (for the message of a reply_refused fault) and then refused."""
        try:
            return parse_chat_submit(body)
        except HordeError as refusal:
            job_id = parse_uuid(body.get("id"))
            if refusal.rc is RC.ChatSubmitInvalid and job_id is not None:
                await self.db.write(q.record_refusal, hash_key(api_key), job_id, refusal)
            raise

    async def sweep(self, *, wait: bool = False) -> q.SweepResult:
        """One pass of the timers: expired leases, expired requests, purge.

        Of several processes on one PostgreSQL database one sweeps at a
        time: while another sweeps this one is skipped (``skipped`` is set),
        or with ``wait`` waits its turn.
        """
        now = self.clock.now()
        extended = await self.signals.lease_ends()
        result = await self.db.write(q.sweep, now, self.rules, extended, wait=wait)
        if result.expired_jobs:
            self.metrics.faults.labels("lease_expired").inc(result.expired_jobs)
        for job_id in result.expired_job_ids:
            await self.signals.end_lease(job_id, now)
        if result.requeued:
            await self._queue_changed()
        for request_id in result.ended_requests:
            await self.signals.notify_request(request_id)
        for request_id in result.changed_requests:
            await self.signals.touch_request(request_id)
        if result.purged_ids and self.blobs is not None:
            await self.blobs.delete_prefixed(result.purged_ids)  # their images
        await self.signals.sweep_progress(now, result.ended_requests)
        return result

    # Users and workers -------------------------------------------------

    async def find_user(self, api_key: str) -> UserAnswer:
        """The key's user; an unknown key is 404 UserNotFound here, as on the AI Horde."""
        try:
            user = await self.db.read(q.user_by_key, hash_key(api_key), self.rules)
        except HordeError as exc:
            if exc.rc is RC.InvalidAPIKey:
                raise HordeError(RC.UserNotFound, "No user matches this API key.") from None
            raise
        return self._user_answer(user)

    async def user(self, user_id: str) -> UserAnswer:
        # isascii: str.isdigit() also accepts "²", which int() refuses.
        if not (user_id.isascii() and user_id.isdigit()) or len(user_id) > MAX_USER_ID_DIGITS:
            raise HordeError(RC.UserNotFound, f"No user with id {user_id[:64]!r}.")
        return self._user_answer(await self.db.read(q.user_by_id, int(user_id)))

    def _user_answer(self, user: q.UserRecord) -> UserAnswer:
        concurrency = user.concurrency
        if concurrency is None:
            h = self.config.horde
            concurrency = h.anonymous_concurrency if user.anonymous else h.concurrency
        return UserAnswer(
            id=user.id,
            username=user.username,
            kudos=round(user.kudos, 2),
            kudos_earned=round(user.kudos_earned, 2),
            concurrency=concurrency,
            worker_ids=user.worker_ids,
            trusted=user.trusted,
            moderator=user.admin,
        )

    async def worker(self, worker_id: str) -> WorkerAnswer:
        canonical = parse_uuid(worker_id)
        found = None if canonical is None else await self.db.read(q.worker_details, canonical)
        if found is None:
            raise HordeError(RC.WorkerNotFound, f"No worker with id {worker_id[:64]!r}.")
        return self._worker_answer(found, self.clock.now())

    async def worker_by_name(self, name: str) -> WorkerAnswer:
        """The worker whose name has the same key (``worker_name_key``): any
        case or look-alike spelling of its name finds it."""
        try:
            key = worker_name_key(name)
        except HordeError:
            key = None  # no worker can be named so (a control character, say)
        found = None if key is None else await self.db.read(q.worker_details, None, key)
        if found is None:
            raise HordeError(RC.WorkerNotFound, f"No worker named {name[:64]!r}.")
        return self._worker_answer(found, self.clock.now())

    async def workers(self) -> list[WorkerAnswer]:
        now = self.clock.now()
        found = await self.db.read(q.list_workers, now)
        return [self._worker_answer(w, now) for w in found]

    async def update_worker(self, api_key: str, worker_id: str, body: Any) -> WorkerUpdate:
        canonical = parse_uuid(worker_id)
        if canonical is None:
            raise HordeError(RC.WorkerNotFound, f"No worker with id {worker_id[:64]!r}.")
        if not isinstance(body, dict):
            raise HordeError(
                RC.BadRequest,
                "body: expected a JSON object",
                errors={"body": "expected a JSON object"},
            )
        maintenance = body.get("maintenance")
        if maintenance is not None and not isinstance(maintenance, bool):
            raise HordeError(
                RC.BadRequest,
                "maintenance: expected true or false",
                errors={"maintenance": "expected true or false"},
            )
        # hordelite extension: a worker that stops says so (``online: false``)
        # and leaves the pool at once; only its next pop brings it back.
        online = body.get("online")
        if online is not None and online is not False:
            raise bad_request("online", "only false is accepted: a pop brings a worker online")
        changes = await self.db.write(
            q.update_worker,
            hash_key(api_key),
            canonical,
            maintenance,
            self.rules,
            None if online is None else self.clock.now(),
        )
        await self.signals.notify_pool()  # in or out of maintenance, or gone
        return WorkerUpdate(changes.maintenance, changes.aborts_in_window, changes.online)

    @staticmethod
    def _worker_answer(w: q.WorkerRecord, now: float) -> WorkerAnswer:
        return WorkerAnswer(
            id=w.id,
            name=w.name,
            owner=w.owner,
            online=is_online(w.online_until, now),
            trusted=w.trusted,
            maintenance=w.maintenance,
            nsfw=w.nsfw,
            threads=w.threads,
            models=w.models,
            max_length=w.max_length,
            max_context_length=w.max_context_length,
            bridge_agent=w.bridge_agent,
            uptime=w.uptime,
            requests_fulfilled=w.requests_fulfilled,
            uncompleted_jobs=w.uncompleted_jobs,
            kudos_rewards=round(w.kudos_rewards, 2),
            speed=w.tokens_generated / w.seconds_generating if w.seconds_generating else 0.0,
            prompt_jobs=w.prompt_jobs,
            nonconformant_replies=w.nonconformant_replies,
            chat=w.chat,
        )

    async def model_stats(self, with_chat: bool = False) -> list[ModelStats]:
        """The models of online workers with their queues (cached for MODEL_STATS_TTL).

        ``with_chat`` adds each model's ``chat`` summary: its online chat
        workers, their largest limits and the sorted union of their features.
        """
        now = self.clock.now()
        if self._model_stats is None or now - self._model_stats[0] >= MODEL_STATS_TTL:
            self._model_stats = (now, await self._compute_model_stats(now))
        plain, with_summary = self._model_stats[1]
        return list(with_summary if with_chat else plain)

    async def _compute_model_stats(
        self, now: float
    ) -> tuple[tuple[ModelStats, ...], tuple[ModelStats, ...]]:
        """The entries without and with their chat summaries."""
        online = await self._pool.get(now)  # the pool snapshot: no read of its own
        queued = await self.db.read(q.model_queue_stats)
        threads: dict[str, int] = {}
        speed: dict[str, float] = {}
        for w in online:
            if w.maintenance:
                continue
            for model in w.models:
                threads[model] = threads.get(model, 0) + w.threads
                speed[model] = speed.get(model, 0.0) + w.speed * w.threads
        plain = []
        for model in sorted(threads):
            jobs, tokens = queued.get(model, (0, 0))
            plain.append(
                ModelStats(
                    name=model,
                    count=threads[model],
                    performance=round(speed[model] / threads[model], 1),
                    queued=tokens,
                    jobs=jobs,
                    eta=math.ceil(tokens / speed[model]) if speed[model] else 0,
                )
            )
        summary = chat.chat_summary(online)
        with_summary = tuple(
            dataclasses.replace(e, chat=summary[e.name]) if e.name in summary else e for e in plain
        )
        return tuple(plain), with_summary

    def heartbeat(self) -> dict[str, Any]:
        return {"message": "OK", "version": __version__}
