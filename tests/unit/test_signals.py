"""The in-process signals hold nothing for a request once it is over: its
progress stream goes a bounded time after its last lease ends, and a waiter
that leaves without being woken takes its event with it."""

from __future__ import annotations

import os

import pytest

from hordelite.contract.limits import REQUEST_VERSIONS, STREAM_RETENTION_SECONDS
from hordelite.contract.progress import Lease
from hordelite.signals import LocalSignals, ProgressEntry, open_signals

pytestmark = pytest.mark.anyio
NOW = 1_000.0


def lease(job_id: str, request_id: str = "r1", gen: int = 0) -> Lease:
    return Lease.at_pop(
        job_id=job_id,
        request_id=request_id,
        key_hash="k",
        worker_id="w",
        worker_name="w1",
        model="m",
        gen=gen,
        now=NOW,
        ttl=150,
        trusted=False,
        max_length=64,
    )


def entry(content: str, gen: int = 0) -> ProgressEntry:
    return ProgressEntry(
        gen=gen, seq=1, content=content, reasoning_content="", worker="w1", model="m"
    )


async def test_a_stream_goes_after_the_retention_once_its_last_lease_ended() -> None:
    signals = LocalSignals()
    await signals.put_lease(lease("j1"))
    await signals.append_progress("r1", entry("Blue"))
    await signals.end_lease("j1", NOW + 10)
    await signals.sweep_progress(NOW + 10 + STREAM_RETENTION_SECONDS, [])
    assert await signals.read_progress("r1", 0) == [entry("Blue")]  # kept for late readers
    await signals.sweep_progress(NOW + 11 + STREAM_RETENTION_SECONDS, [])
    assert await signals.read_progress("r1", 0) == []
    stats = signals.statistics()
    assert (stats["streams"], stats["ending_streams"], stats["leased_requests"]) == (0, 0, 0)


async def test_a_request_popped_again_after_a_fault_keeps_its_stream() -> None:
    signals = LocalSignals()
    await signals.put_lease(lease("j1"))
    await signals.append_progress("r1", entry("Blue"))
    await signals.end_lease("j1", NOW)  # the first attempt faulted; the request waits
    await signals.put_lease(lease("j2", gen=1))  # another worker took it
    await signals.append_progress("r1", entry("Red", gen=1))
    await signals.sweep_progress(NOW + 2 * STREAM_RETENTION_SECONDS, [])
    assert [e["content"] for e in await signals.read_progress("r1", 0)] == ["Blue", "Red"]


async def test_a_cancelled_request_s_stream_goes_after_the_retention_though_its_lease_lives() -> (
    None
):
    signals = LocalSignals()
    await signals.put_lease(lease("j1"))
    await signals.append_progress("r1", entry("Blue"))
    await signals.end_stream("r1", NOW)  # the cancel: the lease stays until its end
    await signals.sweep_progress(NOW + STREAM_RETENTION_SECONDS + 1, [])
    assert await signals.read_progress("r1", 0) == []
    assert await signals.lease("j1") is not None


async def test_waiters_that_leave_unwoken_leave_no_event_and_share_one_while_they_wait() -> None:
    signals = LocalSignals()
    with signals.request_waiter("r1") as first, signals.request_waiter("r1") as second:
        assert first is second
        with signals.progress_waiter("r1") as posted:
            assert signals.statistics()["stream_waiters"] == 1
        assert signals.statistics()["stream_waiters"] == 0
        assert not posted.is_set()
    assert signals.statistics()["request_waiters"] == 0
    with signals.request_waiter("r1") as woken:
        await signals.notify_request("r1")
        assert woken.is_set()
        # Woken: the next waiter gets a new event.
        with signals.request_waiter("r1") as later:
            assert not later.is_set()
    assert signals.statistics()["request_waiters"] == 0


# Request versions (the status cache's key) ----------------------------------


async def test_a_version_read_before_a_change_never_matches_one_read_after_it() -> None:
    signals = LocalSignals()
    before_any = await signals.request_version("a")
    await signals.touch_request("a")
    after_first = await signals.request_version("a")
    assert after_first != before_any
    assert await signals.request_version("a") == after_first  # unchanged: the same
    # So many other requests change that "a"'s version is dropped: what "a"
    # reads then still differs from what it read before its change.
    for i in range(REQUEST_VERSIONS + 1):
        await signals.touch_request(f"other-{i}")
    assert await signals.request_version("a") != before_any
    await signals.touch_request("a")
    assert await signals.request_version("a") not in (before_any, after_first)


async def test_notify_request_also_bumps_the_version() -> None:
    signals = LocalSignals()
    before = await signals.request_version("a")
    await signals.notify_request("a")
    assert await signals.request_version("a") != before


async def test_an_unreadable_redis_signal_is_dropped_not_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from hordelite.signals._redis import QUEUE, RedisSignals
    from hordelite.signals._resp import Commands

    signals = RedisSignals(Commands("redis://127.0.0.1:1/0", 2))
    signals._hear(QUEUE, "{not json")
    signals._hear(QUEUE, '{"models": []}')  # JSON, but not a request view
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert all(m.startswith(f"dropped an unreadable signal on {QUEUE}: ") for m in messages)


async def test_redis_versions_move_with_each_change_and_are_never_repeated_while_redis_is_down() -> (
    None
):
    import uuid

    from hordelite.signals._redis import RedisSignals
    from hordelite.signals._resp import Commands

    url = os.environ.get("HORDELITE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    request_id = str(uuid.uuid4())
    async with open_signals(url) as signals:
        before_any = await signals.request_version(request_id)
        await signals.touch_request(request_id)
        touched = await signals.request_version(request_id)
        assert touched != before_any
        assert await signals.request_version(request_id) == touched  # unchanged: the same
        await signals.notify_request(request_id)
        assert await signals.request_version(request_id) not in (before_any, touched)
        assert not signals.degraded

    # Redis down: every read is a version no cached status was stored under.
    down = RedisSignals(Commands("redis://127.0.0.1:1/0", 2))
    unknown = [await down.request_version(request_id) for _ in range(3)]
    assert all(v < 0 for v in unknown), unknown
    assert len(set(unknown)) == 3, unknown
    assert down.degraded


async def test_a_status_read_on_redis_signals_sends_nothing_to_redis() -> None:
    """A request's version is kept by each process (decision 0064): reading
    it is no round trip, however many statuses are read."""
    from tests.integration._helpers import RedisServer

    redis = RedisServer()
    redis.start()
    try:
        async with open_signals(redis.url) as signals:
            await signals.touch_request("r1")
            before = _commands_processed(redis.url)
            versions = {await signals.request_version("r1") for _ in range(100)}
            after = _commands_processed(redis.url)
    finally:
        redis.kill()
    assert len(versions) == 1
    assert after - before == 1  # the INFO that read the count


def _commands_processed(url: str) -> int:
    """Redis's count of the commands it processed."""
    from tests.integration._helpers import redis_info

    return int(redis_info(url, "stats")["total_commands_processed"])


async def test_a_change_moves_its_version_here_at_once_there_when_heard_and_once_only() -> None:
    """Two processes on one Redis: a change moves the version of the process
    that made it at once, the other's when it hears the change; hearing its
    own change back does not move the first one's again (a cached status
    would be read again for nothing)."""
    import uuid

    from tests.integration._helpers import eventually

    url = os.environ.get("HORDELITE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    request_id = str(uuid.uuid4())
    async with open_signals(url) as here, open_signals(url) as there:
        here_before = await here.request_version(request_id)
        there_before = await there.request_version(request_id)
        await here.touch_request(request_id)
        here_after = await here.request_version(request_id)
        assert here_after != here_before

        async def heard_there() -> bool:
            return await there.request_version(request_id) != there_before

        await eventually(heard_there, within=5)
        # A message of the same connection after the change: once it is
        # heard here, the change's own echo has been heard here before it.
        pool = here.pool_version()
        await there.notify_pool()
        await eventually(lambda: here.pool_version() != pool, within=5)
        assert await here.request_version(request_id) == here_after


async def test_a_change_redis_could_not_announce_makes_every_process_read_again() -> None:
    """A change made while Redis hangs is never heard by the others; once
    Redis answers, the process that made it tells them to forget the
    versions they hold, so no status cached before it is served after."""
    import uuid

    import anyio

    from hordelite.contract.limits import REDIS_TIMEOUT_SECONDS
    from tests.integration._helpers import RedisServer, eventually

    redis = RedisServer()
    redis.start()
    request_id = str(uuid.uuid4())
    try:
        async with open_signals(redis.url) as here, open_signals(redis.url) as there:
            cached_under = await there.request_version(request_id)
            redis.stop()
            with anyio.fail_after(REDIS_TIMEOUT_SECONDS * 2):
                await here.touch_request(request_id)  # committed, not announced
            assert here.degraded
            redis.cont()
            await eventually(lambda: not here.degraded, within=15)

            async def forgotten_there() -> bool:
                return await there.request_version(request_id) != cached_under

            await eventually(forgotten_there, within=5)
    finally:
        redis.kill()


async def test_a_hung_redis_costs_one_call_the_timeout_then_calls_fail_fast_until_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGSTOP: Redis keeps its connections open and answers nothing. The
    first call finds it out (REDIS_TIMEOUT_SECONDS); the next ones return
    their fallbacks at once; once it continues, the probe closes the circuit
    and the commands answer what they should (the timed-out connection is
    not left answering the wrong request)."""
    import logging
    import time
    import uuid

    import anyio

    from hordelite.contract.limits import REDIS_TIMEOUT_SECONDS
    from tests.integration._helpers import RedisServer, eventually

    caplog.set_level(logging.INFO, logger="hordelite.signals")
    redis = RedisServer()
    redis.start()
    request_id = str(uuid.uuid4())
    try:
        async with open_signals(redis.url) as signals:
            await signals.touch_request(request_id)
            before = await signals.request_version(request_id)
            assert before > 0
            assert not signals.degraded
            redis.stop()
            with anyio.fail_after(REDIS_TIMEOUT_SECONDS * 2):
                await signals.touch_request(request_id)  # it finds out
            assert signals.degraded
            assert await signals.request_version(request_id) < 0
            took = []
            for _ in range(50):
                start = time.monotonic()
                await signals.touch_request(request_id)
                assert await signals.request_version(request_id) < 0
                assert await signals.lease("j1") is None
                took.append(time.monotonic() - start)
            print(
                f"calls while hung: median {sorted(took)[25] * 1e3:.3f} ms, max {max(took) * 1e3:.3f} ms"
            )
            assert max(took) < 0.05, took
            ping = getattr(signals, "ping")  # noqa: B009 (RedisSignals only)
            with anyio.fail_after(0.05), pytest.raises(Exception, match="circuit open"):
                await ping()
            redis.cont()
            await eventually(lambda: not signals.degraded, within=15)
            # Every command answers its own request again.
            await signals.touch_request(request_id)
            after = await signals.request_version(request_id)
            assert after > before
            assert await signals.request_version(request_id) == after
            await signals.put_lease(lease("j1", request_id))
            stored = await signals.lease("j1")
            assert stored is not None
            assert stored.request_id == request_id
            assert not await signals.ended("j1")
    finally:
        redis.kill()
    lines = [r.getMessage() for r in caplog.records if r.name == "hordelite.signals"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("Redis signals unavailable (TimeoutError: no answer within 2 s)")
    assert lines[1] == "Redis signals are back"


async def test_a_redis_that_accepts_but_never_answers_degrades_the_start_within_the_timeout() -> (
    None
):
    """A hung Redis at start (the connection opens, nothing answers): the
    subscription is given up after REDIS_TIMEOUT_SECONDS and the process
    serves degraded, rather than never starting."""
    import socket

    import anyio

    from hordelite.contract.limits import REDIS_TIMEOUT_SECONDS

    with socket.socket() as silent:  # accepts into its backlog, never reads
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        with anyio.fail_after(REDIS_TIMEOUT_SECONDS + 5):
            async with open_signals(url) as signals:
                assert signals.degraded


async def test_a_message_that_is_not_utf8_is_dropped_and_the_listener_hears_the_next() -> None:
    """Another client can publish any bytes on a horde channel: the listener
    drops what it cannot read and keeps hearing."""
    import socket
    from urllib.parse import urlsplit

    from hordelite.signals._redis import POOL, QUEUE
    from hordelite.signals._resp import encode
    from tests.integration._helpers import eventually

    url = os.environ.get("HORDELITE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    parts = urlsplit(url)
    async with open_signals(url) as signals:
        pool = signals.pool_version()
        with socket.create_connection((parts.hostname, parts.port or 6379)) as raw:
            # Then a pool change on the same connection: heard after the bytes.
            raw.sendall(encode(["PUBLISH", QUEUE, b"\xff\xfe"]) + encode(["PUBLISH", POOL, ""]))
            replies = b""
            while replies.count(b"\r\n") < 2:
                replies += raw.recv(64)
        await eventually(lambda: signals.pool_version() != pool, within=5)
        assert not signals.degraded


async def test_a_queue_signal_wakes_this_process_s_pop_at_once_and_its_echo_wakes_no_second() -> (
    None
):
    """On Redis signals, the process that queues a job wakes one of its own
    waiting pops before Redis answers; hearing its own message back wakes
    no other (two pops for one job: one pop transaction for nothing)."""
    import dataclasses
    import uuid

    from tests.integration._helpers import eventually
    from tests.unit.test_eligibility import REQUEST as request
    from tests.unit.test_eligibility import WORKER as worker

    url = os.environ.get("HORDELITE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    async with open_signals(url) as here, open_signals(url) as there:
        with (
            here.queue_waiter(worker) as first,
            here.queue_waiter(dataclasses.replace(worker, id=str(uuid.uuid4()))) as second,
            there.queue_waiter(worker) as elsewhere,
        ):
            await here.notify_queue(request)
            assert (first.event.is_set(), second.event.is_set()) == (True, False)
            await eventually(elsewhere.event.is_set, within=5)  # the others hear it
            # A message sent after the echo: once heard here, the echo was too.
            pool = here.pool_version()
            await there.notify_pool()
            await eventually(lambda: here.pool_version() != pool, within=5)
            assert not second.event.is_set()


async def test_a_wake_up_passed_on_by_a_cancelled_pop_still_reaches_this_process_s_pops() -> None:
    """A pop woken for a job it will not take (its worker left) passes the
    wake-up on while being cancelled (Jobs._sleep). On Redis signals the
    publish cannot run then, but this process's other pops are woken
    before it: the job does not wait for their long polls to end."""
    import anyio

    url = os.environ.get("HORDELITE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    async with open_signals(url) as signals:
        with signals.queue_waiter(None) as other:
            with anyio.CancelScope() as leaving:
                leaving.cancel()
                try:
                    await anyio.sleep(1)
                except anyio.get_cancelled_exc_class():
                    await signals.notify_queue()  # as Jobs._sleep does
                    raise
            assert leaving.cancelled_caught
            assert other.event.is_set()
