"""The ``hordelite`` command: main([...]) in-process, and one real ``serve`` process."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO

import anyio
import httpx
import pytest
from sqlalchemy import select, update

from hordelite import __version__
from hordelite.cli import main
from hordelite.cli._main import banner
from hordelite.config import Config
from hordelite.contract.audit_query import AuditQuery
from hordelite.horde.service import Horde, hash_key
from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.storage.migrations import LATEST, current_version
from hordelite.storage.schema import RETIRED_NAME_KEY, users
from hordelite.storage.transaction import Tx
from hordelite.testing import FakeTextWorker, open_horde
from hordelite.worker._horde import horde_base_url
from tests.unit._cli_isolation import isolated  # noqa: F401 (autouse)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database setting with no hordelite database behind it yet: a SQLite
    file that does not exist, or an empty PostgreSQL schema."""
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_schema_url")  # type: ignore[no-any-return]
    return str(tmp_path / "cli.db")


@pytest.fixture
def database(empty: str, capsys: pytest.CaptureFixture[str]) -> str:
    """A horde's database, created the way an operator does (db upgrade)."""
    assert main(["db", "upgrade", "--database", empty]) == 0
    capsys.readouterr()
    return empty


def created_key(output: str) -> tuple[str, int]:
    """The API key and user id that ``keys create`` printed."""
    key_lines = [line for line in output.splitlines() if "API key" in line]
    assert len(key_lines) == 1, output
    key = key_lines[0].rsplit(":", 1)[1].strip()
    match = re.search(r"alice#(\d+)", output)
    assert match, output
    return key, int(match.group(1))


def create_alice(database: str, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[str, int]:
    """``keys create alice`` with ``flags`` (``"--kudos", "9"``), as a test's
    set-up: the key and user id it printed."""
    assert main(["keys", "create", "alice", *flags, "--database", database]) == 0
    return created_key(capsys.readouterr().out)


def authenticates(database: str, key: str) -> queries.UserRecord:
    db = Database(database, 1)
    try:
        rules = Horde(Config(), db).rules
        return db.run_sync(queries.user_by_key, False, hash_key(key), rules)
    finally:
        db.dispose()


def stored_user(database: str, user_id: int) -> dict[str, object]:
    """The user's row as stored."""
    db = Database(database, 1)
    try:
        return db.run_sync(
            lambda conn: dict(
                conn.execute(select(users).where(users.c.id == user_id)).mappings().one()
            ),
            False,
        )
    finally:
        db.dispose()


# keys create -----------------------------------------------------------------


def test_keys_create_prints_a_new_key_exactly_once(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", "alice", "--kudos", "50", "--database", database]) == 0
    out, _ = capsys.readouterr()
    key, _ = created_key(out)
    assert len(key) >= 16
    assert out.count(key) == 1


def test_a_created_key_is_stored_only_as_its_hash(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", "alice", "--database", database]) == 0
    key, user_id = created_key(capsys.readouterr().out)
    assert authenticates(database, key).id == user_id
    row = stored_user(database, user_id)
    assert row["key_hash"] == hash_key(key)
    assert key not in row.values()


@contextlib.asynccontextmanager
async def client_of(database: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a horde served on ``database``, which the CLI wrote."""
    async with (
        open_horde(database=database) as horde,
        httpx.AsyncClient(base_url=horde.url) as client,
    ):
        yield client


@pytest.mark.anyio
async def test_a_created_key_authenticates_on_find_user_with_its_kudos_and_name(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", "alice", "--kudos", "50", "--database", database]) == 0
    key, user_id = created_key(capsys.readouterr().out)
    async with client_of(database) as client:
        r = await client.get("/api/v2/find_user", headers={"apikey": key})
        assert r.status_code == 200, r.text
        user = r.json()
        assert user["username"] == f"alice#{user_id}"
        assert user["id"] == user_id
        assert user["kudos"] == 50
        # The control: a key that was never printed finds nobody.
        wrong = await client.get("/api/v2/find_user", headers={"apikey": key + "x"})
        assert wrong.status_code in (401, 404), wrong.text


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """main(argv): its exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_refusal(code: int, err: str, *words: str) -> None:
    assert code != 0
    assert err.endswith("\n"), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err


def shown(database: str) -> str:
    """How the CLI names a database: an absolute path, a URL without its password."""
    return database if "://" in database else str(Path(database).absolute())


def test_keys_create_names_the_database_it_wrote_to(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, "keys", "create", "alice", "--database", database)
    assert code == 0
    assert f"database: {shown(database)}" in out.splitlines()


def test_a_relative_database_path_is_named_absolute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "upgrade", "--database", "rel.db"]) == 0
    assert str(tmp_path / "rel.db") in capsys.readouterr().out
    code, out, _ = cli(capsys, "keys", "create", "alice", "--database", "rel.db")
    assert code == 0
    assert f"database: {tmp_path / 'rel.db'}" in out.splitlines()


def test_keys_create_refuses_to_create_a_database_in_one_line_with_the_way_out(
    empty: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "keys", "create", "alice", "--database", empty)
    assert_one_line_refusal(
        code, err, shown(empty), "--database", "HORDELITE_DATABASE_URL", "db upgrade"
    )
    assert "API key" not in out
    if "://" not in empty:
        assert not Path(empty).exists()
    assert schema_version(empty) == 0


def test_run_from_another_directory_keys_create_makes_no_new_hordelite_db(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "horde"
    home.mkdir()
    monkeypatch.chdir(home)
    assert main(["db", "upgrade"]) == 0  # ./hordelite.db, the default
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    code, _, err = cli(capsys, "keys", "create", "alice")
    assert_one_line_refusal(code, err, str(elsewhere / "hordelite.db"), "default")
    assert not (elsewhere / "hordelite.db").exists()
    # The environment names the horde's database: then it works from anywhere.
    monkeypatch.setenv("HORDELITE_DATABASE_URL", str(home / "hordelite.db"))
    code, out, _ = cli(capsys, "keys", "create", "alice")
    assert code == 0
    assert f"database: {home / 'hordelite.db'}" in out.splitlines()


@pytest.mark.parametrize(
    "again",
    ["alice", "ALICE", " alice ", "\uff41\uff4c\uff49\uff43\uff45", "ali\u034fce"],
    ids=["same", "case", "spaces", "full-width", "ignorable"],
)
def test_a_name_created_twice_is_refused_in_one_line_and_nothing_is_created(
    database: str, capsys: pytest.CaptureFixture[str], again: str
) -> None:
    _, user_id = create_alice(database, capsys)
    code, out, err = cli(capsys, "keys", "create", again, "--database", database)
    assert_one_line_refusal(code, err, f"alice#{user_id}", "keys rotate")
    assert "API key" not in out
    code, out, _ = cli(capsys, "keys", "list", "--database", database)
    assert code == 0
    assert [line.split()[1] for line in out.splitlines()[2:]] == ["Anonymous#0", f"alice#{user_id}"]


@pytest.mark.parametrize("name", ["ali\u200bce", "\u202egnp.exe", "a\u2028b"])
def test_a_name_with_a_format_control_or_separator_is_refused_in_one_line(
    database: str, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    code, out, err = cli(capsys, "keys", "create", name, "--database", database)
    assert_one_line_refusal(code, err, "a user name must not hold", "U+")
    assert "API key" not in out


def test_keys_list_shows_ids_names_kudos_and_whether_each_key_is_active(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", "alice", "--kudos", "50", "--database", database]) == 0
    assert main(["keys", "create", "bob", "--admin", "--database", database]) == 0
    capsys.readouterr()
    assert main(["keys", "revoke", "bob", "--database", database]) == 0
    capsys.readouterr()
    code, out, _ = cli(capsys, "keys", "list", "--database", database)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"database: {shown(database)}"
    assert lines[1].split() == ["ID", "USER", "KUDOS", "KEY", "ROLE", "WORKERS"]
    rows = {line.split()[1]: line.split() for line in lines[2:]}
    assert rows["Anonymous#0"][:4] == ["0", "Anonymous#0", "0", "public"]
    alice = next(r for name, r in rows.items() if name.startswith("alice#"))
    bob = next(r for name, r in rows.items() if name.startswith("bob#"))
    assert alice[2:4] == ["50", "active"]
    assert bob[2:5] == ["0", "revoked", "admin"]
    assert alice[0] == alice[1].split("#")[1]


async def assert_invalid_key(client: httpx.AsyncClient, key: str) -> None:
    """A route acting for a user refuses the key: 401 InvalidAPIKey."""
    r = await client.post(
        "/api/v2/generate/text/async", headers={"apikey": key}, json={"prompt": "Hello"}
    )
    assert r.status_code == 401, r.text
    assert r.json()["rc"] == "InvalidAPIKey"


@pytest.mark.anyio
async def test_a_revoked_key_is_refused_401_invalid_api_key_and_other_keys_still_work(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    alice, alice_id = create_alice(database, capsys)
    assert main(["keys", "create", "bob", "--database", database]) == 0
    bob = capsys.readouterr().out.splitlines()[-1].rsplit(":", 1)[1].strip()
    code, out, _ = cli(capsys, "keys", "revoke", f"alice#{alice_id}", "--database", database)
    assert code == 0
    assert f"alice#{alice_id}" in out
    assert "revoked" in out
    assert alice not in out
    async with client_of(database) as client:
        await assert_invalid_key(client, alice)
        assert (await client.get("/api/v2/find_user", headers={"apikey": bob})).status_code == 200


@pytest.mark.anyio
async def test_rotate_prints_a_new_key_once_which_authenticates_and_the_old_one_stops(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    old, user_id = create_alice(database, capsys, "--kudos", "9")
    assert main(["keys", "revoke", "alice", "--database", database]) == 0
    capsys.readouterr()
    # Rotating a revoked key gives the user a working key again.
    code, out, _ = cli(capsys, "keys", "rotate", "alice", "--database", database)
    assert code == 0
    new, same_id = created_key(out)
    assert same_id == user_id
    assert new != old
    assert out.count(new) == 1
    async with client_of(database) as client:
        r = await client.get("/api/v2/find_user", headers={"apikey": new})
        assert r.status_code == 200, r.text
        assert (r.json()["id"], r.json()["kudos"]) == (user_id, 9)
        await assert_invalid_key(client, old)


def test_the_anonymous_key_cannot_be_revoked_or_rotated(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for action in ("revoke", "rotate"):
        code, out, err = cli(capsys, "keys", action, "0", "--database", database)
        assert_one_line_refusal(code, err, "anonymous", "allow_anonymous")
        assert "API key" not in out
    assert authenticates(database, "0000000000").id == 0


@pytest.mark.parametrize("how", ["name", "id", "handle"])
def test_kudos_grant_adds_kudos_to_a_user_given_by_name_id_or_handle(
    database: str, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    key, user_id = create_alice(database, capsys, "--kudos", "5")
    user = {"name": "Alice", "id": str(user_id), "handle": f"alice#{user_id}"}[how]
    code, out, _ = cli(capsys, "kudos", "grant", user, "10", "--database", database)
    assert code == 0
    assert f"database: {shown(database)}" in out
    assert f"alice#{user_id}" in out
    assert "5 -> 15" in out
    code, _, _ = cli(capsys, "kudos", "grant", user, "-2.5", "--database", database)
    assert code == 0
    assert authenticates(database, key).kudos == 12.5


def test_kudos_grant_refuses_an_unknown_or_ambiguous_user_and_a_non_number(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Names were not unique before: a database may hold two users named
    # alike, the later one with a retired key as the migration leaves it.
    db = Database(database, 1)
    try:
        ids = [
            db.run_sync(queries.create_user, True, name, hash_key(f"k{i}"), 1.0, False, False, 0.0)
            for i, name in enumerate(("alice", "alice-to-be"))
        ]

        def as_migrated(conn: Tx) -> None:
            conn.execute(
                update(users)
                .where(users.c.id == ids[1])
                .values(username="ALICE", name_key=f"{RETIRED_NAME_KEY}{ids[1]}")
            )

        db.run_sync(as_migrated, True)
    finally:
        db.dispose()
    cases = [
        (["nobody", "5"], ["nobody", "keys list"]),
        (["alice", "5"], [f"alice#{ids[0]}", f"ALICE#{ids[1]}", "NAME#ID"]),
        ([f"bob#{ids[0]}", "5"], [f"bob#{ids[0]}"]),
        (["999", "5"], ["999"]),
        (["alice#" + str(ids[0]), "nan"], ["nan"]),
        (["alice#" + str(ids[0]), "inf"], ["inf"]),
    ]
    for args, words in cases:
        code, _, err = cli(capsys, "kudos", "grant", *args, "--database", database)
        assert_one_line_refusal(code, err, *words)
    for user_id in ids:
        assert authenticates(database, f"k{user_id - ids[0]}").kudos == 1.0


@pytest.mark.anyio
async def test_workers_list_shows_every_worker_with_owner_and_whether_it_is_online(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    key, user_id = create_alice(database, capsys)
    code, out, _ = cli(capsys, "workers", "list", "--database", database)
    assert code == 0
    assert out.splitlines() == [
        f"database: {shown(database)}",
        "no workers yet: a worker appears with its first pop",
    ]
    async with (
        open_horde(database=database) as horde,
        FakeTextWorker(horde.url, key, name="w1", models=["m1", "m2"]) as w1,
        FakeTextWorker(horde.url, key, name="w2") as w2,
        httpx.AsyncClient(base_url=horde.url) as client,
    ):
        await w1.pop()
        await w2.pop()
        w2_id = (await client.get("/api/v2/workers/name/w2")).json()["id"]
        r = await client.put(
            f"/api/v2/workers/{w2_id}", headers={"apikey": key}, json={"online": False}
        )
        assert r.status_code == 200, r.text
        code, out, _ = cli(capsys, "workers", "list", "--database", database)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"database: {shown(database)}"
    assert lines[1].split()[:4] == ["NAME", "ID", "OWNER", "STATE"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"w1", "w2"}
    assert rows["w1"][2:4] == [f"alice#{user_id}", "online"]
    assert "m1,m2" in rows["w1"]
    assert rows["w2"][1:4] == [w2_id, f"alice#{user_id}", "offline"]


@pytest.mark.parametrize(
    "argv",
    [
        ["keys"],
        ["keys", "create"],
        ["kudos", "grant", "alice"],
        ["kudos", "grant", "alice", "many"],
        ["workers", "remove"],
        ["keys", "create", "a#b", "--database", "DB"],
        ["keys", "create", "   ", "--database", "DB"],
        ["keys", "create", "x" * 101, "--database", "DB"],
        ["workers", "list", "--database", "NOFILE"],
        ["keys", "list", "--database", "postgresql://nobody:pw@127.0.0.1:1/none"],
    ],
)
def test_a_refusal_is_one_line_on_stderr_with_a_non_zero_exit_code(
    argv: list[str], database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        database if a == "DB" else str(tmp_path / "absent.db") if a == "NOFILE" else a for a in argv
    ]
    code, _, err = cli(capsys, *argv)
    assert_one_line_refusal(code, err)
    assert ":pw@" not in err


@pytest.mark.postgres
def test_a_postgresql_password_is_never_printed(
    postgres_schema_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = postgres_schema_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
    assert "s3cret" in url
    for argv in (
        ["keys", "list", "--database", url],  # refused: no database yet
        ["db", "upgrade", "--database", url],
        ["keys", "create", "alice", "--database", url],
        ["keys", "list", "--database", url],
        ["workers", "list", "--database", url],
    ):
        _, out, err = cli(capsys, *argv)
        assert "s3cret" not in out + err
        assert "postgres:***@" in out + err


# db upgrade ------------------------------------------------------------------


def test_db_upgrade_creates_the_schema_on_a_new_database(
    empty: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "upgrade", "--database", empty]) == 0
    assert schema_version(empty) == LATEST
    assert f"0 -> {LATEST}" in capsys.readouterr().out


def schema_version(database: str) -> int:
    db = Database(database, 1)
    try:
        return db.run_sync(current_version, False)
    finally:
        db.dispose()


def test_db_upgrade_is_idempotent_and_keeps_the_data(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "upgrade", "--database", database]) == 0
    key, user_id = create_alice(database, capsys, "--kudos", "7")
    assert main(["db", "upgrade", "--database", database]) == 0
    assert f"{LATEST} -> {LATEST}" in capsys.readouterr().out
    db = Database(database, 1)
    try:
        assert db.run_sync(current_version, False) == LATEST
    finally:
        db.dispose()
    user = authenticates(database, key)
    assert (user.id, user.kudos) == (user_id, 7)


# A bad configuration stops serve before it starts ------------------------------


def assert_not_served(
    capsys: pytest.CaptureFixture[str], argv: list[str], key: str, db: Path
) -> None:
    """``main(argv)`` returns 2 naming ``key``, serves nothing and creates no ``db``."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert key in err
    assert "serving at" not in out
    assert not db.exists()


def test_serve_with_a_bad_environment_value_returns_2_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"
    monkeypatch.setenv("HORDELITE_SERVER_PORT", "abc")
    monkeypatch.setenv("HORDELITE_STORAGE_DATABASE", str(db))
    assert_not_served(capsys, ["serve"], "server.port", db)


def test_serve_with_a_bad_key_in_the_config_file_returns_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"
    config = tmp_path / "bad.toml"
    config.write_text(
        f'[server]\nport = 0\ncolour = "red"\n[storage]\ndatabase = "{db}"\n', encoding="utf-8"
    )
    assert_not_served(capsys, ["--config", str(config), "serve"], "server.colour", db)


def test_serve_with_an_out_of_range_port_option_returns_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"
    assert main(["serve", "--port", "70000", "--database", str(db)]) == 2
    assert "server.port" in capsys.readouterr().err
    assert not db.exists()


def test_a_missing_config_file_named_on_the_command_line_returns_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", str(tmp_path / "absent.toml"), "serve"]) == 2
    assert "absent.toml" in capsys.readouterr().err


# A malformed URL: one line naming the key, for every command that reads it.

DATABASE_COMMANDS = [
    pytest.param(["serve"], id="serve"),
    pytest.param(["keys", "list"], id="keys-list"),
    pytest.param(["keys", "create", "alice"], id="keys-create"),
    pytest.param(["kudos", "grant", "alice", "1"], id="kudos-grant"),
    pytest.param(["workers", "list"], id="workers-list"),
    pytest.param(["db", "upgrade"], id="db-upgrade"),
]
BAD_DATABASE_URLS = [
    pytest.param("postgresql://host:54x2/db", id="port-not-a-number"),
    pytest.param("postgresql://127.0.0.1:99999/db", id="port-out-of-range"),
    pytest.param("postgresql://127.0.0.1:0/db", id="port-0"),
    pytest.param("postgresql://u:secret@[::1/db", id="ipv6-unclosed"),
    pytest.param("postgresql+psycopg://h:-1/db", id="port-negative"),
]


@pytest.mark.parametrize("url", BAD_DATABASE_URLS)
@pytest.mark.parametrize("command", DATABASE_COMMANDS)
def test_a_malformed_database_url_is_one_line_naming_the_key_with_exit_code_2(
    command: list[str], url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, *command, "--database", url)
    assert_one_line_refusal(code, err, "storage.database", "port")
    assert code == 2
    assert "secret" not in err  # the URL may hold a password: it is not shown
    assert "serving at" not in out


@pytest.mark.parametrize(
    ("variable", "value", "key"),
    [
        ("HORDELITE_SIGNALS_URL", "redis://127.0.0.1:63x9/0", "signals.url"),
        ("HORDELITE_SIGNALS_URL", "redis://[::1/0", "signals.url"),
        ("HORDELITE_BLOBS_S3_ENDPOINT", "http://127.0.0.1:9x/", "blobs.s3_endpoint"),
    ],
)
def test_a_malformed_service_url_stops_serve_in_one_line_naming_the_key(
    variable: str,
    value: str,
    key: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = tmp_path / "never.db"
    monkeypatch.setenv(variable, value)
    code, _, err = cli(capsys, "serve", "--port", "0", "--database", str(db))
    assert_one_line_refusal(code, err, key, "port")
    assert code == 2
    assert not db.exists()


def test_a_database_url_without_a_host_or_a_port_is_taken_as_libpq_takes_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # libpq's defaults (the local socket, port 5432): not a configuration
    # error, whatever the database then says.
    for url in ("postgresql:///hordelite-absent", "postgresql://:5432/hordelite-absent"):
        code, _, err = cli(capsys, "keys", "list", "--database", url)
        assert "configuration error" not in err, err
        assert code == 1


# A real serve process ----------------------------------------------------------

START_DEADLINE = 20.0
STOP_TIMEOUT = 15.0


def _lines(stream: IO[str]) -> tuple[queue.Queue[str | None], threading.Thread]:
    """Lines of ``stream`` as they arrive (None at end of file), read by a thread.

    The thread is the stream's only reader: join it (it ends at end of file,
    when the process exits) before closing the stream, or it reads a closed
    file."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def _banner(lines: queue.Queue[str | None], deadline: float) -> list[str]:
    """Lines up to and including the one telling how to create a key."""
    banner: list[str] = []
    while not any("keys create" in line for line in banner):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"no complete start banner within {START_DEADLINE} s: {banner}")
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            pytest.fail(f"hordelite serve exited before its banner: {banner}")
        banner.append(line)
    return banner


@contextlib.contextmanager
def serving(tmp_path: Path, config_text: str) -> Iterator[list[str]]:
    """A real ``hordelite serve`` with this configuration, running while the
    block runs: its start banner; then stopped with SIGTERM, which must exit 0."""
    config = tmp_path / "serve.toml"
    config.write_text(config_text, encoding="utf-8")
    stderr_path = tmp_path / "stderr.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDELITE_")}
    with stderr_path.open("w", encoding="utf-8") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "hordelite", "--config", str(config), "serve"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        reader: threading.Thread | None = None
        try:
            assert process.stdout is not None
            lines, reader = _lines(process.stdout)
            yield _banner(lines, time.monotonic() + START_DEADLINE)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=STOP_TIMEOUT) == 0, stderr_path.read_text()
            reader.join(timeout=STOP_TIMEOUT)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None and not (reader and reader.is_alive()):
                process.stdout.close()


def served_banner(tmp_path: Path, config_text: str) -> list[str]:
    """The start banner of a real ``hordelite serve`` with this configuration
    (then stopped with SIGTERM, which must exit 0)."""
    with serving(tmp_path, config_text) as banner:
        return banner


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_serve_on_port_0_prints_its_url_answers_and_stops_cleanly_on_SIGTERM(
    tmp_path: Path, backend: str
) -> None:
    db = tmp_path / "served.db"
    with serving(
        tmp_path,
        f'[server]\nhost = "127.0.0.1"\nport = 0\nbackend = "{backend}"\ngrace_period = 2\n'
        f'[storage]\ndatabase = "{db}"\n',
    ) as banner:
        text = "\n".join(banner)
        match = re.search(r"serving at (http://127\.0\.0\.1:(\d+))", text)
        assert match, text
        url, port = match.group(1), int(match.group(2))
        assert port != 0
        assert str(db) in text
        assert "hordelite keys create" in text

        r = httpx.get(f"{url}/api/v2/status/heartbeat", timeout=10)
        assert r.status_code == 200
        assert r.json()["message"] == "OK"
        # The printed dashboard URL is the page a new user opens.
        assert f"dashboard and chat playground: {url}/" in text
        page = httpx.get(f"{url}/", timeout=10)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert 'id="playground"' in page.text
    assert db.exists()


def test_the_banner_shows_the_anonymous_key_and_the_horde_sdk_base_url(tmp_path: Path) -> None:
    banner = "\n".join(
        served_banner(
            tmp_path, f'[server]\nport = 0\n[storage]\ndatabase = "{tmp_path / "a.db"}"\n'
        )
    )
    url = re.search(r"serving at (http://\S+)", banner)
    assert url, banner
    assert "anonymous key: 0000000000" in banner
    assert f"AI_HORDE_URL={url.group(1)}/api/" in banner


def test_the_banner_shows_no_anonymous_key_when_anonymous_access_is_off(tmp_path: Path) -> None:
    banner = "\n".join(
        served_banner(
            tmp_path,
            f'[server]\nport = 0\n[storage]\ndatabase = "{tmp_path / "a.db"}"\n'
            "[horde]\nallow_anonymous = false\n",
        )
    )
    assert "0000000000" not in banner
    assert "anonymous access: off" in banner


@pytest.mark.postgres
def test_the_banner_masks_a_postgresql_password(tmp_path: Path, postgres_schema_url: str) -> None:
    url = postgres_schema_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
    assert "s3cret" in url
    banner = "\n".join(
        served_banner(tmp_path, f"[server]\nport = 0\n[storage]\ndatabase = '{url}'\n")
    )
    assert "s3cret" not in banner
    assert "database: postgresql://postgres:***@127.0.0.1" in banner


def failed_serve(
    tmp_path: Path, *args: str, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A real ``hordelite serve`` with these arguments that is expected to
    fail at start. A process of its own: a serve that started anyway would
    serve until the timeout, which fails the test instead of hanging it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORDELITE_")}
    return subprocess.run(
        [sys.executable, "-m", "hordelite", "serve", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, **(environ or {})},
        timeout=START_DEADLINE,
        check=False,
    )


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 something else listens on while the test runs."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_a_port_in_use_is_one_line_suggesting_port(
    tmp_path: Path, backend: str, taken_port: int
) -> None:
    port = taken_port
    done = failed_serve(
        tmp_path,
        *("--port", str(port), "--backend", backend, "--database", str(tmp_path / "p.db")),
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr
    assert "in use" in done.stderr
    assert "--port" in done.stderr
    assert "serving at" not in done.stdout


def test_a_metrics_port_in_use_is_one_line_naming_it(tmp_path: Path, taken_port: int) -> None:
    port = taken_port
    done = failed_serve(
        tmp_path,
        *("--port", "0", "--database", str(tmp_path / "p.db")),
        environ={"HORDELITE_METRICS_PORT": str(port)},
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr
    assert "metrics.port" in done.stderr
    assert "serving at" not in done.stdout


def test_the_banner_names_the_blob_folder_and_its_secret(tmp_path: Path) -> None:
    url = "http://127.0.0.1:7001"
    beside = Config().replace(storage={"database": "/srv/horde/h.db"})
    assert "  blobs and their signing secret: /srv/horde/hordelite-blobs" in banner(
        beside, url, "0.1.0"
    )
    # With PostgreSQL the folder is in the current directory (tmp_path, see
    # _isolated): named in full.
    postgres = Config().replace(storage={"database": "postgresql://u@h/db"})
    assert f"  blobs and their signing secret: {tmp_path / 'hordelite-blobs'}" in banner(
        postgres, url, "0.1.0"
    )
    s3 = Config().replace(blobs={"s3_endpoint": "http://127.0.0.1:9000"})
    assert "  blobs: bucket hordelite at http://127.0.0.1:9000" in banner(s3, url, "0.1.0")


def test_the_banner_prints_the_dashboard_url_second_and_not_when_it_is_off() -> None:
    url = "http://127.0.0.1:7001"
    lines = banner(Config(), url, "0.1.0")
    assert lines[1] == f"  dashboard and chat playground: {url}/"
    off = banner(Config().replace(dashboard={"enabled": False}), url, "0.1.0")
    assert not any("dashboard" in line for line in off)


# A database path that cannot be ----------------------------------------------


def bad_database_paths(tmp_path: Path) -> dict[str, tuple[Path, list[str]]]:
    """Database paths that name no possible SQLite file, each with the words
    its refusal must hold: a missing folder, a path under a file, a folder."""
    (tmp_path / "a-file").write_text("not a folder", encoding="utf-8")
    return {
        "missing folder": (
            tmp_path / "no" / "such" / "x.db",
            [str(tmp_path / "no" / "such"), "no folder"],
        ),
        "under a file": (tmp_path / "a-file" / "x.db", [str(tmp_path / "a-file"), "a file"]),
        "a folder": (tmp_path, [str(tmp_path), "a folder"]),
    }


@pytest.mark.parametrize("case", ["missing folder", "under a file", "a folder"])
def test_db_upgrade_on_an_impossible_sqlite_path_is_one_line_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    path, words = bad_database_paths(tmp_path)[case]
    before = sorted(tmp_path.rglob("*"))
    code, out, err = cli(capsys, "db", "upgrade", "--database", str(path))
    assert code == 1
    assert_one_line_refusal(code, err, *words)
    assert "schema version" not in out
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("case", ["missing folder", "under a file"])
def test_serve_on_an_impossible_sqlite_path_is_one_line_and_creates_nothing(
    tmp_path: Path, case: str
) -> None:
    path, words = bad_database_paths(tmp_path)[case]
    before = sorted(tmp_path.rglob("*"))
    done = failed_serve(tmp_path, "--port", "0", "--database", str(path))
    assert done.returncode == 1, done.stderr
    assert_one_line_refusal(done.returncode, done.stderr, *words)
    assert done.stderr.startswith("hordelite: ")
    assert "serving at" not in done.stdout
    assert sorted(tmp_path.rglob("*")) == before


def test_version_prints_hordelite_and_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "--version")
    assert (code, out, err) == (0, f"hordelite {__version__}\n", "")


@pytest.mark.parametrize(
    ("given", "base", "suffix"),
    [
        ("http://h:7001", "http://h:7001", None),
        ("http://h:7001/", "http://h:7001/", None),
        ("http://h:7001/api/v2", "http://h:7001", "/api/v2"),
        ("http://h:7001/api/v2/", "http://h:7001", "/api/v2"),
        ("https://h/api/", "https://h", "/api"),
        ("https://h/v1", "https://h", "/v1"),
        ("https://h/horde/api/v2", "https://h/horde", "/api/v2"),  # behind a proxy's path
        ("https://h/myapi", "https://h/myapi", None),
        ("http://api", "http://api", None),  # a host, not a route
    ],
)
def test_the_worker_takes_an_api_route_off_the_hordes_url(
    given: str, base: str, suffix: str | None
) -> None:
    assert horde_base_url(given) == (base, suffix)


@pytest.mark.anyio
@pytest.mark.parametrize("first", ["revoke", "rotate"])
async def test_a_rotated_or_revoked_key_takes_the_shared_keys_it_lent_along(
    database: str, capsys: pytest.CaptureFixture[str], first: str
) -> None:
    # A rotation brought back every shared key lent with the old key (the
    # lender could neither see nor list them): they now go with it, and with
    # a revoke as well.
    old, _ = create_alice(database, capsys, "--kudos", "100")
    async with client_of(database) as client:
        lent = [
            (await client.put("/api/v2/sharedkeys", headers={"apikey": old}, json={})).json()["id"]
            for _ in range(2)
        ]
    code, out, _ = cli(capsys, "keys", first, "alice", "--database", database)
    assert code == 0
    assert "nor do the 2 shared keys it lent" in out
    code, out, _ = cli(capsys, "keys", "rotate", "alice", "--database", database)
    assert code == 0
    new, _ = created_key(out)
    assert "shared key" not in out  # none left to take along
    async with client_of(database) as client:
        for key_id in lent:
            await assert_invalid_key(client, key_id)
        r = await client.get("/api/v2/find_user", headers={"apikey": new})
        assert r.json()["sharedkey_ids"] == []
        made = await client.put("/api/v2/sharedkeys", headers={"apikey": new}, json={})
        r = await client.get("/api/v2/find_user", headers={"apikey": new})
        assert r.json()["sharedkey_ids"] == [made.json()["id"]]


@pytest.mark.anyio
async def test_modes_set_turns_a_mode_on_audited_as_cli_and_a_running_horde_sees_it(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, "modes", "show", "--database", database)
    assert code == 0
    assert out.splitlines()[1:] == ["maintenance: off", "invite_only: off", "raid: off"]
    async with (
        open_horde(database=database) as horde,
        httpx.AsyncClient(base_url=horde.url) as client,
    ):
        assert (await client.get("/api/v2/status/modes")).json()["maintenance_mode"] is False
        code, out, _ = cli(capsys, "modes", "set", "maintenance", "on", "--database", database)
        assert code == 0
        assert "maintenance: on" in out.splitlines()
        with anyio.fail_after(10):  # within the horde's interval, polled
            while True:
                if (await client.get("/api/v2/status/modes")).json()["maintenance_mode"]:
                    break
                await anyio.sleep(0.05)
    code, out, _ = cli(capsys, "modes", "show", "--database", database)
    assert out.splitlines()[1:] == ["maintenance: on", "invite_only: off", "raid: off"]
    db = Database(database, 1)
    try:
        entries = Horde(Config(), db).store.audit_entries(query=AuditQuery(actions=("mode.set",)))
    finally:
        db.dispose()
    assert [(e.actor, e.address, e.detail["set"]) for e in entries] == [
        ("cli", "", {"maintenance": True})
    ]


@pytest.mark.parametrize("argv", [["modes", "set", "turbo", "on"], ["modes", "set", "raid", "yes"]])
def test_modes_set_refuses_an_unknown_mode_or_state(
    argv: list[str], database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, *argv, "--database", database)
    assert code == 2
    assert "invalid choice" in err
