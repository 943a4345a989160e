"""hordelite.config.load_config: file, environment, validation.

Every test passes an explicit ``environ`` so the shell running pytest cannot
change the answer.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from hordelite.config import (
    Bounds,
    Config,
    HordeConfig,
    ServerConfig,
    StorageConfig,
    bounds_of,
    load_config,
)
from hordelite.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "hordelite.toml"
REFERENCE = ROOT / "docs" / "reference" / "configuration.md"


def write(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "hordelite.toml"
    file.write_text(text, encoding="utf-8")
    return file


# Defaults, file, environment -------------------------------------------------


def test_no_file_and_no_environment_give_the_defaults() -> None:
    assert load_config(None, environ={}) == Config()


def test_an_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, ""), environ={}) == Config()


def test_file_values_replace_the_defaults_and_leave_the_rest(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        '[server]\nport = 8000\nbackend = "asyncio"\n'
        '[storage]\ndatabase = "/srv/horde.db"\n'
        "[horde]\njob_ttl = 60\nallow_anonymous = false\n",
    )
    config = load_config(file, environ={})
    assert config.server.port == 8000
    assert config.server.backend == "asyncio"
    assert config.storage.database == "/srv/horde.db"
    assert config.horde.job_ttl == 60.0
    assert config.horde.allow_anonymous is False
    assert config.server.host == ServerConfig().host
    assert config.storage.pool_size == StorageConfig().pool_size
    assert config.horde.retention == HordeConfig().retention


def test_the_environment_overrides_the_file(tmp_path: Path) -> None:
    file = write(tmp_path, "[server]\nport = 8000\n")
    config = load_config(file, environ={"HORDELITE_SERVER_PORT": "9000"})
    assert config.server.port == 9000


def test_environment_values_are_converted_to_the_keys_types() -> None:
    environ = {
        "HORDELITE_HORDE_ALLOW_ANONYMOUS": "false",
        "HORDELITE_HORDE_JOB_TTL": "42.5",
        "HORDELITE_HORDE_CONCURRENCY": "3",
        "HORDELITE_SERVER_HOST": "0.0.0.0",
    }
    config = load_config(None, environ=environ)
    assert config.horde.allow_anonymous is False
    assert config.horde.job_ttl == 42.5
    assert config.horde.concurrency == 3
    assert config.server.host == "0.0.0.0"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", True), ("true", True), ("on", True), ("0", False), ("off", False), ("No", False)],
)
def test_environment_booleans_accept_the_usual_spellings(text: str, expected: bool) -> None:
    assert (
        load_config(None, environ={"HORDELITE_HORDE_ALLOW_ANONYMOUS": text}).horde.allow_anonymous
        is expected
    )


def test_DATABASE_URL_is_an_alias_of_the_storage_database(tmp_path: Path) -> None:
    file = write(tmp_path, '[storage]\ndatabase = "/srv/horde.db"\n')
    url = "postgresql://horde@db.example:5432/horde"
    assert load_config(file, environ={"HORDELITE_DATABASE_URL": url}).storage.database == url


def test_environment_variables_of_other_programs_are_ignored() -> None:
    environ = {"HORDELITE_TEST_POSTGRES_URL": "postgresql://x/y", "SERVER_PORT": "1", "PORT": "2"}
    assert load_config(None, environ=environ) == Config()


# Bad values ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[server]\nport = "abc"\n', "server.port"),
        ("[server]\nport = 80.5\n", "server.port"),
        ("[server]\nport = true\n", "server.port"),
        ("[server]\nport = 70000\n", "server.port"),
        ("[server]\nport = -1\n", "server.port"),
        ('[server]\nbackend = "uvloop"\n', "server.backend"),
        ('[server]\ncolour = "red"\n', "server.colour"),
        ("[server]\ngrace_period = -1\n", "server.grace_period"),
        ("[server]\nhost = 127\n", "server.host"),
        ("[server]\nkeep_alive_timeout = 0\n", "server.keep_alive_timeout"),
        ("[server]\nbody_timeout = -1\n", "server.body_timeout"),
        ("[server]\nmax_header_bytes = 100\n", "server.max_header_bytes"),
        ("[server]\nbacklog = 0\n", "server.backlog"),
        ("[cache]\nsize = 1\n", "cache"),
        ("[horde]\njob_ttl = -1\n", "horde.job_ttl"),
        ("[horde]\njob_ttl = 0\n", "horde.job_ttl"),
        ("[horde]\nmax_faults = -1\n", "horde.max_faults"),
        ('[horde]\nallow_anonymous = "maybe"\n', "horde.allow_anonymous"),
        ("[horde]\nallow_anonymous = 2\n", "horde.allow_anonymous"),
        ("[horde]\nmax_pop_wait = 301\n", "horde.max_pop_wait"),
        ('[horde]\nmodel_reference = "/nonexistent/models.json"\n', "horde.model_reference"),
        ('[storage]\ndatabase = "postgres://u@h/db"\n', "storage.database"),
        ('[storage]\ndatabase = "mysql://u@h/db"\n', "storage.database"),
        ('[storage]\ndatabase = "  "\n', "storage.database"),
        ("[storage]\npool_size = 0\n", "storage.pool_size"),
        ("port = 7001\n", "port"),
    ],
)
def test_a_bad_file_value_is_a_ConfigError_naming_the_key(
    tmp_path: Path, text: str, key: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), environ={})
    assert key in str(info.value)


@pytest.mark.parametrize(
    ("variable", "value", "key"),
    [
        ("HORDELITE_SERVER_PORT", "abc", "server.port"),
        ("HORDELITE_SERVER_PORT", "70000", "server.port"),
        ("HORDELITE_SERVER_BACKEND", "curio", "server.backend"),
        ("HORDELITE_HORDE_JOB_TTL", "-5", "horde.job_ttl"),
        ("HORDELITE_HORDE_JOB_TTL", "soon", "horde.job_ttl"),
        ("HORDELITE_HORDE_ALLOW_ANONYMOUS", "maybe", "horde.allow_anonymous"),
        ("HORDELITE_HORDE_MODEL_REFERENCE", "/nonexistent/models.json", "horde.model_reference"),
        ("HORDELITE_DATABASE_URL", "postgres://u@h/db", "storage.database"),
        ("HORDELITE_STORAGE_DATABASE", "mongodb://u@h/db", "storage.database"),
    ],
)
def test_a_bad_environment_value_is_a_ConfigError_naming_the_key(
    variable: str, value: str, key: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={variable: value})
    assert key in str(info.value)


def test_a_bad_environment_value_is_refused_even_when_the_file_is_good(tmp_path: Path) -> None:
    file = write(tmp_path, "[server]\nport = 8000\n")
    with pytest.raises(ConfigError, match=r"server\.port"):
        load_config(file, environ={"HORDELITE_SERVER_PORT": "eighty"})


def test_an_existing_model_reference_file_is_accepted(tmp_path: Path) -> None:
    reference = tmp_path / "models.json"
    reference.write_text('{"m": {"parameters": 1000000000}}', encoding="utf-8")
    config = load_config(None, environ={"HORDELITE_HORDE_MODEL_REFERENCE": str(reference)})
    assert config.horde.model_reference == str(reference)


@pytest.mark.parametrize(
    "url", ["postgresql://u@h:5432/db", "postgresql+psycopg://u@h/db", "./data/h.db"]
)
def test_a_postgresql_url_or_a_file_path_is_accepted_as_the_database(url: str) -> None:
    assert load_config(None, environ={"HORDELITE_DATABASE_URL": url}).storage.database == url


def test_a_named_file_that_does_not_exist_is_a_ConfigError(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match=r"absent\.toml"):
        load_config(missing, environ={})


def test_a_file_that_is_not_toml_is_a_ConfigError(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_config(write(tmp_path, "[server\nport = \n"), environ={})


# The shipped hordelite.toml --------------------------------------------------


def test_the_shipped_file_loads_and_equals_the_defaults() -> None:
    assert load_config(SHIPPED, environ={}) == Config()


def declared_keys() -> Iterator[tuple[str, dataclasses.Field[Any], type[Any]]]:
    """Every key: its section's name, its field, and its type."""
    for section in dataclasses.fields(Config):
        cls = type(getattr(Config(), section.name))
        hints = get_type_hints(cls)
        for field in dataclasses.fields(cls):
            yield section.name, field, hints[field.name]


def test_the_shipped_file_shows_every_key_of_every_section() -> None:
    data = tomllib.loads(SHIPPED.read_text(encoding="utf-8"))
    sections = {f.name for f in dataclasses.fields(Config)}
    assert set(data) == sections
    for name in sections:
        keys = {f.name for section, f, _ in declared_keys() if section == name}
        assert set(data[name]) == keys, name


def reference_rows() -> dict[str, list[str]]:
    """The configuration reference's table rows, by ``section.key``: their cells."""
    rows: dict[str, list[str]] = {}
    section = ""
    for line in REFERENCE.read_text(encoding="utf-8").splitlines():
        heading = re.fullmatch(r"## \[(\w+)\]", line)
        if heading:
            section = heading.group(1)
        row = re.match(r"\| `(\w+)` \|", line)
        if section and row:
            rows[f"{section}.{row.group(1)}"] = [c.strip() for c in line.strip("|").split(" | ")]
    return rows


def test_the_reference_documents_every_key_with_its_default_and_its_declared_bound() -> None:
    rows = reference_rows()
    keys = {f"{section}.{field.name}" for section, field, _ in declared_keys()}
    assert set(rows) == keys
    for section, field, _ in declared_keys():
        name = f"{section}.{field.name}"
        default, bounds_column = rows[name][1], rows[name][-1]
        assert repr(field.default).replace("'", '"').lower() in default.lower(), name
        bounds = bounds_of(field)
        if bounds is not None:
            assert bounds.describe() in bounds_column, name


# Declared bounds -------------------------------------------------------------------
#
# Each key declares its bounds with its field (hordelite.config.bounded); one
# routine enforces them. The cases below are generated from the declarations;
# the hand-written ones after them show, for each kind of bound, that a value
# past it is refused with the key's full name and the bound in the message.

# Keys any value of their type fits: a new key must be bounded or named here.
UNBOUNDED = {
    "server.host",
    "server.h2c",
    "horde.allow_anonymous",
    "front.pace_progress",
    "storage.prepared_statements",
    "signals.ready_when_degraded",
    "images.fetch_private",
    "webhooks.call_private",
    "dashboard.enabled",
    "metrics.enabled",
    "worker.tools_max_temperature",  # negative means "no clamp"; NaN is no number
}


def out_of_bounds(bounds: Bounds, kind: type[Any]) -> Iterator[tuple[Any, str]]:
    """Values just past each bound, with a word the refusal must hold."""
    step = 1 if kind is int else 0.5
    if bounds.ge is not None:
        alone_at_zero = bounds.ge == 0 and bounds.le is None  # "must not be negative"
        yield bounds.ge - step, "negative" if alone_at_zero else f"{bounds.ge}"
    if bounds.gt is not None:
        yield bounds.gt, "positive" if bounds.gt == 0 else f"{bounds.gt}"
    if bounds.le is not None:
        yield bounds.le + step, f"{bounds.le}"
    for word in bounds.one_of:
        yield f"not-{word}", word
    if bounds.max_chars is not None:
        yield "x" * (bounds.max_chars + 1), f"{bounds.max_chars}"


def within_bounds(bounds: Bounds) -> Iterator[Any]:
    """Values exactly at each inclusive bound, and each allowed word."""
    for edge in (bounds.ge, bounds.le):
        if edge is not None:
            yield edge
    if bounds.gt is not None:
        yield bounds.gt + 1
    yield from bounds.one_of
    if bounds.max_chars is not None:
        yield "x" * bounds.max_chars


def case_id(section: str, key: str, value: Any) -> str:
    return f"{section}.{key}={str(value)[:12]}"


REFUSED = [
    pytest.param(section, field.name, value, word, id=case_id(section, field.name, value))
    for section, field, kind in declared_keys()
    if (bounds := bounds_of(field)) is not None
    for value, word in out_of_bounds(bounds, kind)
]
ACCEPTED = [
    pytest.param(section, field.name, value, id=case_id(section, field.name, value))
    for section, field, _ in declared_keys()
    if (bounds := bounds_of(field)) is not None
    for value in within_bounds(bounds)
]


def test_every_key_is_bounded_or_known_to_need_no_bound() -> None:
    for section, field, _ in declared_keys():
        name = f"{section}.{field.name}"
        assert (bounds_of(field) is None) == (name in UNBOUNDED), name


def test_the_generated_cases_cover_every_declared_bound() -> None:
    # Not vacuous: each numeric bound, word and length yields its case.
    expected = 0
    for _, field, _ in declared_keys():
        b = bounds_of(field)
        if b is not None:
            expected += sum(x is not None for x in (b.ge, b.gt, b.le, b.max_chars))
            expected += len(b.one_of)
    assert len(REFUSED) == expected
    assert expected > 40


@pytest.mark.parametrize(("section", "key", "value", "word"), REFUSED)
def test_a_value_past_a_declared_bound_is_refused_naming_key_and_bound(
    section: str, key: str, value: Any, word: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Config().replace(**{section: {key: value}})
    message = str(info.value)
    assert message.startswith(f"{section}.{key}: "), message
    assert word in message, message


@pytest.mark.parametrize(("section", "key", "value"), ACCEPTED)
def test_a_value_at_a_declared_bound_is_accepted(section: str, key: str, value: Any) -> None:
    config = Config().replace(**{section: {key: value}})
    assert getattr(getattr(config, section), key) == value


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        # ge and le: both ends in the message
        ("server", {"port": 65536}, "server.port: must be 0 to 65535, got 65536"),
        ("storage", {"pool_size": 0}, "storage.pool_size: must be 1 to 64, got 0"),
        ("horde", {"max_pop_wait": 300.5}, "horde.max_pop_wait: must be 0 to 300, got 300.5"),
        # ge alone
        ("server", {"max_body_bytes": 1023}, "server.max_body_bytes: must be at least 1024"),
        ("front", {"max_open_calls": 0}, "front.max_open_calls: must be at least 1, got 0"),
        ("horde", {"max_faults": -1}, "horde.max_faults: must not be negative, got -1"),
        ("worker", {"grace_period": -0.1}, "worker.grace_period: must not be negative"),
        # gt
        ("horde", {"job_ttl": 0}, "horde.job_ttl: must be positive, got 0.0"),
        ("server", {"body_timeout": -1}, "server.body_timeout: must be positive"),
        # words
        ("server", {"backend": "uvloop"}, "server.backend: must be one of trio, asyncio"),
        ("storage", {"executor": "fork"}, "storage.executor: must be one of inline, threads"),
        # length
        ("worker", {"name": "n" * 256}, "worker.name: must be at most 255 characters"),
        ("worker", {"key": "k" * 256}, "worker.key: must be at most 255 characters"),
        # a rule of its own
        ("worker", {"features": "telepathy"}, "worker.features: unknown feature 'telepathy'"),
        ("worker", {"horde": "ftp://h"}, "worker.horde: must be an http:// or https:// URL"),
        ("storage", {"database": ""}, "storage.database: must not be empty"),
        # types
        (
            "worker",
            {"tools_max_temperature": "nan"},
            "worker.tools_max_temperature: expected a number",
        ),
        ("horde", {"job_ttl": float("nan")}, "horde.job_ttl: expected a number"),
        ("front", {"max_open_calls": 1.5}, "front.max_open_calls: expected an integer"),
        ("front", {"pace_progress": "maybe"}, "front.pace_progress: expected true or false"),
        ("server", {"host": 7}, "server.host: expected a string"),
        # two keys
        ("worker", {"context": 256, "max_length": 512}, "worker.max_length: 512 does not fit"),
        (
            "worker",
            {"backoff_max": 0.5},
            "worker.backoff_max: must be at least worker.backoff_initial",
        ),
    ],
)
def test_each_kind_of_bound_is_refused_with_its_message(
    section: str, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Config().replace(**{section: values})
    assert str(info.value).startswith(message), str(info.value)


def test_a_metrics_port_that_is_the_server_port_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"metrics\.port: 7001 is server\.port"):
        Config().replace(metrics={"port": 7001})
    assert Config().replace(metrics={"port": 9100}).metrics.port == 9100


@pytest.mark.parametrize(
    "value", ["https://a.example/", "https://a.example/path", "a.example", "*, https://a.example"]
)
def test_cors_origins_other_than_star_or_a_list_of_origins_are_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^server\.cors_origins: must be \* or"):
        Config().replace(server={"cors_origins": value})


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        ("*", None),
        (" * ", None),
        ("", frozenset()),
        (
            "https://A.example, http://127.0.0.1:8080",
            {"https://a.example", "http://127.0.0.1:8080"},
        ),
    ],
)
def test_cors_origins_are_star_or_a_list_compared_ignoring_case(
    value: str, allowed: frozenset[str] | None
) -> None:
    assert Config().replace(server={"cors_origins": value}).server.allowed_origins == allowed
