"""``hordelite filters``: the operator's prompt filters at the shell, on
SQLite and PostgreSQL, each change in the audit trail as the CLI's."""

from __future__ import annotations

from pathlib import Path

import pytest

from hordelite.cli import main
from hordelite.storage import audit
from hordelite.storage.database import Database
from tests.unit._cli_isolation import isolated  # noqa: F401 (autouse)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> str:
    url = (
        request.getfixturevalue("postgres_schema_url")
        if request.param == "postgresql"
        else str(tmp_path / "cli.db")
    )
    assert main(["db", "upgrade", "--database", url]) == 0
    capsys.readouterr()
    return url


def _trail(database: str) -> list[tuple[str, str, str]]:
    db = Database(database, 1)
    try:
        entries = db.run_sync(audit.entries, False)
    finally:
        db.dispose()
    return [(e.action, e.target, e.actor) for e in entries]


def test_filters_add_list_test_edit_and_remove(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    add = ["filters", "add", "kitten", "--type", "10", "--action", "replace"]
    assert main([*add, "--replacement", "cat", "--database", database]) == 0
    assert "filter 1 added." in capsys.readouterr().out
    assert main(["filters", "add", "dragon", "--type", "20", "--database", database]) == 0
    capsys.readouterr()

    assert main(["filters", "list", "--type", "20", "--database", database]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[1].split() == [
        "ID",
        "TYPE",
        "ACTION",
        "REGEX",
        "REPLACEMENT",
        "DESCRIPTION",
        "BY",
    ]
    assert listed[2].split() == ["2", "20", "refuse", "dragon", "cli"]
    assert len(listed) == 3

    assert main(["filters", "test", "one k i t t e n", "--database", database]) == 0
    out = capsys.readouterr().out
    assert "filter 1 (replace) matches" in out
    assert "decision: served as: 'one cat'" in out
    assert main(["filters", "test", "a D.R.A.G.O.N", "--database", database]) == 0
    assert "decision: refused (400 CorruptPrompt)" in capsys.readouterr().out

    assert main(["filters", "edit", "2", "--action", "flag", "--database", database]) == 0
    assert main(["filters", "remove", "1", "--database", database]) == 0
    capsys.readouterr()
    assert main(["filters", "list", "--database", database]) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == ["2", "20", "flag", "dragon", "cli"]
    assert _trail(database) == [
        ("filter.delete", "filter:1", "cli"),
        ("filter.edit", "filter:2", "cli"),
        ("filter.create", "filter:2", "cli"),
        ("filter.create", "filter:1", "cli"),
    ]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["filters", "add", r"(a)\1", "--type", "10"], "regex: RE2 cannot compile it"),
        (["filters", "add", "(?=a)", "--type", "10"], "regex: RE2 cannot compile it"),
        (["filters", "add", "x", "--type", "9"], "filter_type: must be from 10 to 29"),
        (["filters", "edit", "1"], "No filter modification selected."),
        (["filters", "edit", "7", "--action", "flag"], "Filter with ID '7' not found."),
        (["filters", "remove", "x"], "FILTER: expected a filter id"),
    ],
)
def test_a_bad_filter_command_is_refused_in_one_line_and_writes_nothing(
    database: str, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    assert main([*argv, "--database", database]) == 1
    _, err = capsys.readouterr()
    assert err.startswith("hordelite: ")
    assert said in err
    assert len(err.splitlines()) == 1
    assert _trail(database) == []
