"""The Containerfile, compose.yaml and the systemd units in deploy/systemd
parse, run the documented commands, and set only variables hordelite reads.

No container engine runs them here (tests/integration/test_packaging_steps.py
runs the image's command outside one); see docs/how-to/deploy.md.
"""

from __future__ import annotations

import configparser
import dataclasses
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

# PyYAML comes with the test extras (gguf and moto[server] need it).
import yaml

from hordelite.config import (
    Config,
    ServerConfig,
    WorkerConfig,
    load_config,
    processes_problem,
)

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "Containerfile"
COMPOSE = ROOT / "compose.yaml"
SYSTEMD = ROOT / "deploy" / "systemd"
DEPLOY_DOC = ROOT / "docs" / "how-to" / "deploy.md"

# A stand-in for what compose takes from the shell or .env (`${NAME:-}`),
# and for a value an example leaves empty (the worker's key).
SAMPLE = "s4mple-v4lue"


# Reading the files -------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile, continuation lines joined."""
    found = []
    logical = ""
    for line in text.splitlines():
        # Comment lines go, also inside a continued instruction, as Docker drops them.
        if line.lstrip().startswith("#") or (not logical and not line.strip()):
            continue
        logical += line.rstrip()
        if logical.endswith("\\"):
            logical = logical[:-1] + " "
            continue
        word, _, rest = logical.strip().partition(" ")
        found.append((word.upper(), rest.strip()))
        logical = ""
    assert not logical, f"the Containerfile ends inside an instruction: {logical!r}"
    return found


def containerfile() -> list[tuple[str, str]]:
    return instructions(CONTAINERFILE.read_text(encoding="utf-8"))


def container_env() -> dict[str, str]:
    env = {}
    for word, rest in containerfile():
        if word == "ENV":
            for item in shlex.split(rest):
                name, sep, value = item.partition("=")
                assert sep, f"ENV {item!r}: write NAME=VALUE"
                env[name] = value
    return env


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def interpolated(value: str) -> str:
    """What compose makes of ``${NAME}`` and ``${NAME:-default}``: the default
    when there is one, else the sample."""
    return re.sub(
        r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or SAMPLE, value
    )


def service_env(name: str) -> dict[str, str]:
    environment = compose()["services"][name].get("environment", {})
    assert isinstance(environment, dict), f"{name}: write environment as a mapping"
    return {key: interpolated(str(value)) for key, value in environment.items()}


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd's keys are case-sensitive
    parser.read_string((SYSTEMD / name).read_text(encoding="utf-8"))
    return parser


def example_env(name: str) -> dict[str, str]:
    """NAME=VALUE lines of an EnvironmentFile example, commented-out ones
    too: they are what an operator uncomments."""
    env = {}
    for line in (SYSTEMD / name).read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"#?(HORDELITE_[A-Z0-9_]+)=(.*)", line.strip())
        if match:
            env[match.group(1)] = match.group(2) or SAMPLE
    return env


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(s|min)?", value.strip())
    assert match, f"a duration in seconds or minutes, got {value!r}"
    return float(match.group(1)) * (60 if match.group(2) == "min" else 1)


def known_variables() -> set[str]:
    names = {"HORDELITE_DATABASE_URL"}
    for section, keys in dataclasses.asdict(Config()).items():
        names.update(f"HORDELITE_{section}_{key}".upper() for key in keys)
    return names


# Every HORDELITE_* variable the files set is read by hordelite --------------------


def settings() -> list[tuple[str, str, str]]:
    found = [("Containerfile", k, v) for k, v in container_env().items()]
    for service in ("hordelite", "worker"):
        found += [(f"compose.yaml {service}", k, v) for k, v in service_env(service).items()]
    for example in ("env.example", "worker.env.example"):
        found += [(f"deploy/systemd/{example}", k, v) for k, v in example_env(example).items()]
    return [s for s in found if s[1].startswith("HORDELITE_")]


def changed(config: Config) -> dict[str, Any]:
    """The keys of ``config`` that differ from the defaults, as section.key."""
    default = Config()
    return {
        f"{section.name}.{key}": value
        for section in dataclasses.fields(Config)
        for key, value in dataclasses.asdict(getattr(config, section.name)).items()
        if value != dataclasses.asdict(getattr(default, section.name))[key]
    }


@pytest.mark.parametrize(
    ("where", "name", "value"), [pytest.param(*s, id=f"{s[0]}: {s[1]}") for s in settings()]
)
def test_each_variable_set_is_a_configuration_key_read_with_that_value(
    where: str, name: str, value: str
) -> None:
    # Proves the variable is read: it moves exactly one key off its default,
    # to its value. A misspelt name moves none (hordelite ignores unknown
    # HORDELITE_ variables), and so does an example restating a default.
    moved = changed(load_config(None, environ={name: value}))
    assert len(moved) == 1, f"{where}: {name}={value!r} changes {moved or 'no key'}"
    ((key, got),) = moved.items()
    assert got == type(got)(value), f"{where}: {name}={value!r} sets {key} to {got!r}"


def test_the_settings_cover_every_file() -> None:
    # The parametrized test above must not pass by finding nothing.
    wheres = {where.split()[0] for where, _, _ in settings()}
    assert wheres == {
        "Containerfile",
        "compose.yaml",
        "deploy/systemd/env.example",
        "deploy/systemd/worker.env.example",
    }


@pytest.mark.parametrize(
    "path",
    [
        CONTAINERFILE,
        COMPOSE,
        DEPLOY_DOC,
        *sorted(SYSTEMD.iterdir()),
    ],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_variable_named_is_one_hordelite_reads(path: Path) -> None:
    # Also the ones only mentioned in comments and the how-to.
    named = set(re.findall(r"\bHORDELITE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    assert named - known_variables() == set()


# Containerfile ----------------------------------------------------------------------


def test_the_containerfile_builds_on_a_base_it_names_and_copies_files_that_exist() -> None:
    steps = containerfile()
    # The base is an argument: Debian's Python 3.11 from deploy/container/debian-base
    # by default, docker.io/library/python:3.11-slim where Docker Hub is reachable.
    assert steps[:2] == [("ARG", "BASE=localhost/hordelite-base:bookworm"), ("FROM", "${BASE}")]
    assert (
        "localhost/hordelite-base:bookworm" in (ROOT / "deploy/container/debian-base").read_text()
    )
    copies = [shlex.split(rest) for word, rest in steps if word == "COPY"]
    assert copies, "the package is installed from the copied source"
    for *sources, _destination in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"


def test_the_containerfile_installs_the_locked_versions_before_the_source() -> None:
    steps = containerfile()
    copied = [
        (i, source) for i, (w, r) in enumerate(steps) if w == "COPY" for source in shlex.split(r)
    ]
    runs = [(i, r) for i, (w, r) in enumerate(steps) if w == "RUN"]
    (locked,) = [i for i, r in runs if re.search(r"\bpip install -c /src/constraints\.txt\b", r)]
    (own,) = [i for i, r in runs if re.search(r"\bpip install --no-deps\b.* /src\b", r)]
    # The dependencies' layer depends on pyproject.toml and the lock alone,
    # so a change to the source reuses it.
    assert {s for i, s in copied if i < locked} == {"pyproject.toml", "constraints.txt", "/src/"}
    assert locked < min(i for i, s in copied if s == "hordelite") < own


def test_the_build_context_holds_what_the_containerfile_copies() -> None:
    # .dockerignore excludes everything else (a .venv, databases, .git).
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*"
    kept = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    for word, rest in containerfile():
        if word == "COPY":
            *sources, _ = shlex.split(rest)
            assert set(sources) <= kept, f"COPY {sources}: excluded by .dockerignore"


def test_the_container_serves_as_a_user_that_is_not_root() -> None:
    steps = containerfile()
    users = [i for i, (word, _) in enumerate(steps) if word == "USER"]
    assert users, "no USER: the server would run as root"
    last = users[-1]
    assert steps[last][1].split(":")[0] not in {"root", "0"}
    # Nothing runs as root after the switch, and the server runs after it.
    assert all(word != "USER" for word, _ in steps[last + 1 :])
    assert [i for i, (word, _) in enumerate(steps) if word == "CMD"][-1] > last


def test_the_container_listens_on_7001_on_every_address() -> None:
    steps = dict(containerfile())
    assert "7001" in steps["EXPOSE"].split()
    assert json.loads(steps["CMD"]) == ["hordelite", "serve", "--host", "0.0.0.0"]


def test_the_container_keeps_its_database_and_blobs_in_the_volume() -> None:
    steps = containerfile()
    volumes = [json.loads(r) if r.startswith("[") else r.split() for w, r in steps if w == "VOLUME"]
    assert ["/data"] in volumes
    config = load_config(None, environ=container_env())
    assert config.storage.database == "/data/hordelite.db"
    assert config.blobs.directory == "/data/hordelite-blobs"


def test_the_healthcheck_asks_a_health_route_with_python() -> None:
    (check,) = [rest for word, rest in containerfile() if word == "HEALTHCHECK"]
    options, _, command = check.partition("CMD ")
    assert command, "HEALTHCHECK [options] CMD ..."
    argv = json.loads(command)
    assert argv[:2] == ["python", "-c"], "python:3.11-slim has no curl"
    assert re.search(r"/(readyz|healthz)\b", argv[2])
    compile(argv[2], "HEALTHCHECK", "exec")  # the probe itself is valid Python
    assert "--timeout=" in options


# compose.yaml -------------------------------------------------------------------------


def test_compose_runs_hordelite_on_postgres_15_and_redis_7() -> None:
    services = compose()["services"]
    assert services["postgres"]["image"] == "docker.io/library/postgres:15"
    assert services["redis"]["image"] == "docker.io/library/redis:7"
    config = load_config(None, environ=service_env("hordelite"))
    assert config.storage.database.startswith("postgresql://")
    assert "@postgres:" in config.storage.database
    assert config.signals.url.startswith("redis://redis:")
    assert config.server.processes == 2
    assert processes_problem(config) is None  # `serve` would not refuse to start


def test_compose_names_each_image_in_full() -> None:
    # podman resolves no short name without a list of registries to search;
    # a registry host (or localhost) first reads the same under docker.
    for name, service in compose()["services"].items():
        registry = service["image"].split("/")[0]
        assert registry == "localhost" or "." in registry, f"{name}: {service['image']}"


def test_the_compose_secrets_file_is_kept_out_of_git() -> None:
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert ".env" in ignored
    example = (ROOT / ".env.example").read_text(encoding="utf-8")
    assert re.search(r"^POSTGRES_PASSWORD=$", example, re.MULTILINE)


def test_the_compose_commands_do_not_rely_on_profiles_alone() -> None:
    # podman-compose 1.0 ignores profiles: a bare `up` would start the worker
    # before its key exists, so the documented commands name the services.
    for path in (COMPOSE, DEPLOY_DOC):
        ups = re.findall(r"compose (?:--profile \S+ )?up -d([^\n#]*)", path.read_text())
        assert ups, path
        for services in ups:
            assert services.split(), f"{path.name}: `up -d` names no service"


def test_the_how_to_builds_with_podman_in_docker_format() -> None:
    # podman's default format (OCI) drops the HEALTHCHECK without a word.
    text = DEPLOY_DOC.read_text(encoding="utf-8")
    builds = re.findall(r"^(?:sudo )?podman build .*$", text, re.MULTILINE)
    assert builds
    assert all("--format docker" in b for b in builds), builds
    assert "BUILDAH_FORMAT=docker" in text  # for podman-compose's builds


def test_compose_keeps_the_blobs_in_a_named_volume() -> None:
    document = compose()
    hordelite = document["services"]["hordelite"]
    directory = load_config(None, environ=service_env("hordelite")).blobs.directory
    mounts = [str(m).split(":") for m in hordelite["volumes"]]
    holding = [
        m for m in mounts if directory == m[1] or directory.startswith(m[1].rstrip("/") + "/")
    ]
    assert holding, f"blobs.directory {directory} is in no volume of the service"
    assert holding[0][0] in document["volumes"], "a named volume, kept across containers"


def test_compose_starts_each_service_after_its_dependencies_are_healthy() -> None:
    services = compose()["services"]
    has_check = {
        name: bool(s.get("healthcheck", {}).get("test")) and not s["healthcheck"].get("disable")
        for name, s in services.items()
    }
    # hordelite's health check is the image's HEALTHCHECK.
    has_check["hordelite"] = "healthcheck" not in services["hordelite"] and any(
        word == "HEALTHCHECK" for word, _ in containerfile()
    )
    for name, expected in (("hordelite", {"postgres", "redis"}), ("worker", {"hordelite"})):
        depends = services[name]["depends_on"]
        assert set(depends) == expected
        for dependency in depends:
            assert depends[dependency]["condition"] == "service_healthy"
            assert has_check[dependency], f"{dependency} has no health check to wait for"


def test_the_compose_worker_takes_its_key_from_the_environment() -> None:
    worker = compose()["services"]["worker"]
    command = worker["command"]
    assert command[:2] == ["hordelite", "worker"]
    assert command[command.index("--backend") + 1] == "fake"
    assert not any(arg.startswith("--key") for arg in command), "ps shows the command line"
    assert worker["environment"]["HORDELITE_WORKER_KEY"].startswith("${HORDELITE_WORKER_KEY")
    config = load_config(None, environ=service_env("worker")).worker
    assert (config.horde, config.key, config.name) == (
        "http://hordelite:7001",
        SAMPLE,
        "example-worker",
    )


def test_compose_gives_stops_more_time_than_the_grace_periods() -> None:
    services = compose()["services"]
    assert seconds(services["hordelite"]["stop_grace_period"]) > ServerConfig().grace_period + 5
    assert seconds(services["worker"]["stop_grace_period"]) > WorkerConfig().grace_period


# systemd units --------------------------------------------------------------------------


def exec_start(name: str) -> list[str]:
    return shlex.split(unit(name)["Service"]["ExecStart"])


def test_the_server_unit_runs_hordelite_serve_in_var_lib_hordelite() -> None:
    argv = exec_start("hordelite.service")
    assert Path(argv[0]).name == "hordelite"
    assert argv[1] == "serve"
    assert Path(argv[0]).is_absolute()
    assert not any(arg.startswith("--key") for arg in argv)
    service = unit("hordelite.service")["Service"]
    assert service["User"] == "hordelite"
    assert service["WorkingDirectory"] == "/var/lib/hordelite"
    assert service["EnvironmentFile"] == "-/etc/hordelite/env"
    assert service["Restart"] == "on-failure"
    assert seconds(service["TimeoutStopSec"]) > ServerConfig().grace_period + 5


def test_the_server_unit_writes_only_its_state_directory() -> None:
    service = unit("hordelite.service")["Service"]
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert service["ReadWritePaths"].split() == ["/var/lib/hordelite"]
    # The default database and blob folder are relative to the working
    # directory, so they land in the one writable path.
    assert Config().storage.database.startswith("./")


def test_the_worker_unit_runs_hordelite_worker_with_its_key_from_a_file() -> None:
    argv = exec_start("hordelite-worker.service")
    assert Path(argv[0]).name == "hordelite"
    assert argv[1] == "worker"
    assert Path(argv[0]).is_absolute()
    assert not any(arg.startswith("--key") for arg in argv), "ps shows the command line"
    service = unit("hordelite-worker.service")["Service"]
    assert "HORDELITE_WORKER_KEY" not in service.get("Environment", "")
    assert service["EnvironmentFile"].lstrip("-") == "/etc/hordelite/worker.env"
    assert "HORDELITE_WORKER_KEY" in example_env("worker.env.example")
    assert seconds(service["TimeoutStopSec"]) > WorkerConfig().grace_period
    assert service["NoNewPrivileges"] == "yes"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_accepts_the_units() -> None:
    done = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            *(str(SYSTEMD / u) for u in ("hordelite.service", "hordelite-worker.service")),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    # The one complaint expected: hordelite is not installed at the path of
    # ExecStart on the machine running the tests.
    complaints = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and "/opt/hordelite/bin/hordelite is not executable" not in line
    ]
    assert not complaints, "\n".join(complaints)
