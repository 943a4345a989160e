"""Signals through Redis: several processes or machines act as one horde.

What crosses processes goes through Redis; what waits stays in the process
that waits. Each process holds one pub/sub connection (``listen``) and wakes
its own waiters from what it hears, through the in-process backend's local
wake-ups; so the number of Redis connections does not grow with open waits.

Keys and channels (``horde:`` on the database the URL names; the seed puts
the retained stream on logical database 7, so ``redis://host:6379/7``):

- ``horde:queue`` (channel): a job became available; the message is the
  request's eligibility view as JSON, or empty for any. Each process wakes
  one of its waiting pops that can take it; the process that published it
  has done so already, without waiting for Redis, and skips its echo.
- ``horde:chat:<request id>`` (channel): the request changed (``touch``),
  ended or got a generation (``end``), each followed by the process that
  made the change, or got a progress entry (``progress``). No text travels
  in these messages.
- ``horde:pool`` (channel): a worker joined, left or declared anew; or
  (``versions``) a process could not announce a change while Redis was
  down, so every process forgets the request versions it holds.
- ``horde:lease:<job id>``, ``horde:cancel:<job id>``, ``horde:ended:<job
  id>``, ``horde:request_leases:<request id>``, ``horde:lease_ends``: the
  progress leases written at pop, so that a post on any process is
  authenticated and paced without reading the database. The cancel flag is
  a key of its own, so a post writing its lease back cannot undo a cancel
  made meanwhile on another process.
- ``horde:chat:stream:<request id>``: the retained progress stream, a list
  of JSON entries with a time to live.

A request's version (decision 0038: a status is cached under it) is kept
by each process, from the changes it makes and the ones it hears
(decision 0064): a status read sends nothing to Redis. While signals may
be lost (degraded) every read is a version never seen before, so nothing
cached answers; when they are back, every version held is forgotten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import math
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import anyio
import anyio.abc

from hordelite.contract.eligibility import RequestView, WorkerView
from hordelite.contract.limits import (
    DEGRADED_POLL_SECONDS,
    ENDED_MARKER_SECONDS,
    REDIS_PROBE_TIMEOUT_SECONDS,
    REDIS_TIMEOUT_SECONDS,
    STREAM_RETENTION_SECONDS,
)
from hordelite.contract.progress import Lease
from hordelite.signals._local import LocalSignals, ProgressEntry, QueueWaiter
from hordelite.signals._resp import Commands, RedisReplyError

log = logging.getLogger("hordelite.signals")
T = TypeVar("T")
# What Redis being down or unreachable raises (a command past its timeout
# included); any other error is a bug and propagates.
_DOWN = (
    TimeoutError,
    OSError,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
)


def _reason(exc: BaseException) -> str:
    """The first leaf of ``exc``: what a log line should say."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError) and not str(exc):
        # anyio's fail_after raises a TimeoutError with no message.
        return f"TimeoutError: no answer within {REDIS_TIMEOUT_SECONDS:g} s"
    return f"{type(exc).__name__}: {exc}"


def _is_down(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis is unreachable (a group of such errors
    included)."""
    if isinstance(exc, BaseExceptionGroup):
        # subgroup() recurses into a group the condition does not match: what
        # is left are the leaves that are not down errors.
        other = exc.subgroup(lambda e: not isinstance(e, (BaseExceptionGroup, *_DOWN)))
        return other is None
    return isinstance(exc, _DOWN)


QUEUE = "horde:queue"
POOL = "horde:pool"
REQUEST_PREFIX = "horde:chat:"
STREAM_PREFIX = "horde:chat:stream:"
# A stream outlives its last lease by the retention; before that, by as long
# as a job can be leased (a progress post extends a lease up to its cap).
STREAM_TTL_SECONDS = 24 * 3600

# On horde:pool: every process forgets the request versions it holds.
FORGET_VERSIONS = "versions"


async def _nothing() -> None:
    """No command (``_safely`` sends what it owes first)."""


def _request_channel(request_id: str) -> str:
    return f"{REQUEST_PREFIX}{request_id}"


def _lease_ttl(lease: Lease, now: float) -> int:
    """Seconds a lease's keys live: past its longest possible end."""
    return max(math.ceil(lease.max_expires - now) + 60, 60)


class RedisSignals:
    """The Signals interface on Redis; see the module's docstring."""

    def __init__(self, commands: Commands) -> None:
        self._commands = commands  # every command and the pub/sub (hordelite.signals._resp)
        self._local = LocalSignals()
        # The circuit: open (True) from the first command that found Redis
        # down until the probe's ping or the listener's subscription sees it
        # back; while open, commands return their fallbacks at once.
        self._down = False
        self._opened = anyio.Event()  # set while the circuit is open (the probe waits on it)
        self._watchers: list[Callable[[bool], None]] = []
        self._listening = False  # the pub/sub connection is subscribed
        self._reported = False  # an outage was logged (the start is not one)
        # Versions answered while Redis is down: negative and never repeated,
        # so no cached status matches one (every read goes to the database).
        self._unknown_versions = itertools.count(-1, -1)
        # Names this process's changes on their channel: heard back, they
        # are not applied twice (each would cost a cached status).
        self._origin = secrets.token_hex(8)
        # A change went unannounced (Redis down): the others are told to
        # forget their versions once a command gets through again.
        self._unannounced = False
        # Queue signals this process published and woke its own pop for at
        # once, by their message: their echo on the channel wakes no second
        # one. Forgotten at each subscription (an echo may have been lost
        # with the connection).
        self._own_queue: Counter[str] = Counter()

    # Health: a lost signal only delays an answer ------------------------

    @property
    def degraded(self) -> bool:
        """Signals may be lost: a command failed, or this process is not
        subscribed (it would not hear the others)."""
        return self._down or not self._listening

    def _health(
        self,
        *,
        down: bool | None = None,
        listening: bool | None = None,
        cause: BaseException | None = None,
    ) -> None:
        """Record what was seen; log and wake every waiter when the state
        flips, once per outage and once per recovery."""
        before = self.degraded
        if down is not None and down != self._down:
            self._down = down
            if down:
                self._opened.set()
            else:
                self._opened = anyio.Event()
        if listening is not None:
            self._listening = listening
        if self.degraded == before:
            return
        if before:
            # Back: what was published meanwhile may not have been heard here.
            self._local.forget_versions()
        for watcher in self._watchers:
            watcher(self.degraded)
        if self.degraded:
            self._reported = True
            log.warning(
                "Redis signals unavailable (%s): waiting pops and calls poll every %g s, "
                "progress posts answer 503 until Redis is back",
                _reason(cause) if cause is not None else "not subscribed",
                DEGRADED_POLL_SECONDS,
            )
        elif self._reported:
            self._reported = False
            log.warning("Redis signals are back")
        # Waiters asleep on signals that may not come (or that were lost)
        # look again; while degraded they poll.
        self._local.notify_all_requests()

    def _failed(self, exc: BaseException) -> None:
        self._health(down=True, cause=exc)

    def _succeeded(self) -> None:
        self._health(down=False)

    def watch(self, watcher: Callable[[bool], None]) -> None:
        """Call ``watcher(degraded)`` now and whenever ``degraded`` flips
        (the metrics' gauge)."""
        self._watchers.append(watcher)
        watcher(self.degraded)

    async def _safely(self, operation: Callable[[], Awaitable[T]], fallback: T) -> T:
        """``operation``'s result; ``fallback`` while Redis is down: at once
        while the circuit is open (a hung Redis would cost every call
        REDIS_TIMEOUT_SECONDS), else when the operation fails or times out,
        which opens it."""
        if self._down:
            return fallback
        try:
            with anyio.fail_after(REDIS_TIMEOUT_SECONDS):
                if self._unannounced:
                    await self._commands.call("PUBLISH", POOL, FORGET_VERSIONS)
                    self._unannounced = False
                result = await operation()
        except Exception as exc:
            if not _is_down(exc):
                raise
            self._failed(exc)
            return fallback
        self._succeeded()
        return result

    # The probe -------------------------------------------------------------

    async def probe(self) -> None:
        """While the circuit is open, ping Redis every DEGRADED_POLL_SECONDS
        and close it when a ping answers; runs until cancelled.

        The listener alone cannot close it: a Redis that hangs (SIGSTOP, a
        partition) keeps the pub/sub connection open and silent, so the
        listener never fails and never resubscribes; and with the circuit
        open no command runs to find Redis back."""
        while True:
            await self._opened.wait()
            while self._down:
                await anyio.sleep(DEGRADED_POLL_SECONDS)
                if await self._answers():
                    self._health(down=False)
                    if self._unannounced:  # no other command may come soon
                        await self._safely(_nothing, None)

    async def _answers(self) -> bool:
        """Whether Redis answers a ping within REDIS_PROBE_TIMEOUT_SECONDS."""
        try:
            with anyio.fail_after(REDIS_PROBE_TIMEOUT_SECONDS):
                await self._commands.call("PING")
        except Exception as exc:  # cancellation is no Exception: it propagates
            if not _is_down(exc):
                raise
            return False
        return True

    # Listening -----------------------------------------------------------

    async def listen(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Hear every process's signals on one pub/sub connection and wake
        this process's waiters; runs until cancelled, reconnecting (with a
        growing pause) while Redis is down."""
        started = False
        pause = 0.1

        def subscribed() -> None:
            nonlocal started, pause
            if not started:
                started = True
                task_status.started()
            pause = 0.1
            self._own_queue.clear()
            self._health(down=False, listening=True)

        while True:
            try:
                await self._commands.listen(
                    [QUEUE, POOL], [f"{REQUEST_PREFIX}*"], subscribed, self._hear
                )
            except Exception as exc:
                if not _is_down(exc):
                    raise
                self._health(down=True, listening=False, cause=exc)
                if not started and not self._reported:
                    self._reported = True  # degraded from the start: say so once
                    log.warning(
                        "Redis signals unavailable at start (%s): serving degraded until it answers",
                        _reason(exc),
                    )
                if not started:
                    started = True  # serve degraded rather than not at all
                    task_status.started()
            await anyio.sleep(pause)
            pause = min(pause * 2, 5.0)

    def _hear(self, channel: str, data: str) -> None:
        """Dispatch one message; one that cannot be read (not ours, or from
        another version) is logged and dropped, never fatal to the listener."""
        try:
            self._dispatch(channel, data)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("dropped an unreadable signal on %s: %s", channel, exc)

    def _dispatch(self, channel: str, data: str) -> None:
        local = self._local
        if channel == QUEUE:
            if self._take_own(data):
                return  # woken here when it was published
            local.wake_pops(RequestView.of(json.loads(data)) if data else None)
        elif channel == POOL:
            local.pool_changed_locally()
            if data == FORGET_VERSIONS:
                local.forget_versions()
        elif channel.startswith(REQUEST_PREFIX):
            request_id = channel[len(REQUEST_PREFIX) :]
            what, _, origin = data.partition(" ")
            if origin == self._origin:
                return  # this process's own change, applied when it was made
            self._apply(request_id, what)

    def _apply(self, request_id: str, what: str) -> None:
        """A change to a request, made here or heard: its waiters woken,
        its version moved."""
        local = self._local
        if what == "end":
            local.wake_request(request_id)
            local.wake_stream(request_id)
        elif what == "touch":
            local.touch_locally(request_id)
        elif what == "progress":
            local.wake_stream(request_id)

    # Queue and requests ----------------------------------------------------

    def queue_waiter(self, worker: WorkerView | None) -> AbstractContextManager[QueueWaiter]:
        return self._local.queue_waiter(worker)

    async def notify_queue(self, request: RequestView | None = None) -> None:
        """Wake this process's pop for the job at once (no wait for Redis's
        echo), then announce it to the others."""
        data = "" if request is None else json.dumps(dataclasses.asdict(request))
        self._local.wake_pops(request)
        echoed = self._listening  # subscribed: the message comes back here
        if echoed:
            self._own_queue[data] += 1
        sent = None
        try:
            sent = await self._safely(lambda: self._commands.call("PUBLISH", QUEUE, data), None)
        finally:
            # Not published, or cancelled before the reply: no echo to skip
            # (if one comes after all, it wakes a second pop, which finds
            # nothing; a count left over would skip another process's signal).
            if sent is None and echoed:
                self._take_own(data)

    def _take_own(self, data: str) -> bool:
        """Whether a queue message is the echo of one this process published
        (counted off, so that the next one like it is not)."""
        left = self._own_queue.get(data, 0)
        if left == 0:
            return False
        if left == 1:
            del self._own_queue[data]
        else:
            self._own_queue[data] = left - 1
        return True

    def request_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        return self._local.request_waiter(request_id)

    async def notify_request(self, request_id: str) -> None:
        await self._changed(request_id, "end")

    async def touch_request(self, request_id: str) -> None:
        await self._changed(request_id, "touch")

    async def _changed(self, request_id: str, what: str) -> None:
        """Apply a committed change here at once (this process's waiters and
        version), then announce it to the others."""
        self._apply(request_id, what)
        announced = await self._safely(
            lambda: self._commands.call(
                "PUBLISH", _request_channel(request_id), f"{what} {self._origin}"
            ),
            None,
        )
        if announced is None:
            self._unannounced = True

    async def request_version(self, request_id: str) -> int:
        if self.degraded:
            return next(self._unknown_versions)
        return await self._local.request_version(request_id)

    def status_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        return self._local.status_waiter(request_id)

    async def notify_pool(self) -> None:
        self._local.pool_changed_locally()  # seen here at once; by the others on the channel
        await self._safely(lambda: self._commands.call("PUBLISH", POOL, ""), 0)

    def pool_version(self) -> int:
        return self._local.pool_version()

    def notify_all_requests(self) -> None:
        self._local.notify_all_requests()

    # Leases --------------------------------------------------------------

    async def _put_lease(self, lease: Lease) -> None:
        ttl = _lease_ttl(lease, lease.popped)
        leases = f"horde:request_leases:{lease.request_id}"
        await self._all(  # one round trip
            ["SET", f"horde:lease:{lease.job_id}", _lease_json(lease), "EX", ttl],
            ["SADD", leases, lease.job_id],
            ["EXPIRE", leases, ttl],
            ["ZADD", "horde:lease_ends", lease.expires, lease.job_id],
            # A new attempt of a request that is still waiting: its stream lives on.
            ["EXPIRE", f"{STREAM_PREFIX}{lease.request_id}", STREAM_TTL_SECONDS],
        )

    async def _save_lease(self, lease: Lease) -> None:
        ttl = _lease_ttl(lease, lease.popped)
        key = f"horde:lease:{lease.job_id}"
        # XX: a lease ended meanwhile (a submit on another process) stays ended.
        commands: list[list[Any]] = [
            ["SET", key, _lease_json(lease), "XX", "EX", ttl],
            ["ZADD", "horde:lease_ends", "XX", lease.expires, lease.job_id],
        ]
        if lease.cancelled:
            commands.append(["SET", f"horde:cancel:{lease.job_id}", "1", "EX", ttl])
        await self._all(*commands)

    async def _all(self, *commands: list[Any]) -> list[Any]:
        """Several commands in one round trip; their replies (raises the first error reply)."""
        replies = await self._commands.pipeline(commands)
        for reply in replies:
            if isinstance(reply, RedisReplyError):
                raise reply
        return replies

    async def _lease(self, job_id: str) -> Lease | None:
        stored, cancelled = await self._commands.call(
            "MGET", f"horde:lease:{job_id}", f"horde:cancel:{job_id}"
        )
        if stored is None:
            return None
        fields: dict[str, Any] = json.loads(stored)
        fields["last"] = tuple(fields["last"])
        return Lease(**fields, cancelled=cancelled is not None)

    async def _ended(self, job_id: str) -> bool:
        return bool(await self._commands.call("EXISTS", f"horde:ended:{job_id}"))

    async def _end_lease(self, job_id: str, now: float) -> Lease | None:
        lease = await self._lease(job_id)
        if lease is None:
            await self._commands.call("ZREM", "horde:lease_ends", job_id)  # its keys expired
            return None
        jobs_key = f"horde:request_leases:{lease.request_id}"
        *_, left = await self._all(
            ["DEL", f"horde:lease:{job_id}", f"horde:cancel:{job_id}"],
            ["SET", f"horde:ended:{job_id}", "1", "EX", int(ENDED_MARKER_SECONDS)],
            ["ZREM", "horde:lease_ends", job_id],
            ["SREM", jobs_key, job_id],
            ["SCARD", jobs_key],
        )
        if not left:
            await self._end_stream(lease.request_id, now)
        return lease

    async def _request_leases(self, request_id: str) -> list[Lease]:
        job_ids = await self._commands.call("SMEMBERS", f"horde:request_leases:{request_id}")
        leases = [await self._lease(job_id) for job_id in sorted(job_ids)]
        return [lease for lease in leases if lease is not None]

    async def _lease_ends(self) -> dict[str, float]:
        flat = await self._commands.call(
            "ZRANGE", "horde:lease_ends", "-inf", "+inf", "BYSCORE", "WITHSCORES"
        )
        return {str(flat[i]): float(flat[i + 1]) for i in range(0, len(flat), 2)}

    # Progress streams ----------------------------------------------------

    async def _append_progress(self, request_id: str, entry: ProgressEntry) -> None:
        key = f"{STREAM_PREFIX}{request_id}"
        await self._all(  # one round trip
            ["RPUSH", key, json.dumps(entry)],
            ["EXPIRE", key, STREAM_TTL_SECONDS],
            ["PUBLISH", _request_channel(request_id), "progress"],
        )

    async def _read_progress(self, request_id: str, position: int) -> list[ProgressEntry]:
        entries = await self._commands.call("LRANGE", f"{STREAM_PREFIX}{request_id}", position, -1)
        return [ProgressEntry(json.loads(e)) for e in entries]

    def progress_waiter(self, request_id: str) -> AbstractContextManager[anyio.Event]:
        return self._local.progress_waiter(request_id)

    async def _end_stream(self, request_id: str, now: float) -> None:
        # Kept a while for a reader a little behind, as in-process.
        key = f"{STREAM_PREFIX}{request_id}"
        await self._commands.call("EXPIRE", key, int(STREAM_RETENTION_SECONDS), "LT")

    async def _sweep_progress(self, now: float, ended_requests: list[str]) -> None:
        """End the streams of ended requests and the leases past their end;
        Redis forgets the rest by their times to live."""
        for request_id in ended_requests:
            await self._end_stream(request_id, now)
        expired = await self._commands.call("ZRANGE", "horde:lease_ends", "-inf", now, "BYSCORE")
        for job_id in expired:
            await self._end_lease(str(job_id), now)

    # The operations below while Redis is down: a post finds no lease (the
    # service answers 503 ChatProgressUnavailable), a stream reads nothing
    # more (the call gets the whole reply at the submit), the rest is lost
    # and the database stays the truth.

    async def put_lease(self, lease: Lease) -> None:
        await self._safely(lambda: self._put_lease(lease), None)

    async def save_lease(self, lease: Lease) -> None:
        await self._safely(lambda: self._save_lease(lease), None)

    async def lease(self, job_id: str) -> Lease | None:
        return await self._safely(lambda: self._lease(job_id), None)

    async def ended(self, job_id: str) -> bool:
        return await self._safely(lambda: self._ended(job_id), False)

    async def end_lease(self, job_id: str, now: float) -> Lease | None:
        return await self._safely(lambda: self._end_lease(job_id, now), None)

    async def request_leases(self, request_id: str) -> list[Lease]:
        return await self._safely(lambda: self._request_leases(request_id), [])

    async def lease_ends(self) -> dict[str, float]:
        return await self._safely(self._lease_ends, {})

    async def append_progress(self, request_id: str, entry: ProgressEntry) -> None:
        await self._safely(lambda: self._append_progress(request_id, entry), None)

    async def read_progress(self, request_id: str, position: int) -> list[ProgressEntry]:
        return await self._safely(lambda: self._read_progress(request_id, position), [])

    async def end_stream(self, request_id: str, now: float) -> None:
        await self._safely(lambda: self._end_stream(request_id, now), None)

    async def sweep_progress(self, now: float, ended_requests: list[str]) -> None:
        await self._safely(lambda: self._sweep_progress(now, ended_requests), None)

    async def ping(self) -> None:
        """One round trip to Redis (the metrics scrape times it); raises when
        Redis does not answer, and at once while the circuit is open (the
        probe is pinging already: a scrape need not wait on a hung Redis)."""
        if self._down:
            raise ConnectionError("Redis signals are degraded (circuit open)")
        await self._commands.call("PING")

    def statistics(self) -> dict[str, int]:
        """This process's waiters (what Redis holds is bounded by its TTLs)."""
        return self._local.statistics()


def _lease_json(lease: Lease) -> str:
    fields = dataclasses.asdict(lease)
    del fields["cancelled"]  # a key of its own (see the module's docstring)
    return json.dumps(fields)


@contextlib.asynccontextmanager
async def open_redis_signals(url: str) -> AsyncIterator[RedisSignals]:
    """Redis signals for the block, listening and probing in tasks the
    block owns."""
    commands = Commands(url, REDIS_TIMEOUT_SECONDS)
    signals = RedisSignals(commands)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(signals.listen)
            tg.start_soon(signals.probe)
            try:
                yield signals
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await commands.aclose()
