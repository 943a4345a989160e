"""The one validated configuration object.

Built from ``hordelite.toml`` (every key documented there), then overridden by
environment variables ``HORDELITE_<SECTION>_<KEY>``; ``HORDELITE_DATABASE_URL``
is accepted as an alias of ``HORDELITE_STORAGE_DATABASE``. A bad value raises
``ConfigError`` naming the key, so ``hordelite serve`` stops at start.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_type_hints

from hordelite.contract.chat_features import ALL_NAMES
from hordelite.contract.limits import (
    DEFAULT_JOB_TTL,
    MAX_API_KEY_CHARS,
    MAX_CHAT_BODY_BYTES,
    MAX_CONTEXT_LENGTH,
    MAX_MAX_LENGTH,
    MAX_NAME,
    MAX_POP_THREADS,
)
from hordelite.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 7001
    # "trio" (QuartTrio) or "asyncio" (Quart): the same app on either loop.
    backend: str = "trio"
    # 36 MiB, the chat request body cap of the specification.
    max_body_bytes: int = MAX_CHAT_BODY_BYTES
    # Seconds a request's body may take to arrive; past it the answer is 408.
    body_timeout: float = 60.0
    # Seconds a stopping server gives open requests before cancelling them.
    grace_period: float = 10.0


@dataclasses.dataclass(frozen=True)
class StorageConfig:
    # A file path (SQLite) or a postgresql:// URL.
    database: str = "./hordelite.db"
    # Threads (and connections) running queries.
    pool_size: int = 4
    # SQLite only: "inline" runs each (sub-millisecond) transaction on the
    # event loop's thread, "threads" hands each to a thread. PostgreSQL always
    # uses threads.
    executor: str = "inline"


@dataclasses.dataclass(frozen=True)
class HordeConfig:
    allow_anonymous: bool = True
    # Seconds a popped job lives before it goes back to the queue.
    job_ttl: float = DEFAULT_JOB_TTL
    # Seconds a request lives after its last chance (creation or last pop).
    request_expiry: float = 1200.0
    # Seconds an ended request stays readable on its status route.
    retention: float = 1800.0
    # Seconds a worker counts as online after its last pop.
    worker_online: float = 300.0
    # A request with more than this many faulted jobs ends faulted.
    max_faults: int = 2
    # More aborted jobs than this in an hour puts a worker into maintenance.
    maintenance_aborts: int = 20
    # Requests (counting n) a user may have in flight; 0 means no limit.
    concurrency: int = 30
    anonymous_concurrency: int = 100
    # Longest long-poll a pop may ask for with "wait".
    max_pop_wait: float = 30.0
    # Seconds between sweeps of expired leases, requests and workers.
    sweep_interval: float = 5.0
    # A JSON file mapping model names to their parameter count; empty means
    # the file shipped with hordelite.
    model_reference: str = ""


@dataclasses.dataclass(frozen=True)
class FrontConfig:
    # Seconds an OpenAI call may wait for its reply (the front's budget); past
    # it the call gets 408 and the horde request is cancelled.
    timeout: float = 300.0
    # Seconds a call waits while no online worker can take its request before
    # it gets 503 no_eligible_worker (and the request is cancelled).
    no_worker_grace: float = 60.0
    # Open calls the front holds at once, in all and per client address;
    # more get 503 FrontAtCapacity before anything is read or queued.
    max_open_calls: int = 10000
    max_open_per_source: int = 1000
    # Seconds between fallback status re-checks of a waiting call (each call
    # picks a random offset, so re-checks are spread out); the completion
    # signal normally wakes the call first.
    recheck_interval: float = 30.0
    # Seconds between SSE keep-alive comments while a streamed call waits.
    keepalive_interval: float = 15.0
    # Spread each progress post's text over the time until the next post
    # (a steady flow, at most about one post interval later); false relays
    # each post as it arrives.
    pace_progress: bool = True


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """``hordelite worker``: the reference worker (its command-line flags
    override these keys)."""

    # The horde's base URL and the worker owner's API key.
    horde: str = "http://127.0.0.1:7001"
    key: str = ""
    # The worker's name on the horde.
    name: str = ""
    # The backend's base URL (an OpenAI-compatible server), or "fake".
    backend: str = ""
    # Jobs served at once, each in its own pop loop.
    threads: int = 1
    # Optional chat features and guarantees the backend implements,
    # comma-separated (prompt_overflow_refused is the worker's own to declare).
    features: str = ""
    # The model id declared to the horde; empty: the backend's.
    model_id: str = ""
    # Context size in tokens; 0: what the backend reports.
    context: int = 0
    # Most tokens generated for one reply.
    max_length: int = 512
    # The highest temperature the backend applies while tools are present;
    # negative: no clamp is declared.
    tools_max_temperature: float = -1.0
    # Tokens the byte-length fit bound adds for a request with tools.
    template_overhead: int = 0
    # Seconds a pop long-polls for a job.
    wait: float = 30.0
    # Seconds the jobs in hand get at SIGINT/SIGTERM before they are faulted.
    grace_period: float = 30.0
    # Seconds between progress posts of a streamed job.
    progress_interval: float = 1.0
    # Seconds between summary log lines.
    summary_interval: float = 300.0
    # Retry delays (horde unreachable, backend down): the first, and the cap.
    backoff_initial: float = 1.0
    backoff_max: float = 60.0
    # Nonconformant refusals implicating a declared feature before it is withdrawn.
    nonconformant_limit: int = 3
    # Seconds one backend request may take.
    backend_timeout: float = 600.0

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The ``features`` list, split and stripped."""
        return tuple(dict.fromkeys(f.strip() for f in self.features.split(",") if f.strip()))


@dataclasses.dataclass(frozen=True)
class Config:
    server: ServerConfig = dataclasses.field(default_factory=ServerConfig)
    storage: StorageConfig = dataclasses.field(default_factory=StorageConfig)
    horde: HordeConfig = dataclasses.field(default_factory=HordeConfig)
    front: FrontConfig = dataclasses.field(default_factory=FrontConfig)
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
    "horde": HordeConfig,
    "front": FrontConfig,
    "worker": WorkerConfig,
}

_BACKENDS = ("trio", "asyncio")


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
            return float(value) if isinstance(value, int | float | str) else _fail()
        except (ValueError, TypeError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _fail() -> Any:
    raise TypeError


def _check(config: Config) -> None:
    s, st, h = config.server, config.storage, config.horde
    if s.backend not in _BACKENDS:
        raise ConfigError(
            f"server.backend: must be one of {', '.join(_BACKENDS)}, got {s.backend!r}"
        )
    if not 0 <= s.port <= 65535:
        raise ConfigError(f"server.port: must be 0 to 65535, got {s.port}")
    if s.max_body_bytes < 1024:
        raise ConfigError(f"server.max_body_bytes: must be at least 1024, got {s.max_body_bytes}")
    if s.body_timeout <= 0:
        raise ConfigError(f"server.body_timeout: must be positive, got {s.body_timeout}")
    if s.grace_period < 0:
        raise ConfigError(f"server.grace_period: must not be negative, got {s.grace_period}")
    if not st.database.strip():
        raise ConfigError("storage.database: must not be empty")
    if "://" in st.database and not st.database.startswith(
        ("postgresql://", "postgresql+psycopg://", "sqlite://")
    ):
        raise ConfigError(
            f"storage.database: must be a file path or a postgresql:// URL, got {st.database!r}"
        )
    if st.executor not in ("inline", "threads"):
        raise ConfigError(f"storage.executor: must be inline or threads, got {st.executor!r}")
    if not 1 <= st.pool_size <= 64:
        raise ConfigError(f"storage.pool_size: must be 1 to 64, got {st.pool_size}")
    for key in ("job_ttl", "request_expiry", "retention", "worker_online", "sweep_interval"):
        if getattr(h, key) <= 0:
            raise ConfigError(f"horde.{key}: must be positive, got {getattr(h, key)}")
    for key in ("max_faults", "maintenance_aborts", "concurrency", "anonymous_concurrency"):
        if getattr(h, key) < 0:
            raise ConfigError(f"horde.{key}: must not be negative, got {getattr(h, key)}")
    if not 0 <= h.max_pop_wait <= 300:
        raise ConfigError(f"horde.max_pop_wait: must be 0 to 300, got {h.max_pop_wait}")
    fr = config.front
    for key in ("timeout", "no_worker_grace", "recheck_interval", "keepalive_interval"):
        if getattr(fr, key) <= 0:
            raise ConfigError(f"front.{key}: must be positive, got {getattr(fr, key)}")
    for key in ("max_open_calls", "max_open_per_source"):
        if getattr(fr, key) < 1:
            raise ConfigError(f"front.{key}: must be at least 1, got {getattr(fr, key)}")
    if h.model_reference and not Path(h.model_reference).is_file():
        raise ConfigError(f"horde.model_reference: no such file {h.model_reference!r}")
    _check_worker(config.worker)


# Features a worker's operator may not declare: the worker declares
# prompt_overflow_refused itself when its fit check is backed, and it carries
# no images.
_WORKER_OWN_FEATURES = {
    "prompt_overflow_refused": "is declared by the worker itself when its fit check is backed",
    "vision": "is not served by the reference worker (it declares no image transport)",
}


def _check_worker(w: WorkerConfig) -> None:
    if not w.horde.startswith(("http://", "https://")):
        raise ConfigError(f"worker.horde: must be an http:// or https:// URL, got {w.horde!r}")
    if len(w.key) > MAX_API_KEY_CHARS:
        raise ConfigError("worker.key: is longer than any API key")
    if len(w.name) > MAX_NAME or len(w.model_id) > MAX_NAME:
        key = "name" if len(w.name) > MAX_NAME else "model_id"
        raise ConfigError(f"worker.{key}: must be at most {MAX_NAME} characters")
    if w.backend not in ("", "fake") and not w.backend.startswith(("http://", "https://")):
        raise ConfigError(
            f"worker.backend: must be an http:// or https:// URL or fake, got {w.backend!r}"
        )
    if not 1 <= w.threads <= MAX_POP_THREADS:
        raise ConfigError(f"worker.threads: must be 1 to {MAX_POP_THREADS}, got {w.threads}")
    for name in w.feature_names:
        if name not in ALL_NAMES:
            raise ConfigError(
                f"worker.features: unknown feature {name!r}; known: {', '.join(ALL_NAMES)}"
            )
        if name in _WORKER_OWN_FEATURES:
            raise ConfigError(f"worker.features: {name} {_WORKER_OWN_FEATURES[name]}")
    if not 0 <= w.context <= MAX_CONTEXT_LENGTH:
        raise ConfigError(f"worker.context: must be 0 to {MAX_CONTEXT_LENGTH}, got {w.context}")
    if not 1 <= w.max_length <= MAX_MAX_LENGTH:
        raise ConfigError(f"worker.max_length: must be 1 to {MAX_MAX_LENGTH}, got {w.max_length}")
    if w.context and w.max_length > w.context:
        raise ConfigError(
            f"worker.max_length: {w.max_length} does not fit worker.context ({w.context})"
        )
    if w.tools_max_temperature != w.tools_max_temperature:  # NaN
        raise ConfigError("worker.tools_max_temperature: must be a number")
    if w.template_overhead < 0:
        raise ConfigError(
            f"worker.template_overhead: must not be negative, got {w.template_overhead}"
        )
    if not 0 <= w.wait <= 300:
        raise ConfigError(f"worker.wait: must be 0 to 300, got {w.wait}")
    if w.grace_period < 0:
        raise ConfigError(f"worker.grace_period: must not be negative, got {w.grace_period}")
    for key in (
        "progress_interval",
        "summary_interval",
        "backoff_initial",
        "backoff_max",
        "backend_timeout",
    ):
        if not getattr(w, key) > 0:
            raise ConfigError(f"worker.{key}: must be positive, got {getattr(w, key)}")
    if w.backoff_max < w.backoff_initial:
        raise ConfigError(
            f"worker.backoff_max: must be at least worker.backoff_initial ({w.backoff_initial})"
        )
    if w.nonconformant_limit < 1:
        raise ConfigError(
            f"worker.nonconformant_limit: must be at least 1, got {w.nonconformant_limit}"
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
