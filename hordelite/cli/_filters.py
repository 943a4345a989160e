"""``hordelite filters``: the operator's prompt filters at the shell
(docs/reference/filters.md), on the horde's database: every change recorded
in the audit trail as the CLI's, and applied by every running process
within FILTERS_CHECK_SECONDS."""

from __future__ import annotations

import time
from typing import Any

from hordelite.cli._admin import Refused, Target, _table, run
from hordelite.config import Config
from hordelite.contract import filters as rules_of
from hordelite.contract.limits import FILTERS_CHECK_SECONDS
from hordelite.errors import HordeError
from hordelite.horde.caches import compiled_rules
from hordelite.storage import filters as filter_rows
from hordelite.storage.store import Store


def _checked(fn: Any, *args: Any) -> Any:
    """A contract refusal as the CLI's (one line, exit 1)."""
    try:
        return fn(*args)
    except HordeError as exc:
        raise Refused(exc.message) from None


def _filter_id(value: str) -> int:
    if not value.isdigit():
        raise Refused(f"FILTER: expected a filter id (a number), got {value[:64]!r}")
    return int(value)


def filters_list(
    config: Config, where: Target, filter_type: int | None, contains: str | None
) -> list[str]:
    found = run(
        config,
        where,
        lambda store: _on(store, filter_rows.list_filters, filter_type, contains),
    )
    if not found:
        return [f"database: {where.shown}", "no filters"]
    rows = [
        (
            str(f.id),
            str(f.filter_type),
            f.action,
            f.regex,
            f.replacement,
            f.description or "",
            f.user,
        )
        for f in found
    ]
    header = ("ID", "TYPE", "ACTION", "REGEX", "REPLACEMENT", "DESCRIPTION", "BY")
    return [f"database: {where.shown}", *_table(header, rows)]


def filters_add(config: Config, where: Target, fields: dict[str, Any]) -> list[str]:
    spec = _checked(rules_of.parse_filter, {k: v for k, v in fields.items() if v is not None})
    made, new = run(
        config,
        where,
        lambda store: _on(store, filter_rows.create_filter, spec, "", time.time(), write=True),
    )
    said = "added" if new else "already there (the same regex and type)"
    return [f"database: {where.shown}", f"filter {made.id} {said}.", _applies()]


def filters_edit(
    config: Config, where: Target, filter_id: str, fields: dict[str, Any]
) -> list[str]:
    edit = _checked(rules_of.parse_filter_edit, fields)
    found = run(
        config,
        where,
        lambda store: _on(
            store,
            filter_rows.edit_filter,
            _filter_id(filter_id),
            edit,
            "",
            time.time(),
            write=True,
        ),
    )
    return [f"database: {where.shown}", f"filter {found.id} changed.", _applies()]


def filters_remove(config: Config, where: Target, filter_id: str) -> list[str]:
    number = _filter_id(filter_id)
    run(
        config,
        where,
        lambda store: _on(store, filter_rows.delete_filter, number, "", time.time(), write=True),
    )
    return [f"database: {where.shown}", f"filter {number} removed.", _applies()]


def filters_test(config: Config, where: Target, prompt: str) -> list[str]:
    """What the horde's filters would do with ``prompt``: each matching
    filter and its action, and the decision."""
    found = run(config, where, lambda store: store.db.run_sync(filter_rows.every_filter, False))
    rules = rules_of.FilterSet(compiled_rules(found.records))
    verdict = rules.screen([prompt])
    suspicion, matches = rules.suspicion(prompt)
    if verdict.refused:
        decision = "refused (400 CorruptPrompt)"
    elif verdict.replaced:
        decision = f"served as: {verdict.texts[0]!r}"
    else:
        decision = "served"
    lines = [f"database: {where.shown}", f"normalised: {rules_of.normalise(prompt)!r}"]
    by_id = {r.id: r for r in found.records}
    lines += [f"filter {i} ({by_id[i].action}) matches" for i in verdict.matched]
    lines += [f"suspicion: {suspicion}, matches: {matches}", f"decision: {decision}"]
    return lines


def _on(store: Store, fn: Any, *args: Any, write: bool = False) -> Any:
    try:
        return store.filters_sync(fn=fn, args=args, write=write)
    except HordeError as exc:
        raise Refused(exc.message) from None


def _applies() -> str:
    return f"Every running process applies it within {FILTERS_CHECK_SECONDS:g} s."
