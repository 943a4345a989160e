"""One horde in one task group: HTTP, timers, storage.

``open_server`` is the async context manager that ``hordelite serve`` and
``hordelite.testing.open_horde`` both use: it migrates the database, starts
Hypercorn and the timers in one task group, yields the running horde, and on
exit drains (without Redis signals, it serves on while OpenAI calls wait for
their workers' submits), stops accepting, gives open requests what is left of
the grace period, stops the timers and closes storage last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Protocol

import anyio
import anyio.to_thread

from hordelite.api import _render
from hordelite.blobs import BlobStore, DirectoryStore, S3Store, blob_directory
from hordelite.clock import Clock
from hordelite.config import Config
from hordelite.contract.limits import READER_RENEW_SECONDS, WEBHOOK_POLL_SECONDS
from hordelite.errors import StorageUnavailable
from hordelite.horde.readers import reader_name
from hordelite.horde.service import Horde
from hordelite.http.loop import current_backend
from hordelite.http.routes import horde_app, metrics_app
from hordelite.http.server import listen, serve_http
from hordelite.signals import Signals, open_signals
from hordelite.storage.database import Database

log = logging.getLogger("hordelite")


@dataclasses.dataclass(frozen=True)
class RunningHorde:
    url: str
    horde: Horde
    # Images taken in at submit, handed to workers by signed URL (/blobs, or
    # the object store's presigned URLs).
    blobs: BlobStore
    # The base URL of the port serving /metrics alone ([metrics] port), or None.
    metrics_url: str | None = None


def blob_location(config: Config) -> str:
    """Where the horde keeps its images and the secret signing their URLs,
    as its start lines say it."""
    if config.blobs.s3_endpoint:
        return f"blobs: bucket {config.blobs.s3_bucket} at {config.blobs.s3_endpoint}"
    return f"blobs and their signing secret: {blob_directory(config).absolute()}"


async def serve_timers(
    horde: Horde,
    stop: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Sweep leases, expiries and retention every ``sweep_interval`` until ``stop``."""
    task_status.started()
    interval = horde.config.horde.sweep_interval
    while not stop.is_set():
        with _one_round("sweep skipped", "sweep failed"):
            result = await horde.sweep()
            if result.expired_jobs or result.ended_requests:
                log.info(
                    "sweep: %d leases expired (%d requeued), %d requests ended",
                    result.expired_jobs,
                    result.requeued,
                    len(result.ended_requests),
                )
        with anyio.move_on_after(interval):
            await stop.wait()


@contextlib.contextmanager
def _one_round(skipped: str, failed: str) -> Iterator[None]:
    """One round of a background loop (a sweep, a round of webhook calls):
    its failure must not take the horde down with it, as requests are still
    served and the next round tries again; storage being down is only
    warned of (``skipped``), anything else logged with its trace (``failed``)."""
    try:
        yield
    except StorageUnavailable as exc:
        log.warning("%s, storage unavailable: %s", skipped, exc)
    except Exception:
        log.exception(failed)


async def serve_readers(
    horde: Horde,
    stop: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Renew this process's reader lease every READER_RENEW_SECONDS until
    ``stop`` (decision 0051): while it does, no other process takes its
    OpenAI calls for gone."""
    task_status.started()
    while True:
        with anyio.move_on_after(READER_RENEW_SECONDS):
            await stop.wait()
        if stop.is_set():
            return
        try:
            await horde.readers.renew()
        except StorageUnavailable as exc:
            log.warning("reader lease not renewed, storage unavailable: %s", exc)


async def serve_webhooks(
    horde: Horde,
    stop: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Make the webhook calls owed (decision 0056) until ``stop``: at once
    when a request ends in this process or a call that held others back
    ends, else every WEBHOOK_POLL_SECONDS (another process's ends, retries),
    so ``stop`` is seen within that. Each call runs on its own in this
    task's ``calling`` block, which waits for the calls started; a call cut
    off by the shutdown stays owed in storage, and is made once its claim
    lapses."""
    async with horde.webhooks.calling():
        task_status.started()
        while not stop.is_set():
            woken = horde.webhooks.arm()
            with _one_round("webhooks not called", "webhook round failed"):
                if await horde.webhooks.call_due(_render.webhook):
                    continue  # more may be due: look again at once
            with anyio.move_on_after(WEBHOOK_POLL_SECONDS):
                await woken.wait()


async def _serve_http_until(
    app: object,
    config: Config,
    shutdown: anyio.Event,
    stopped: anyio.Event,
    sock: socket.socket | None,
    grace_left: Callable[[], float] | None = None,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    try:
        await serve_http(
            app, config.server, shutdown, sock=sock, grace_left=grace_left, task_status=task_status
        )
    finally:
        stopped.set()


class _OpenCalls(Protocol):
    """The front's open calls (front.openai.Admission)."""

    async def none_open(self) -> None: ...


async def _drain_calls(horde: Horde, admission: _OpenCalls) -> None:
    """The first part of a stop, for a horde without Redis signals: the
    server goes on serving (the workers' submits and progress come in on
    new connections, a job taking longer than a kept-alive connection
    stays open) until no OpenAI call is open, or the drain's deadline.

    Meanwhile new work is refused as the stop says: a call waits only while
    a worker has its job, the others are answered 503 ShuttingDown at once,
    pops answer empty, ``/readyz`` says "stopping". With Redis signals the
    port is left at once instead: the other processes take new connections,
    submits included, and the calls' replies reach this one as signals."""
    left = horde.core.drain_deadline - anyio.current_time()
    if horde.core.shared or left <= 0:
        return
    with anyio.move_on_after(left, shield=True):
        await admission.none_open()


async def _serve_metrics(
    horde: Horde,
    config: Config,
    shutdown: anyio.Event,
    stopped: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """``/metrics`` alone on ``[metrics] host:port``. Each of several serving
    processes binds it with SO_REUSEPORT, so a scrape reaches any of them
    (each answers the sum of all, see hordelite.horde.metrics)."""
    server = dataclasses.replace(config.server, host=config.metrics.host, port=config.metrics.port)
    sock = listen(server, shared=config.server.processes > 1)
    app = metrics_app(horde)
    await _serve_http_until(app, config, shutdown, stopped, sock, task_status=task_status)


@contextlib.asynccontextmanager
async def open_server(
    config: Config,
    *,
    clock: Clock | None = None,
    signals: Signals | None = None,
    sock: socket.socket | None = None,
    migrate: bool = True,
    slot: int = 0,
) -> AsyncIterator[RunningHorde]:
    """The horde running until the block exits (see the module).

    ``signals``: the backend to use; by default the one ``[signals] url``
    names, open for the block. ``sock``: serve this listening socket instead
    of binding ``server.host:server.port``. ``migrate=False``: the database
    was brought up to date already (by the parent of several serving
    processes). ``slot``: this process's among those serving the port (the
    host, the port and the slot name its OpenAI calls' reader).
    """
    async with contextlib.AsyncExitStack() as stack:
        if signals is None:
            signals = await stack.enter_async_context(open_signals(config.signals.url))
        async with _open_horde(config, clock, signals, sock, migrate, slot) as running:
            yield running


@contextlib.asynccontextmanager
async def _open_horde(
    config: Config,
    clock: Clock | None,
    signals: Signals,
    sock: socket.socket | None,
    migrate: bool,
    slot: int,
) -> AsyncIterator[RunningHorde]:
    db = Database(
        config.storage.database,
        config.storage.pool_size,
        config.storage.executor,
        prepare=config.storage.prepared_statements,
    )
    s3: S3Store | None = None
    try:
        blobs: BlobStore
        if config.blobs.s3_endpoint:
            blobs = s3 = await S3Store.open(
                config.blobs.s3_endpoint,
                config.blobs.s3_bucket,
                config.blobs.s3_region,
                config.blobs.s3_access_key,
                config.blobs.s3_secret_key,
            )
        else:
            blobs = await DirectoryStore.open(blob_directory(config))
        horde = Horde(config, db, clock=clock, signals=signals, blobs=blobs)
        if migrate:
            await anyio.to_thread.run_sync(horde.migrate)
        if sock is None:
            # Bound before anything is served: its port names the reader.
            sock = listen(config.server)
        # What a predecessor in this place left unread goes before a worker
        # could hand in a reply to it (decision 0051).
        await horde.readers.take_over(reader_name(sock.getsockname()[1], slot))
        # The /blobs route serves the directory store only: an object store
        # serves its presigned URLs itself.
        directory = blobs if isinstance(blobs, DirectoryStore) else None
        served = horde_app(horde, current_backend(), directory)
        app, admission = served.dispatcher, served.admission
        shutdown = anyio.Event()
        stopped = anyio.Event()
        # When everything stops: the grace period from the stop's start,
        # drain included.
        stop_by = [float("inf")]
        error: Exception | None = None
        async with anyio.create_task_group() as tg:
            url = await tg.start(
                _serve_http_until,
                app,
                config,
                shutdown,
                stopped,
                sock,
                lambda: stop_by[0] - anyio.current_time(),
            )
            metrics_url = None
            metrics_stopped = anyio.Event()
            if config.metrics.enabled and config.metrics.port:
                metrics_url = await tg.start(
                    _serve_metrics, horde, config, shutdown, metrics_stopped
                )
            else:
                metrics_stopped.set()
            await tg.start(serve_timers, horde, shutdown)
            await tg.start(serve_readers, horde, shutdown)
            await tg.start(serve_webhooks, horde, shutdown)
            try:
                yield RunningHorde(url, horde, blobs, metrics_url)
            except Exception as exc:
                # Re-raised below, outside the task group, so that the
                # caller gets its own exception, not a group around it.
                error = exc
            finally:
                stop_by[0] = anyio.current_time() + config.server.grace_period
                horde.begin_shutdown()
                await _drain_calls(horde, admission)
                shutdown.set()
                # Let Hypercorn drain (it cancels what is still open when
                # the grace period ends) before anything is cancelled, also
                # when the block raised: the exception then propagates after.
                with anyio.move_on_after(stop_by[0] - anyio.current_time() + 1, shield=True):
                    await stopped.wait()
                    await metrics_stopped.wait()
                tg.cancel_scope.cancel()
        if error is not None:
            raise error
    finally:
        with anyio.CancelScope(shield=True):
            if s3 is not None:
                await s3.aclose()
            await anyio.to_thread.run_sync(db.dispose)
