"""The ``hordelite`` command: main([...]) in-process, and one real ``serve`` process."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import httpx
import pytest

from hordelite.cli import main
from hordelite.config import Config
from hordelite.horde.service import Horde, hash_key
from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.storage.migrations import LATEST, current_version
from hordelite.testing import open_horde


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No ./hordelite.toml from the checkout, no configuration from the shell.
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("HORDELITE_") and not name.startswith("HORDELITE_TEST_"):
            monkeypatch.delenv(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_schema_url")  # type: ignore[no-any-return]
    return str(tmp_path / "cli.db")


def created_key(output: str) -> tuple[str, int]:
    """The API key and user id that ``keys create`` printed."""
    key_lines = [line for line in output.splitlines() if "API key" in line]
    assert len(key_lines) == 1, output
    key = key_lines[0].rsplit(":", 1)[1].strip()
    match = re.search(r"alice#(\d+)", output)
    assert match, output
    return key, int(match.group(1))


def authenticates(database: str, key: str) -> dict[str, object]:
    db = Database(database, 1)
    try:
        rules = Horde(Config(), db).rules
        return db.run_sync(queries.user_by_key, False, hash_key(key), rules)
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
    user = authenticates(database, key)
    assert user["id"] == user_id
    assert user["key_hash"] == hash_key(key)
    assert key not in user.values()


@pytest.mark.anyio
async def test_a_created_key_authenticates_on_find_user_with_its_kudos_and_name(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", "alice", "--kudos", "50", "--database", database]) == 0
    key, user_id = created_key(capsys.readouterr().out)
    async with (
        open_horde(database=database) as horde,
        httpx.AsyncClient(base_url=horde.url) as client,
    ):
        r = await client.get("/api/v2/find_user", headers={"apikey": key})
        assert r.status_code == 200, r.text
        user = r.json()
        assert user["username"] == f"alice#{user_id}"
        assert user["id"] == user_id
        assert user["kudos"] == 50
        # The control: a key that was never printed finds nobody.
        wrong = await client.get("/api/v2/find_user", headers={"apikey": key + "x"})
        assert wrong.status_code in (401, 404), wrong.text


# db upgrade ------------------------------------------------------------------


def test_db_upgrade_creates_the_schema_on_a_new_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "new.db")
    assert main(["db", "upgrade", "--database", path]) == 0
    db = Database(path, 1)
    try:
        assert db.run_sync(current_version, False) == LATEST
    finally:
        db.dispose()
    assert f"0 -> {LATEST}" in capsys.readouterr().out


def test_db_upgrade_is_idempotent_and_keeps_the_data(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "upgrade", "--database", database]) == 0
    assert main(["keys", "create", "alice", "--kudos", "7", "--database", database]) == 0
    key, user_id = created_key(capsys.readouterr().out)
    assert main(["db", "upgrade", "--database", database]) == 0
    assert f"{LATEST} -> {LATEST}" in capsys.readouterr().out
    db = Database(database, 1)
    try:
        assert db.run_sync(current_version, False) == LATEST
    finally:
        db.dispose()
    user = authenticates(database, key)
    assert (user["id"], user["kudos"]) == (user_id, 7)


# A bad configuration stops serve before it starts ------------------------------


def test_serve_with_a_bad_environment_value_returns_2_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"
    monkeypatch.setenv("HORDELITE_SERVER_PORT", "abc")
    monkeypatch.setenv("HORDELITE_STORAGE_DATABASE", str(db))
    assert main(["serve"]) == 2
    out, err = capsys.readouterr()
    assert "server.port" in err
    assert "serving at" not in out
    assert not db.exists()


def test_serve_with_a_bad_key_in_the_config_file_returns_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"
    config = tmp_path / "bad.toml"
    config.write_text(
        f'[server]\nport = 0\ncolour = "red"\n[storage]\ndatabase = "{db}"\n', encoding="utf-8"
    )
    assert main(["--config", str(config), "serve"]) == 2
    out, err = capsys.readouterr()
    assert "server.colour" in err
    assert "serving at" not in out
    assert not db.exists()


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


# A real serve process ----------------------------------------------------------

START_DEADLINE = 20.0
STOP_TIMEOUT = 15.0


def _lines(stream: IO[str]) -> queue.Queue[str | None]:
    """Lines of ``stream`` as they arrive (None at end of file), read by a thread."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


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


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_serve_on_port_0_prints_its_url_answers_and_stops_cleanly_on_SIGTERM(
    tmp_path: Path, backend: str
) -> None:
    db = tmp_path / "served.db"
    config = tmp_path / "serve.toml"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = 0\nbackend = "{backend}"\ngrace_period = 2\n'
        f'[storage]\ndatabase = "{db}"\n',
        encoding="utf-8",
    )
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
        try:
            assert process.stdout is not None
            banner = _banner(_lines(process.stdout), time.monotonic() + START_DEADLINE)
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

            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=STOP_TIMEOUT) == 0, stderr_path.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
    assert db.exists()
