"""``hordelite audit``: main([...]) in-process, on SQLite and PostgreSQL.

* The operator's keys create, kudos grant, keys rotate and revoke appear,
  newest first, as ``cli`` with no address, in the table and as JSON lines.
* ``--action`` (repeated or a comma list), ``--actor``, ``--target`` and
  ``--since`` (a duration or an ISO time) filter; ``--limit`` pages, each
  page naming the command of the next (``--before``), the last none.
* A bad value is refused in one line naming its flag, exit 1; the database
  is found as the other operator commands find it (HORDELITE_DATABASE_URL),
  and none is created.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

from hordelite.cli import main
from hordelite.cli._admin import open_existing, target
from hordelite.config import Config
from hordelite.storage import audit
from tests.unit._cli_isolation import isolated  # noqa: F401 (autouse)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> str:
    """A horde's database, created the way an operator does (db upgrade)."""
    if request.param == "postgresql":
        url = str(request.getfixturevalue("postgres_schema_url"))
    else:
        url = str(tmp_path / "cli.db")
    assert main(["db", "upgrade", "--database", url]) == 0
    capsys.readouterr()
    return url


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], list[str]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def _record(database: str, action: str, target_: str, at: float, actor: audit.Actor) -> None:
    """An entry written at ``at`` (the trail's own writer, as a horde's)."""
    config = Config().replace(storage={"database": database})
    store = open_existing(config, target(config, database, None))
    try:
        store.record_audit_sync(actor=actor, action=action, target=target_, now=at)
    finally:
        store.db.dispose()


def test_the_operators_actions_appear_as_cli_without_an_address(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ["keys", "create", "alice"],
        ["kudos", "grant", "alice", "25"],
        ["keys", "rotate", "alice"],
        ["keys", "revoke", "alice"],
    ):
        assert main([*argv, "--database", database]) == 0
    capsys.readouterr()

    code, out, err = _run(capsys, "audit", "--database", database, "--json")
    assert code == 0
    entries = [json.loads(line) for line in out]
    assert [e["action"] for e in entries] == [
        "key.revoke",
        "key.rotate",
        "kudos.grant",
        "user.create",
    ]
    assert {(e["actor"], e["actor_id"], e["address"], e["target"]) for e in entries} == {
        ("cli", None, "", "alice#1")
    }
    assert entries[2]["detail"] == {"amount": 25.0, "before": 0.0, "after": 25.0}
    assert err[0].startswith("database: ")

    code, out, _ = _run(capsys, "audit", "--database", database)
    assert code == 0
    assert out[1].split()[:3] == ["ID", "WHEN", "(UTC)"]
    grant = next(line for line in out if "kudos.grant" in line)
    assert grant.split()[3:7] == ["cli", "-", "kudos.grant", "alice#1"]
    assert '"amount": 25.0' in grant


def test_filters_by_action_actor_target_and_time(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    mod = audit.Actor("mod#2", 2, "203.0.113.9")
    _record(database, "worker.pause", "w-1", now - 3 * 86400, mod)
    _record(database, "kudos.grant", "alice#3", now - 2 * 3600, audit.CLI_ACTOR)
    _record(database, "user.edit", "alice#3", now - 60, mod)
    _record(database, "key.revoke", "bob#4", now - 30, audit.CLI_ACTOR)

    def targets(*flags: str) -> list[tuple[str, str]]:
        code, out, err = _run(capsys, "audit", "--database", database, "--json", *flags)
        assert code == 0, err
        return [(json.loads(line)["action"], json.loads(line)["target"]) for line in out]

    assert targets("--action", "kudos.grant", "--action", "key.revoke") == [
        ("key.revoke", "bob#4"),
        ("kudos.grant", "alice#3"),
    ]
    assert targets("--action", "worker.pause,user.edit") == [
        ("user.edit", "alice#3"),
        ("worker.pause", "w-1"),
    ]
    assert targets("--actor", "mod#2", "--target", "alice#3") == [("user.edit", "alice#3")]
    assert targets("--since", "3h") == [
        ("key.revoke", "bob#4"),
        ("user.edit", "alice#3"),
        ("kudos.grant", "alice#3"),
    ]
    two_days_ago = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now - 2 * 86400))
    assert len(targets("--since", two_days_ago)) == 3
    assert targets("--since", "1m", "--actor", "cli") == [("key.revoke", "bob#4")]
    code, out, _ = _run(capsys, "audit", "--database", database, "--actor", "nobody#9")
    assert code == 0
    assert out[-1] == "no entries match"


def test_pages_name_the_command_of_the_next_and_the_last_none(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    for i in range(5):
        _record(database, "kudos.grant", f"user#{i}", now - 100 + i, audit.CLI_ACTOR)
    seen: list[str] = []
    argv = ["hordelite", "audit", "--action", "kudos.grant", "--limit", "2", "--json"]
    pages = 0
    while argv:
        code, out, err = _run(capsys, *argv[1:], "--database", database)
        assert code == 0, err
        pages += 1
        seen += [json.loads(line)["target"] for line in out]
        hint = [line for line in err if line.startswith("next page: ")]
        argv = shlex.split(hint[0].removeprefix("next page: ")) if hint else []
    assert pages == 3
    assert seen == [f"user#{i}" for i in reversed(range(5))]

    code, out, _ = _run(capsys, "audit", "--database", database, "--limit", "4")
    assert out[-1].startswith("next page: hordelite audit --limit 4 --before ")


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--action", "kudos.granted"], "--action"),
        (["--action", "kudos.grant,nope"], "--action"),
        (["--since", "yesterday"], "--since"),
        (["--since", "2y"], "--since"),
        (["--limit", "0"], "--limit"),
        (["--limit", "501"], "--limit"),
        (["--limit", "ten"], "--limit"),
        (["--before", "-3"], "--before"),
        (["--actor", " "], "--actor"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_its_flag(
    database: str, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    code, out, err = _run(capsys, "audit", "--database", database, *flags)
    assert code == 1
    assert out == []
    assert len(err) == 1
    assert err[0].startswith(f"hordelite: {named}: ")


def test_the_database_is_found_as_by_the_other_commands_and_never_created(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = tmp_path / "nowhere.db"
    monkeypatch.setenv("HORDELITE_DATABASE_URL", str(missing))
    code, _, err = _run(capsys, "audit")
    assert code == 1
    assert len(err) == 1
    assert "no database at" in err[0]
    assert "HORDELITE_DATABASE_URL" in err[0]
    assert not missing.exists()
    assert main(["db", "upgrade"]) == 0
    assert main(["kudos", "grant", "0", "1"]) == 0  # the anonymous user, by id
    capsys.readouterr()
    code, out, _ = _run(capsys, "audit", "--json")
    assert code == 0
    assert [json.loads(line)["target"] for line in out] == ["Anonymous#0"]
