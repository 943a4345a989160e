"""The one validated configuration object.

Built from ``hordelite.toml`` (every key documented there), then overridden by
environment variables ``HORDELITE_<SECTION>_<KEY>``; ``HORDELITE_DATABASE_URL``
is accepted as an alias of ``HORDELITE_STORAGE_DATABASE``. A bad value raises
``ConfigError`` naming the key, so ``hordelite serve`` stops at start.

Each key declares its type (the annotation) and its bounds (``bounded(...)``)
where it is defined; one routine, ``_check``, enforces every declaration.
The only hand-written checks left are those relating two keys.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast, get_type_hints

from hordelite.contract import forwarded
from hordelite.contract.chat_features import ALL_NAMES
from hordelite.contract.limits import (
    DEFAULT_JOB_TTL,
    MAX_API_KEY_CHARS,
    MAX_CHAT_BODY_BYTES,
    MAX_CONTEXT_LENGTH,
    MAX_MAX_LENGTH,
    MAX_MODELS,
    MAX_NAME,
    MAX_NOTICE_CHARS,
    MAX_POP_THREADS,
    NEWS_IMPORTANCE,
)
from hordelite.contract.modes import RAID_ANONYMOUS
from hordelite.errors import ConfigError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What a key accepts beyond its type: numeric bounds (``ge`` at least,
    ``gt`` more than, ``le`` at most), a set of words, a length, or a rule of
    its own (``rule`` answers what is wrong with a value, or None)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    one_of: tuple[str, ...] = ()
    max_chars: int | None = None
    rule: Callable[[Any], str | None] | None = None

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is out of bounds (the message after ``section.key: ``)."""
        return (
            self._choice_problem(value)
            or self._range_problem(value)
            or self._above_problem(value)
            or (self.rule(value) if self.rule is not None else None)
        )

    def _choice_problem(self, value: Any) -> str | None:
        if self.one_of and value not in self.one_of:
            return f"must be one of {', '.join(self.one_of)}, got {value!r}"
        if self.max_chars is not None and len(value) > self.max_chars:
            return f"must be at most {self.max_chars} characters"
        return None

    def _range_problem(self, value: Any) -> str | None:
        """``ge`` and ``le``, worded as one range when both are given."""
        if self.ge is not None and self.le is not None:
            if not self.ge <= value <= self.le:
                return f"must be {self.ge} to {self.le}, got {value}"
        elif self.le is not None and not value <= self.le:
            return f"must be at most {self.le}, got {value}"
        elif self.ge == 0 and not value >= 0:
            return f"must not be negative, got {value}"
        elif self.ge is not None and not value >= self.ge:
            return f"must be at least {self.ge}, got {value}"
        return None

    def _above_problem(self, value: Any) -> str | None:
        if self.gt == 0 and not value > 0:
            return f"must be positive, got {value}"
        if self.gt is not None and not value > self.gt:
            return f"must be more than {self.gt}, got {value}"
        return None

    def describe(self) -> str:
        """The bound as docs/reference/configuration.md words it."""
        if self.one_of:
            return ", ".join(f"`{word}`" for word in self.one_of)
        if self.max_chars is not None:
            return f"at most {self.max_chars} characters"
        if self.ge is not None and self.le is not None:
            return f"{self.ge} to {self.le}"
        if self.le is not None:
            return f"at most {self.le}"
        if self.ge == 0:
            return "0 or more"
        if self.ge is not None:
            return f"at least {self.ge}"
        if self.gt is not None:
            return f"more than {self.gt}"
        return ""


def bounded(
    default: T,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    one_of: tuple[str, ...] = (),
    max_chars: int | None = None,
    rule: Callable[[Any], str | None] | None = None,
) -> T:
    """A configuration key's default with its bounds, for a dataclass field."""
    bounds = Bounds(ge=ge, gt=gt, le=le, one_of=one_of, max_chars=max_chars, rule=rule)
    return dataclasses.field(default=default, metadata={"bounds": bounds})


def bounds_of(field: dataclasses.Field[Any]) -> Bounds | None:
    """A field's declared bounds, or None for a key any value of its type fits."""
    return cast(Bounds | None, field.metadata.get("bounds"))


# Rules of their own, for keys a bound cannot state.


# What a URL whose host or port cannot be read is told (never the URL: it may
# hold a password).
_PORT_PROBLEM = (
    "has a port that is not a number from 1 to 65535 "
    "(host:port; an IPv6 address in brackets, [::1]:port)"
)


def _port_problem(port: int | None) -> str | None:
    return _PORT_PROBLEM if port is not None and not 1 <= port <= 65535 else None


def _url_problem(value: str) -> str | None:
    """Why a URL's host and port cannot be read (as urllib reads them: the
    redis and HTTP clients do), or None."""
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port
    except ValueError:
        return _PORT_PROBLEM
    return _port_problem(port)


def _database(value: str) -> str | None:
    if not value.strip():
        return "must not be empty"
    if "://" not in value:
        return None
    if not value.startswith(("postgresql://", "postgresql+psycopg://", "sqlite://")):
        return f"must be a file path or a postgresql:// URL, got {value!r}"
    # Read as the database is opened (SQLAlchemy's URL), where a bad port
    # was a ValueError out of the command. Imported here: a worker reads this
    # configuration and never opens a database.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(value)
    except ArgumentError:
        return "cannot be read as a URL (postgresql://user:password@host:port/database)"
    except ValueError:
        return _PORT_PROBLEM
    return _port_problem(url.port)


def _signals_url(value: str) -> str | None:
    if value and not value.startswith(("redis://", "rediss://")):
        return f"must be empty (in-process signals) or a redis:// URL, got {value!r}"
    return _url_problem(value) if value else None


def _existing_file_or_empty(value: str) -> str | None:
    return f"no such file {value!r}" if value and not Path(value).is_file() else None


def _directory_or_empty(value: str) -> str | None:
    path = Path(value).expanduser()
    if value and path.exists() and not path.is_dir():
        return f"{value!r} exists and is not a directory"
    return None


def _http_url(value: str) -> str | None:
    if not value.startswith(("http://", "https://")):
        return f"must be an http:// or https:// URL, got {value!r}"
    return _url_problem(value)


def _http_url_or_empty(value: str) -> str | None:
    return _http_url(value) if value else None


def _bucket(value: str) -> str | None:
    # S3's bucket naming rules, the part a path-style URL depends on.
    if re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", value) is None:
        return f"must be 3 to 63 characters of a-z, 0-9, . and -, got {value!r}"
    return None


_ORIGIN = re.compile(r"https?://[^/\s?#,]+")


def _cors_origins(value: str) -> str | None:
    if value.strip() == "*":
        return None
    for origin in (o.strip() for o in value.split(",")):
        if origin and _ORIGIN.fullmatch(origin) is None:
            return (
                f"must be * or a comma-separated list of origins (scheme://host[:port], "
                f"no path), got {origin!r}"
            )
    return None


def _trusted_proxies(value: str) -> str | None:
    try:
        forwarded.parse_trusted_proxies(value)
    except ValueError as exc:
        return f"must be addresses or CIDR networks separated by commas: {exc}"
    return None


def _not_empty(value: str) -> str | None:
    return "must not be empty" if not value.strip() else None


def _backend(value: str) -> str | None:
    if value not in ("", "fake") and not value.startswith(("http://", "https://")):
        return f"must be an http:// or https:// URL or fake, got {value!r}"
    return None


# Features a worker's operator may not declare: the worker declares
# prompt_overflow_refused itself when its fit check is backed, and vision
# (with its image transports) when its backend reads images.
_WORKER_OWN_FEATURES = {
    "prompt_overflow_refused": "is declared by the worker itself when its fit check is backed",
    "vision": "is declared by the worker itself when its backend reads images",
}


def _features(value: str) -> str | None:
    for name in dict.fromkeys(f.strip() for f in value.split(",") if f.strip()):
        if name not in ALL_NAMES:
            return f"unknown feature {name!r}; known: {', '.join(ALL_NAMES)}"
        if name in _WORKER_OWN_FEATURES:
            return f"{name} {_WORKER_OWN_FEATURES[name]}"
    return None


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = bounded(7001, ge=0, le=65535)
    # "trio" (QuartTrio) or "asyncio" (Quart): the same app on either loop.
    backend: str = bounded("trio", one_of=("trio", "asyncio"))
    # 36 MiB, the chat request body cap of the specification.
    max_body_bytes: int = bounded(MAX_CHAT_BODY_BYTES, ge=1024)
    # Seconds a request's body may take to arrive; past it the answer is 408.
    body_timeout: float = bounded(60.0, gt=0, le=3600)
    # Seconds a stopping server gives open requests before cancelling them.
    grace_period: float = bounded(10.0, ge=0)
    # Seconds a connection may go without a complete request head: an idle
    # kept-alive connection, or one still sending its headers, is closed then.
    keep_alive_timeout: float = bounded(5.0, gt=0, le=3600)
    # Most bytes of a request head (request line, headers, the blank line),
    # however it arrives; past it the request gets 431 and the connection
    # closes (hordelite.http.wire).
    max_header_bytes: int = bounded(16 * 1024, ge=1024, le=1024 * 1024)
    # Connections the kernel queues for accept (capped by net.core.somaxconn).
    backlog: int = bounded(4096, ge=1, le=65535)
    # Processes serving the one listening socket, each a whole horde. Above 1
    # needs PostgreSQL and Redis signals (processes_problem, decision 0040).
    processes: int = bounded(1, ge=1, le=64)
    # The web pages whose scripts may read the answers: "*" (any, the AI
    # Horde's way: browser clients on other sites work), or a comma-separated
    # list of origins, each answered by name (empty: none).
    cors_origins: str = bounded("*", rule=_cors_origins)
    # The URL workers reach this horde at, starting every signed image and
    # messages URL (https://horde.example.org); empty: the request's own
    # scheme and Host, or what a trusted proxy forwarded.
    public_url: str = bounded("", rule=forwarded.public_url_problem)
    # Peers whose X-Forwarded-Proto/-Host, Forwarded and X-Forwarded-For
    # headers are believed (addresses or CIDR networks, comma-separated);
    # empty: nobody's, since any client can send them. X-Forwarded-For names
    # the client's address the anonymous budgets count (decision 0071).
    # 127.0.0.1 behind a proxy on this machine.
    trusted_proxies: str = bounded("", rule=_trusted_proxies)
    # Serve HTTP/2 in cleartext (Upgrade: h2c, or the HTTP/2 preface). Off:
    # an upgrade is ignored and the preface refused (decision 0050).
    h2c: bool = False

    @property
    def allowed_origins(self) -> frozenset[str] | None:
        """The ``cors_origins`` list, lowercased; None for ``*`` (every origin)."""
        if self.cors_origins.strip() == "*":
            return None
        return frozenset(o.strip().lower() for o in self.cors_origins.split(",") if o.strip())


@dataclasses.dataclass(frozen=True)
class StorageConfig:
    # A file path (SQLite) or a postgresql:// URL.
    database: str = bounded("./hordelite.db", rule=_database)
    # Connections (and transactions under way at once) per process.
    pool_size: int = bounded(4, ge=1, le=64)
    # "inline" runs each transaction on the event loop's thread (SQLite at
    # once; PostgreSQL in a greenlet whose waits the loop awaits, decision
    # 0059), "threads" hands each to a thread.
    executor: str = bounded("inline", one_of=("inline", "threads"))
    # PostgreSQL: each statement prepared once per connection (decision
    # 0068). false for a pooler in transaction mode that does not track
    # prepared statements: every statement then goes with its SQL.
    prepared_statements: bool = True


@dataclasses.dataclass(frozen=True)
class SignalsConfig:
    # Empty: wake-ups, request versions, progress leases and streams live in
    # this process. redis://host:port/db: they go through Redis, so several
    # processes or machines on one PostgreSQL database act as one horde.
    url: str = bounded("", rule=_signals_url)
    # While Redis is down the horde serves degraded (waits poll, progress
    # posts answer 503): /readyz stays 200 and says so in its body, so that a
    # load balancer does not drop every replica at once when the one Redis
    # they share blips. false: /readyz answers 503 "signals" instead.
    ready_when_degraded: bool = True


@dataclasses.dataclass(frozen=True)
class BlobsConfig:
    # The directory holding images and offloaded chat requests, and the
    # secret signing their URLs; empty: hordelite-blobs beside the SQLite
    # database file (hordelite.blobs.blob_directory).
    directory: str = bounded("", rule=_directory_or_empty)
    # An S3-compatible object store's URL (http(s)://host[:port]); empty: the
    # directory above. Workers then fetch blobs by presigned URLs of the store.
    s3_endpoint: str = bounded("", rule=_http_url_or_empty)
    # The bucket, addressed path-style (endpoint/bucket/key), created if missing.
    s3_bucket: str = bounded("hordelite", rule=_bucket)
    s3_region: str = bounded("us-east-1", rule=_not_empty)
    # The credentials requests and presigned URLs are signed with.
    s3_access_key: str = bounded("", max_chars=128)
    # Not in the repr: a logged or printed configuration must not show it.
    s3_secret_key: str = dataclasses.field(
        default="", repr=False, metadata={"bounds": Bounds(max_chars=128)}
    )


@dataclasses.dataclass(frozen=True)
class HordeConfig:
    allow_anonymous: bool = True
    # Seconds a popped job lives before it goes back to the queue.
    job_ttl: float = bounded(DEFAULT_JOB_TTL, gt=0)
    # Seconds a request lives after its last chance (creation or last pop).
    request_expiry: float = bounded(1200.0, gt=0)
    # Seconds an ended request stays readable on its status route (and a
    # kudos transfer's Idempotency-Key is kept).
    retention: float = bounded(1800.0, gt=0)
    # Seconds a worker counts as online after its last pop.
    worker_online: float = bounded(300.0, gt=0)
    # A request with more than this many faulted jobs ends faulted.
    max_faults: int = bounded(2, ge=0)
    # More aborted jobs than this in an hour puts a worker into maintenance.
    maintenance_aborts: int = bounded(20, ge=0)
    # Requests (counting n) a user may have in flight; 0 means no limit.
    concurrency: int = bounded(30, ge=0)
    # The anonymous user's, per client address (decision 0071).
    anonymous_concurrency: int = bounded(100, ge=0)
    # Longest long-poll a pop may ask for with "wait".
    max_pop_wait: float = bounded(30.0, ge=0, le=300)
    # Seconds between sweeps of expired leases, requests and workers.
    sweep_interval: float = bounded(5.0, gt=0)
    # A JSON file mapping model names to their parameter count; empty means
    # the file shipped with hordelite.
    model_reference: str = bounded("", rule=_existing_file_or_empty)


@dataclasses.dataclass(frozen=True)
class BudgetsConfig:
    """What one user may hold and send (the anonymous user's per client
    address, decision 0071), counted in the database so that the budgets
    hold across processes. Each budget has a value for registered
    users and one for each of the anonymous and trusted roles; 0 means no
    limit. Admins are exempt (contract/budgets.py)."""

    # Requests queued, and budget refusals, in the last 60 s; past it: 429
    # RequestRateExceeded.
    requests_per_minute: int = bounded(60, ge=0)
    anonymous_requests_per_minute: int = bounded(60, ge=0)
    trusted_requests_per_minute: int = bounded(600, ge=0)
    # Requests holding stored prompts or messages: waiting ones, and ended
    # ones whose jobs are still out; past it: 429 TooManyPrompts.
    requests_held: int = bounded(100, ge=0)
    anonymous_requests_held: int = bounded(100, ge=0)
    trusted_requests_held: int = bounded(1000, ge=0)
    # Bytes of prompts and messages those requests hold (images apart),
    # with their generations' bound until each comes in, and the
    # generations kept until their purge (decision 0069); one request over
    # it alone: 413 RequestTooLarge, else 429.
    stored_bytes: int = bounded(64 * 1024 * 1024, ge=0)
    anonymous_stored_bytes: int = bounded(32 * 1024 * 1024, ge=0)
    trusted_stored_bytes: int = bounded(1024 * 1024 * 1024, ge=0)
    # Images in one chat request; past it: 413 TooManyImages.
    images_per_request: int = bounded(16, ge=0)
    anonymous_images_per_request: int = bounded(8, ge=0)
    trusted_images_per_request: int = bounded(64, ge=0)
    # Bytes of stored (JPEG) images those requests hold; one request over it
    # alone: 413 RequestTooLarge, else 429.
    image_bytes: int = bounded(128 * 1024 * 1024, ge=0)
    anonymous_image_bytes: int = bounded(64 * 1024 * 1024, ge=0)
    trusted_image_bytes: int = bounded(1024 * 1024 * 1024, ge=0)
    # Workers one user may register (the anonymous user runs none); past
    # it the pop that would register one more gets 403 TooManyWorkers.
    workers_per_user: int = bounded(20, ge=0)
    trusted_workers_per_user: int = bounded(200, ge=0)
    # Models one worker may declare in a pop; past it: 400 TooManyModels.
    models_per_worker: int = bounded(10, ge=0, le=MAX_MODELS)


@dataclasses.dataclass(frozen=True)
class FrontConfig:
    # Seconds an OpenAI call may wait for its reply (the front's budget); past
    # it the call gets 408 and the horde request is cancelled.
    timeout: float = bounded(300.0, gt=0)
    # Seconds a call waits while no online worker can take its request before
    # it gets 503 no_eligible_worker (and the request is cancelled).
    no_worker_grace: float = bounded(60.0, gt=0)
    # Open calls the front holds at once, in all and per client address;
    # more get 503 FrontAtCapacity before anything is read or queued.
    max_open_calls: int = bounded(10000, ge=1)
    max_open_per_source: int = bounded(1000, ge=1)
    # Seconds between fallback status re-checks of a waiting call (each call
    # picks a random offset, so re-checks are spread out); the completion
    # signal normally wakes the call first.
    recheck_interval: float = bounded(30.0, gt=0)
    # Seconds between SSE keep-alive comments while a streamed call waits.
    keepalive_interval: float = bounded(15.0, gt=0)
    # Spread each progress post's text over the time until the next post
    # (a steady flow, at most about one post interval later); false relays
    # each post as it arrives.
    pace_progress: bool = True


@dataclasses.dataclass(frozen=True)
class ImagesConfig:
    # Fetch image URLs that resolve to private, loopback or link-local
    # addresses (a horde whose clients are its own, on its own network);
    # false refuses them, so a client cannot make the horde reach into the
    # operator's network.
    fetch_private: bool = False
    # Bytes of a chat request's messages, as JSON with its images inlined as
    # data URLs, above which a worker that declared "messages_url" gets them
    # as one signed URL instead of inline; 0 never offloads.
    offload_bytes: int = bounded(1024 * 1024, ge=0)


@dataclasses.dataclass(frozen=True)
class WebhooksConfig:
    # Call webhooks at private, loopback and link-local addresses, and plain
    # http:// ones (a horde whose clients are its own services, on its own
    # network); false refuses them at submit (http://) and at the call (an
    # address that is not public), so a client cannot make the horde post
    # into the operator's network.
    call_private: bool = False


@dataclasses.dataclass(frozen=True)
class DashboardConfig:
    # The web dashboard and chat playground at / (read-only; its chat goes
    # through /v1 like any client's); false answers / with 404.
    enabled: bool = True


def _date_or_empty(value: str) -> str | None:
    if value == "":
        return None
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return "expected a date as YYYY-MM-DD, or empty"
    return None


@dataclasses.dataclass(frozen=True)
class NoticesConfig:
    """What the horde tells its users: its terms, privacy policy and
    sponsors (``/documents/terms``, ``/documents/privacy``,
    ``/documents/sponsors``, in Markdown) and one piece of news
    (``/status/news``); empty: none."""

    terms: str = bounded("", max_chars=MAX_NOTICE_CHARS)
    privacy: str = bounded("", max_chars=MAX_NOTICE_CHARS)
    sponsors: str = bounded("", max_chars=MAX_NOTICE_CHARS)
    news: str = bounded("", max_chars=MAX_NOTICE_CHARS)
    news_title: str = bounded("", max_chars=MAX_NAME)
    # The AI Horde's levels: Information, Workers, Minor, Major, Crisis.
    news_importance: str = bounded("Information", one_of=NEWS_IMPORTANCE)
    news_published: str = bounded("", rule=_date_or_empty)


@dataclasses.dataclass(frozen=True)
class ModerationConfig:
    """What moderators and the horde's countermeasures keep and how
    (decision 0077)."""

    # Seconds an audit entry (a moderator's action, a request a filter
    # refused or flagged) is kept: 90 days.
    audit_retention: float = bounded(90 * 86400.0, gt=0)
    # Raid mode (PUT /status/modes): what an anonymous request gets, refused
    # (403 AnonymousDisabled) or throttled to raid_anonymous_per_minute
    # requests a minute per client address and serving process (429
    # RequestRateExceeded, told no time to wait).
    raid_anonymous: str = bounded("refuse", one_of=RAID_ANONYMOUS)
    raid_anonymous_per_minute: int = bounded(2, ge=1)
    # A job done faster than this many tokens a second (as billed, from its
    # pop to its submit) adds to its worker's suspicion; 0: never. The AI
    # Horde's bound for text.
    suspicious_tokens_per_second: float = bounded(150.0, ge=0)
    # Words (comma-separated, any case) a worker's name must not hold: a
    # worker registered with one is suspected once (the AI Horde's
    # profanity check, here the operator's list).
    suspicious_name_words: str = bounded("", max_chars=4000)
    # Growing timeouts by address (docs/reference/addresses.md): seconds of
    # the timeout an address's first offence carries (a filter's refusal,
    # or budget_refusals_per_offence budget refusals); the n-th offence's
    # is (2n - 1) times it, as the AI Horde's (3, 9, 15 ... minutes). 0: no
    # offence times an address out.
    offence_timeout: float = bounded(180.0, ge=0)
    # The longest timeout an offence carries: a day.
    offence_timeout_max: float = bounded(86400.0, gt=0)
    # Seconds after its last offence that an address's offences are
    # forgotten (the AI Horde's suspicion lasts a day).
    offence_memory: float = bounded(86400.0, gt=0)
    # Budget refusals (too many requests held, stored bytes, a request too
    # large, too many images) from one address that make one offence; 0:
    # budget refusals never time an address out.
    budget_refusals_per_offence: int = bounded(10, ge=0)


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    # Serve GET /metrics, the Prometheus text format (decision 0043).
    enabled: bool = True
    # 0: on the horde's own port; else a port of its own that serves
    # /metrics only.
    port: int = bounded(0, ge=0, le=65535)
    # The address that port listens on. Never server.host implicitly: a port
    # kept for monitoring would otherwise be public with --host 0.0.0.0.
    host: str = bounded("127.0.0.1", rule=_not_empty)


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """``hordelite worker``: the reference worker (its command-line flags
    override these keys)."""

    # The horde's base URL and the worker owner's API key.
    horde: str = bounded("http://127.0.0.1:7001", rule=_http_url)
    key: str = bounded("", max_chars=MAX_API_KEY_CHARS)
    # The worker's name on the horde.
    name: str = bounded("", max_chars=MAX_NAME)
    # The backend's base URL (an OpenAI-compatible server), or "fake".
    backend: str = bounded("", rule=_backend)
    # Jobs served at once, each in its own pop loop.
    threads: int = bounded(1, ge=1, le=MAX_POP_THREADS)
    # Optional chat features and guarantees the backend implements,
    # comma-separated (prompt_overflow_refused is the worker's own to declare).
    features: str = bounded("", rule=_features)
    # The model id declared to the horde; empty: the backend's.
    model_id: str = bounded("", max_chars=MAX_NAME)
    # Context size in tokens; 0: what the backend reports.
    context: int = bounded(0, ge=0, le=MAX_CONTEXT_LENGTH)
    # Most tokens generated for one reply (at most context when it is set).
    max_length: int = bounded(512, ge=1, le=MAX_MAX_LENGTH)
    # The highest temperature the backend applies while tools are present;
    # negative: no clamp is declared.
    tools_max_temperature: float = -1.0
    # Tokens the byte-length fit bound adds for a request with tools.
    template_overhead: int = bounded(0, ge=0)
    # Seconds a pop long-polls for a job.
    wait: float = bounded(30.0, ge=0, le=300)
    # Seconds the jobs in hand get at SIGINT/SIGTERM before they are faulted.
    grace_period: float = bounded(30.0, ge=0)
    # Seconds between progress posts of a streamed job (its first text is
    # posted at once).
    progress_interval: float = bounded(1.0, gt=0)
    # Seconds between summary log lines.
    summary_interval: float = bounded(300.0, gt=0)
    # Retry delays (horde unreachable, backend down): the first, and the cap
    # (at least the first).
    backoff_initial: float = bounded(1.0, gt=0)
    backoff_max: float = bounded(60.0, gt=0)
    # Nonconformant refusals implicating a declared feature before it is withdrawn.
    nonconformant_limit: int = bounded(3, ge=1)
    # Seconds one backend request may take.
    backend_timeout: float = bounded(600.0, gt=0)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The ``features`` list, split and stripped."""
        return tuple(dict.fromkeys(f.strip() for f in self.features.split(",") if f.strip()))


@dataclasses.dataclass(frozen=True)
class Config:
    server: ServerConfig = dataclasses.field(default_factory=ServerConfig)
    storage: StorageConfig = dataclasses.field(default_factory=StorageConfig)
    signals: SignalsConfig = dataclasses.field(default_factory=SignalsConfig)
    blobs: BlobsConfig = dataclasses.field(default_factory=BlobsConfig)
    horde: HordeConfig = dataclasses.field(default_factory=HordeConfig)
    budgets: BudgetsConfig = dataclasses.field(default_factory=BudgetsConfig)
    front: FrontConfig = dataclasses.field(default_factory=FrontConfig)
    images: ImagesConfig = dataclasses.field(default_factory=ImagesConfig)
    webhooks: WebhooksConfig = dataclasses.field(default_factory=WebhooksConfig)
    dashboard: DashboardConfig = dataclasses.field(default_factory=DashboardConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    notices: NoticesConfig = dataclasses.field(default_factory=NoticesConfig)
    moderation: ModerationConfig = dataclasses.field(default_factory=ModerationConfig)
    worker: WorkerConfig = dataclasses.field(default_factory=WorkerConfig)

    def replace(self, **sections: Mapping[str, Any]) -> Config:
        """A copy with some keys of some sections changed, validated."""
        raw = {name: dataclasses.asdict(getattr(self, name)) for name in _SECTIONS}
        for name, values in sections.items():
            if name not in raw:
                raise ConfigError(f"unknown configuration section [{name}]")
            raw[name].update(values)
        return build_config(raw)


_SECTIONS: dict[str, type[Any]] = {
    "server": ServerConfig,
    "storage": StorageConfig,
    "signals": SignalsConfig,
    "blobs": BlobsConfig,
    "horde": HordeConfig,
    "budgets": BudgetsConfig,
    "front": FrontConfig,
    "images": ImagesConfig,
    "webhooks": WebhooksConfig,
    "dashboard": DashboardConfig,
    "metrics": MetricsConfig,
    "notices": NoticesConfig,
    "moderation": ModerationConfig,
    "worker": WorkerConfig,
}


def _coerce(key: str, kind: type[Any], value: Any) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in (
            "1",
            "true",
            "yes",
            "on",
            "0",
            "false",
            "no",
            "off",
        ):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if kind is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            return int(value) if isinstance(value, int | str) else _fail()
        except (ValueError, TypeError):
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if kind is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            number = float(value) if isinstance(value, int | float | str) else _fail()
        except (ValueError, TypeError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if number != number:  # NaN passes no bound, so it is no number here
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return number
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _fail() -> Any:
    raise TypeError


def _check(config: Config) -> None:
    """Every declared bound of every key, then the rules relating two keys."""
    for name in _SECTIONS:
        section = getattr(config, name)
        for field in dataclasses.fields(section):
            bounds = bounds_of(field)
            problem = bounds.problem(getattr(section, field.name)) if bounds else None
            if problem is not None:
                raise ConfigError(f"{name}.{field.name}: {problem}")
    if config.metrics.port and config.metrics.port == config.server.port:
        raise ConfigError(
            f"metrics.port: {config.metrics.port} is server.port; "
            "0 serves /metrics on the horde's port"
        )
    w = config.worker
    if w.context and w.max_length > w.context:
        raise ConfigError(
            f"worker.max_length: {w.max_length} does not fit worker.context ({w.context})"
        )
    if w.backoff_max < w.backoff_initial:
        raise ConfigError(
            f"worker.backoff_max: must be at least worker.backoff_initial ({w.backoff_initial})"
        )


def processes_problem(config: Config) -> str | None:
    """Why ``server.processes`` cannot be served with this configuration, or
    None. Checked by ``hordelite serve`` only: the other commands read the
    same file and need neither.

    Several processes are one horde only when they share its state: the
    database (SQLite's single writer would also serialise them) and the
    signals (in-process wake-ups and versions would not reach the others).
    """
    n = config.server.processes
    if n == 1:
        return None
    missing = []
    if not config.storage.database.startswith("postgresql"):
        missing.append(
            "a PostgreSQL database (set storage.database, or --database, to a postgresql:// URL)"
        )
    if not config.signals.url:
        missing.append(
            "Redis signals (set signals.url, or HORDELITE_SIGNALS_URL, to a redis:// URL)"
        )
    if not missing:
        return None
    return (
        f"server.processes: {n} processes need {' and '.join(missing)}; "
        "or serve one process (--processes 1)"
    )


def build_config(raw: Mapping[str, Any]) -> Config:
    """A validated Config from a mapping of sections; unknown keys are errors."""
    sections: dict[str, Any] = {}
    for name, raw_section in raw.items():
        cls = _SECTIONS.get(name)
        if cls is None:
            raise ConfigError(f"unknown configuration section [{name}]")
        if not isinstance(raw_section, Mapping):
            raise ConfigError(f"[{name}] must be a table")
        hints = get_type_hints(cls)
        values = {}
        for key, value in raw_section.items():
            if key not in hints:
                raise ConfigError(f"{name}.{key}: unknown configuration key")
            values[key] = _coerce(f"{name}.{key}", hints[key], value)
        sections[name] = cls(**values)
    config = Config(**sections)
    _check(config)
    return config


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read ``path`` (if it exists, or if named explicitly) and the environment.

    Raises ConfigError naming the key for any bad value.
    """
    environ = os.environ if environ is None else environ
    raw: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    if path is not None:
        file = Path(path)
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"configuration file {str(file)!r} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: {exc}") from None
        for name, section in data.items():
            if not isinstance(section, dict):
                raise ConfigError(f"{name}: expected a [section], got a plain key")
            raw.setdefault(name, {}).update(section)
    for name, cls in _SECTIONS.items():
        for key in get_type_hints(cls):
            value = environ.get(f"HORDELITE_{name.upper()}_{key.upper()}")
            if value is not None:
                raw[name][key] = value
    if "HORDELITE_DATABASE_URL" in environ:
        raw["storage"]["database"] = environ["HORDELITE_DATABASE_URL"]
    return build_config(raw)
