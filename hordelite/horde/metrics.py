"""The horde's Prometheus metrics: every definition, and the scrape.

Counters and histograms move on the hot path (an increment, no I/O); what
the horde holds now (queue depth, workers online, the database and Redis
round trips) is read when ``/metrics`` is scraped: the queue depth at most
once per METRICS_READ_SECONDS, for the METRICS_MODELS models with most
waiting jobs and the rest summed, and the pool snapshot the service keeps
anyway (decisions 0043, 0048).

Each Horde has its own ``HordeMetrics``, never prometheus_client's global
registry: several hordes in one process (the tests) each count their own.

Several serving processes (``hordelite serve --processes N``) answer the
sum over all of them: the supervisor gives each child the environment
variable PROMETHEUS_MULTIPROC_DIR, a directory it creates and removes, so
that prometheus_client keeps the counters in per-process files there and a
scrape of any child reads them all. What is read at scrape time comes from
the shared database and pool, once, by the child answering: it is never
multiplied by N. So are ``hordelite_build_info`` and prometheus_client's
``process_*`` metrics: they describe the process answering the scrape (the
sum of N processes' resident memories or start times means nothing, and
their files have no place for it).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import anyio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from hordelite import __version__
from hordelite.contract.limits import METRICS_MODELS, METRICS_READ_SECONDS, READY_CHECK_SECONDS
from hordelite.storage.timers import QueueDepth

if TYPE_CHECKING:
    from hordelite.contract.eligibility import WorkerView
    from hordelite.horde.service import Horde

# No ``_created`` series beside each counter: they double the exposition,
# and multiprocess mode, where the counts of processes started at different
# times add up, has none.
disable_created_metrics()  # type: ignore[no-untyped-call]

# The environment variable prometheus_client reads (before the first metric
# is made) to keep its values in per-process files of that directory.
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Seconds from a request's creation to its done, and an OpenAI call's: from
# a fraction of a second (a short reply by an idle worker) to the request
# expiry's order (twenty minutes).
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)

# The route label of a request no route matched (404, 405): every unknown
# path shares it, so a client cannot grow the label set.
UNMATCHED_ROUTE = "unmatched"
# The model label of the queue of requests that accept any model.
ANY_MODEL = "any"
# The model label of the requests none of whose models an online worker
# serves: a client names models freely, so a name becomes a label only once
# a worker serves it (the label set is the pool's, not the clients').
UNSERVED_MODELS = "unserved"
# The kind label of the queue depth: the queue's two kinds of request.
QUEUE_KINDS = ("text", "chat")


# The model label of the served models past the METRICS_MODELS with most
# waiting jobs, summed: the label set stays bounded whatever the pool serves.
OTHER_MODELS = "other"
_RESERVED_LABELS = frozenset({ANY_MODEL, UNSERVED_MODELS, OTHER_MODELS})

log = logging.getLogger("hordelite.metrics")


class HordeMetrics:
    """The counters, gauges and histograms of one horde."""

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        if multiprocess_dir is None:
            multiprocess_dir = os.environ.get(MULTIPROCESS_ENV) or None
        self.multiprocess_dir = multiprocess_dir
        # In multiprocess mode the values live in the directory's files and
        # are collected from there (all processes); registering them here
        # as well would add this process's share twice.
        self._own = CollectorRegistry(auto_describe=True)
        registry = None if multiprocess_dir else self._own
        self._registry = registry
        # This process's own in either mode (never in the multiprocess
        # files): its CPU, memory, open files and start time, read from /proc
        # at each scrape, and the version it runs.
        ProcessCollector(registry=self._own)
        self._own.register(_Fixed([build_info()]))
        # Every counted metric lives in ``registry``; the latencies share buckets.
        counter = functools.partial(Counter, registry=registry)
        histogram = functools.partial(Histogram, buckets=LATENCY_BUCKETS, registry=registry)
        self.http_requests = counter(
            "hordelite_http_requests",
            "HTTP requests answered, by route template, method and status code.",
            ["route", "method", "status"],
        )
        self.refusals = counter(
            "hordelite_refusals", "Requests refused with a return code (rc), by rc.", ["rc"]
        )
        self.request_latency = histogram(
            "hordelite_request_latency_seconds",
            "Seconds from a request's creation to its done, by kind (text, chat).",
            ["kind"],
        )
        self.front_latency = histogram(
            "hordelite_front_call_seconds",
            "Seconds from an OpenAI chat completion call's arrival to the end of its "
            "answer, by stream (true, false).",
            ["stream"],
        )
        self.pops = counter(
            "hordelite_pops", "Worker pops answered, by outcome (job, empty).", ["outcome"]
        )
        self.faults = counter(
            "hordelite_faults",
            "Jobs faulted, by reason (a worker's fault reason, none, lease_expired).",
            ["reason"],
        )
        self.webhook_calls = counter(
            "hordelite_webhook_calls",
            "Webhook calls made, by outcome (answered, retry, given_up).",
            ["outcome"],
        )
        self.progress_posts = counter(
            "hordelite_progress_posts", "Progress posts of streamed jobs accepted."
        )
        self.sse_streams = Gauge(
            "hordelite_sse_streams_open",
            "Streamed (SSE) OpenAI calls open now.",
            registry=registry,
            # The sum over the processes alive (a dead one's streams are gone).
            multiprocess_mode="livesum",
        )
        self.kudos_charged = counter(
            "hordelite_kudos_charged", "Kudos charged to requesters for settled jobs."
        )
        self.kudos_rewarded = counter(
            "hordelite_kudos_rewarded", "Kudos rewarded to worker owners for settled jobs."
        )
        self.scrape_failures = counter(
            "hordelite_scrape_failures",
            "Scrapes that left a figure out because it could not be read, by figure.",
            ["figure"],
        )
        self.reads = ScrapeReads()

    def watch_signals(self, signals: object) -> None:
        """With Redis signals (only they have ``watch``): the gauge
        ``hordelite_signals_degraded``, set as the signals' state flips."""
        watch = getattr(signals, "watch", None)
        if not callable(watch):
            return
        degraded = Gauge(
            "hordelite_signals_degraded",
            "1 while the Redis signals are down and the horde serves degraded, else 0.",
            registry=self._registry,
            # 1 when any process alive is degraded: each process has its own
            # circuit, and a scrape reaches one of them.
            multiprocess_mode="livemax",
        )
        watch(lambda down: degraded.set(1 if down else 0))

    def front_call(self) -> FrontCallTimer:
        """A timer for one OpenAI call, from now (its arrival)."""
        return FrontCallTimer(self)

    def render(self, scraped: Iterable[Metric]) -> bytes:
        """The text exposition: the counted metrics (of every process in
        multiprocess mode), this process's own, then the ``scraped`` ones."""
        registry = CollectorRegistry(auto_describe=False)
        if self.multiprocess_dir:
            MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
        # In multiprocess mode this holds only the answering process's own
        # metrics (the counted ones live in the files).
        registry.register(_Fixed(self._own.collect()))
        registry.register(_Fixed(scraped))
        return generate_latest(registry)


class FrontCallTimer:
    """One OpenAI call's latency, observed once however the call ends (its
    answer, its refusal, or the end of its stream)."""

    def __init__(self, metrics: HordeMetrics) -> None:
        self._metrics = metrics
        self._start = time.monotonic()
        self._done = False
        self.stream = False
        self._streaming = False

    def streaming(self) -> None:
        """The call is now an open SSE stream (until ``done``)."""
        self.stream = True
        self._streaming = True
        self._metrics.sse_streams.inc()

    def done(self) -> None:
        if self._done:
            return
        self._done = True
        if self._streaming:
            self._metrics.sse_streams.dec()
        label = "true" if self.stream else "false"
        self._metrics.front_latency.labels(label).observe(time.monotonic() - self._start)


class _Fixed:
    """A collector answering metrics already made (describe: none, so the
    registry checks no names)."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


# The figures a scrape reads, each left out of the exposition when it cannot
# be read (and its failure logged, ScrapeReads.failed).
QUEUE_DEPTH = "hordelite_queue_depth"
POOL = "hordelite_workers_online"


class ScrapeReads:
    """What scrapes read of the database, shared by every scrape of one
    horde: the queue depth, read at most once per METRICS_READ_SECONDS
    however many scrapers there are (one read for all of them when it is
    stale), and the figures that could not be read, each failure kind logged
    once (not once a scrape) until its figure reads again."""

    def __init__(self) -> None:
        self._lock = anyio.Lock()
        self._depth: tuple[float, QueueDepth] | None = None
        self._failing: dict[str, set[str]] = {}

    async def queue_depth(self, horde: Horde) -> QueueDepth:
        async with self._lock:
            if self._depth is None or anyio.current_time() - self._depth[0] >= METRICS_READ_SECONDS:
                with anyio.fail_after(READY_CHECK_SECONDS):
                    depth = await horde.store.queue_depth(now=horde.clock.now(), top=METRICS_MODELS)
                self._depth = (anyio.current_time(), depth)
            return self._depth[1]

    def failed(self, figure: str, exc: Exception, metrics: HordeMetrics) -> None:
        """``figure`` is left out of this scrape: counted, and logged the
        first time this kind of failure stops it."""
        metrics.scrape_failures.labels(figure).inc()
        kind = f"{type(exc).__name__}: {exc}"[:500]
        kinds = self._failing.setdefault(figure, set())
        if kind not in kinds:
            kinds.add(kind)
            log.warning(
                "/metrics leaves out %s: it could not be read (%s); logged once until it "
                "reads again, counted in hordelite_scrape_failures_total",
                figure,
                kind,
            )

    def read(self, figure: str) -> None:
        if self._failing.pop(figure, None):
            log.info("/metrics reads %s again", figure)


async def scrape(horde: Horde) -> bytes:
    """The ``/metrics`` answer: the counted metrics, and what the horde holds
    now: the queue depth (at most METRICS_READ_SECONDS old), the pool
    snapshot, a ping each of the database and Redis, each bounded by
    READY_CHECK_SECONDS (Redis's not pinged while its circuit is open: it
    answers down at once, RedisSignals.ping). A figure that cannot be read is left out, counted
    and logged (``ScrapeReads.failed``), never dropped silently."""
    db_rtt = await round_trip(horde.store.ping)
    scraped = reachability("database", "the database", db_rtt)
    if db_rtt is not None:
        pool, online = await _pool_figures(horde)
        scraped += pool
        scraped += await _queue_figures(horde, online)
    redis_ping = horde.upkeep.signals_ping()
    if redis_ping is not None:
        scraped += reachability("redis", "Redis", await round_trip(redis_ping))
    return horde.metrics.render(scraped)


async def _pool_figures(horde: Horde) -> tuple[list[Metric], list[WorkerView]]:
    reads = horde.metrics.reads
    try:
        with anyio.fail_after(READY_CHECK_SECONDS):
            online = await horde.directory.online_workers(horde.clock.now())
    except Exception as exc:  # any failure leaves the figure out, counted and logged
        reads.failed(POOL, exc, horde.metrics)
        return [], []
    reads.read(POOL)
    threads = sum(w.threads for w in online)
    return [
        gauge(POOL, "Workers online.", len(online)),
        gauge("hordelite_threads_online", "Threads of the workers online.", threads),
    ], online


async def _queue_figures(horde: Horde, online: list[WorkerView]) -> list[Metric]:
    reads = horde.metrics.reads
    try:
        depth = await reads.queue_depth(horde)
    except Exception as exc:  # any failure leaves the figure out, counted and logged
        reads.failed(QUEUE_DEPTH, exc, horde.metrics)
        return []
    reads.read(QUEUE_DEPTH)
    values = served_zeros(online, depth)
    for (model, kind), jobs in depth.models.items():
        # A served model named like a label of ours is summed with the other
        # models, so that no two series share labels.
        label = OTHER_MODELS if model in _RESERVED_LABELS else model
        values[(label, kind)] = values.get((label, kind), 0) + jobs
    for label, jobs_by_kind in (
        (OTHER_MODELS, depth.other),
        (ANY_MODEL, depth.any_model),
        (UNSERVED_MODELS, depth.unserved),
    ):
        for kind, jobs in jobs_by_kind.items():
            values[(label, kind)] = values.get((label, kind), 0) + jobs
    return [
        labelled_gauge(
            QUEUE_DEPTH,
            f"Jobs waiting for a worker, by kind (text, chat) and model: the {METRICS_MODELS} "
            "served models with most (other: the rest of the served models, summed; any: "
            "requests for any model; unserved: requests for none an online worker serves).",
            ["model", "kind"],
            values,
        )
    ]


def served_zeros(online: list[WorkerView], depth: QueueDepth) -> dict[tuple[str, str], int]:
    """A 0 for each kind of each model labelled, and of the served models
    with nothing waiting, so that a graph shows 0, not "no data": as many as
    the label set has room for (METRICS_MODELS models in all; ``other``,
    which sums the rest, gets its 0s once there is a rest)."""
    labelled = {model for model, _ in depth.models}
    served = {m for w in online for m in w.models} - _RESERVED_LABELS
    idle = sorted(served - labelled)[: max(METRICS_MODELS - len(labelled), 0)]
    zeros = {(model, kind): 0 for model in (*labelled, *idle) for kind in QUEUE_KINDS}
    if len(served) > len(labelled) + len(idle):
        zeros |= {(OTHER_MODELS, kind): 0 for kind in QUEUE_KINDS}
    return zeros


def build_info() -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "hordelite_build_info",
        "1, labelled with the hordelite version running.",
        labels=["version"],
    )
    family.add_metric([__version__], 1)
    return family


async def round_trip(ping: Callable[[], Awaitable[None]]) -> float | None:
    """Seconds one ``ping()`` took, or None when it failed or took longer
    than READY_CHECK_SECONDS."""
    start = time.monotonic()
    try:
        with anyio.fail_after(READY_CHECK_SECONDS):
            await ping()
    except Exception:
        return None
    return time.monotonic() - start


def reachability(name: str, what: str, rtt: float | None) -> list[Metric]:
    """``hordelite_<name>_up``, and ``hordelite_<name>_round_trip_seconds``
    (``rtt``) when it answered: name is database or redis."""
    up = gauge(
        f"hordelite_{name}_up",
        f"1 when {what} answered the scrape's ping.",
        0 if rtt is None else 1,
    )
    if rtt is None:
        return [up]
    took = gauge(
        f"hordelite_{name}_round_trip_seconds", f"Seconds the scrape's ping of {what} took.", rtt
    )
    return [up, took]


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def labelled_gauge(
    name: str, documentation: str, labels: list[str], values: dict[tuple[str, str], int]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family
