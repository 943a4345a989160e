"""Prompt filters' storage (hordelite/storage/filters.py): every change
bumps the revision processes check and is audited in its own transaction;
a change refused writes nothing; on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from hordelite.contract.filters import FilterEdit, FilterSpec
from hordelite.errors import RC, HordeError
from hordelite.storage import audit
from hordelite.storage import filters as rows
from hordelite.storage.database import Database
from tests.storage.helpers import NOW, RULES


def _revision(db: Database) -> int:
    return db.run_sync(rows.revision, False)


def _actions(db: Database) -> list[str]:
    return [e.action for e in db.run_sync(audit.entries, False)]


def test_every_change_moves_the_revision_and_is_audited(database: Database) -> None:
    assert _revision(database) == 0
    made, new = database.run_sync(
        rows.create_filter, True, None, RULES, FilterSpec("x", 10), "", NOW
    )
    assert new
    assert _revision(database) == 1
    again, new = database.run_sync(
        rows.create_filter, True, None, RULES, FilterSpec("x", 10), "", NOW
    )
    assert not new
    assert again == made
    assert _revision(database) == 1  # nothing changed
    edit = FilterEdit(action="flag")
    database.run_sync(rows.edit_filter, True, None, RULES, made.id, edit, "", NOW)
    assert _revision(database) == 2
    database.run_sync(rows.delete_filter, True, None, RULES, made.id, "", NOW)
    assert _revision(database) == 3
    assert database.run_sync(rows.every_filter, False) == rows.FilterRules(3, ())
    assert _actions(database) == ["filter.delete", "filter.edit", "filter.create"]


def test_a_filter_past_the_limit_is_refused_and_writes_nothing(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rows, "MAX_FILTERS", 1)
    database.run_sync(rows.create_filter, True, None, RULES, FilterSpec("x", 10), "", NOW)
    with pytest.raises(HordeError) as refused:
        database.run_sync(rows.create_filter, True, None, RULES, FilterSpec("y", 10), "", NOW)
    assert refused.value.rc is RC.TooManyFilters
    assert _revision(database) == 1
    assert _actions(database) == ["filter.create"]


def test_an_unknown_key_or_filter_is_refused(database: Database) -> None:
    with pytest.raises(HordeError) as refused:
        database.run_sync(rows.list_filters, False, "no such key", RULES, None, None)
    assert refused.value.rc is RC.InvalidAPIKey
    with pytest.raises(HordeError) as refused:
        database.run_sync(rows.delete_filter, True, None, RULES, 5, "", NOW)
    assert refused.value.rc is RC.FilterNotFound
    assert _actions(database) == []
