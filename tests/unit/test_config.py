"""hordelite.config.load_config: file, environment, validation.

Every test passes an explicit ``environ`` so the shell running pytest cannot
change the answer.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from hordelite.config import Config, HordeConfig, ServerConfig, StorageConfig, load_config
from hordelite.errors import ConfigError

SHIPPED = Path(__file__).resolve().parents[2] / "hordelite.toml"


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


def test_the_shipped_file_shows_every_key_of_every_section() -> None:
    data = tomllib.loads(SHIPPED.read_text(encoding="utf-8"))
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    assert set(data) == set(sections)
    for name, cls in (("server", ServerConfig), ("storage", StorageConfig), ("horde", HordeConfig)):
        assert set(data[name]) == {f.name for f in dataclasses.fields(cls)}, name
