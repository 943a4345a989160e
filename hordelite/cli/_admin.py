"""The operator's commands on a horde's database: keys, kudos, workers,
audit, modes, db.

Each names the database it used (a postgresql URL with its password
masked). ``keys``, ``kudos`` and ``workers`` work only on an existing
hordelite database: a SQLite file that is missing, or a database without
the hordelite schema, is refused with a hint, because creating one would
quietly start a second, empty horde (run from another directory, the
default ``./hordelite.db`` is another file). ``db upgrade`` (and ``serve``)
create it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from hordelite.config import Config, StorageConfig
from hordelite.contract.audit_query import DEFAULT_PAGE, AuditQuery, AuditText, parse_query
from hordelite.contract.modes import Modes
from hordelite.contract.presence import is_online
from hordelite.contract.unicode_rules import fold_name
from hordelite.contract.user_edit import username_problem
from hordelite.errors import HordeError, HordeliteError
from hordelite.horde.audit_trail import entry_json
from hordelite.horde.service import Horde, hash_key, new_api_key
from hordelite.storage import audit
from hordelite.storage.accounts import UserRecord
from hordelite.storage.database import Database
from hordelite.storage.migrations import current_version
from hordelite.storage.pool import WorkerRecord
from hordelite.storage.store import Store

T = TypeVar("T")

DEFAULT_DATABASE = StorageConfig().database
# users.username holds at most this many characters.
_HANDLE = re.compile(r"^(.+)#(\d+)$")


class Refused(HordeliteError):
    """A command that cannot run: one line on stderr, exit code 1."""


def shown_database(database: str) -> str:
    """How a ``storage.database`` value is shown: a SQLite file as its
    absolute path, a URL with its password masked."""
    if "://" not in database:
        return os.path.abspath(os.path.expanduser(database))
    try:
        url = make_url(database)
    except ArgumentError:
        return "<a database URL that cannot be parsed>"
    if url.get_backend_name() == "sqlite":
        return f"sqlite:///{shown_database(url.database)}" if url.database else database
    return url.render_as_string(hide_password=True)


def _sqlite_file(database: str) -> Path | None:
    """The file of a SQLite database; None for a server (or in memory)."""
    if "://" not in database:
        return Path(os.path.expanduser(database))
    url = make_url(database)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(os.path.expanduser(url.database))


@dataclasses.dataclass(frozen=True)
class Target:
    """The database a command works on, and where the setting came from."""

    database: str
    source: str  # "--database", an environment variable, the config file, the default

    @property
    def shown(self) -> str:
        return shown_database(self.database)


def target(config: Config, flag: str | None, config_file: str | None) -> Target:
    database = config.storage.database
    if flag:
        source = "from --database"
    elif "HORDELITE_DATABASE_URL" in os.environ:
        source = "from HORDELITE_DATABASE_URL"
    elif "HORDELITE_STORAGE_DATABASE" in os.environ:
        source = "from HORDELITE_STORAGE_DATABASE"
    elif database != DEFAULT_DATABASE and config_file:
        source = f"from storage.database in {config_file}"
    else:
        source = f"the default, {DEFAULT_DATABASE} in the current directory"
    return Target(database, source)


_HINT = (
    "name the horde's database with --database, HORDELITE_DATABASE_URL or storage.database "
    "in the config file (--config), or create one with `hordelite db upgrade`"
)


def open_existing(config: Config, where: Target) -> Store:
    """The database's Store, brought up to date; refused when there is none."""
    file = _sqlite_file(where.database)
    if file is not None and not file.is_file():
        raise Refused(f"no database at {where.shown} ({where.source}); {_HINT}")
    db = Database(where.database, 1, prepare=config.storage.prepared_statements)
    try:
        if db.run_sync(current_version, False) == 0:
            raise Refused(f"{where.shown} holds no hordelite database ({where.source}); {_HINT}")
        store, _ = _migrate(config, db, where)
    except BaseException:
        db.dispose()
        raise
    return store


def run(config: Config, where: Target, fn: Callable[[Store], T]) -> T:
    store = open_existing(config, where)
    try:
        return fn(store)
    finally:
        store.db.dispose()


# Users --------------------------------------------------------------------------


def check_username(name: str) -> str:
    name = name.strip()
    problem = username_problem(name)
    if problem:
        raise Refused(f"a user name {problem}")
    return name


def resolve_user(store: Store, user: str) -> UserRecord:
    """A user given as its id, as NAME#ID, or by its name (compared by key:
    unicode_rules.fold_name; refused when several users have it, which only
    names stored before keys were can, decision 0073)."""
    text = user.strip()
    if text.isdigit() or _HANDLE.match(text):
        match = _HANDLE.match(text)
        user_id = int(match.group(2) if match else text)
        entry = store.find_user(user_id=user_id)
        if entry is None or (match and fold_name(entry.username) != fold_name(match.group(1))):
            raise Refused(f"no user {text}; `hordelite keys list` shows them")
        return entry
    named = store.users_named(name=text)
    if not named:
        raise Refused(f"no user named {text!r}; `hordelite keys list` shows them")
    if len(named) > 1:
        handles = ", ".join(u.handle for u in named)
        raise Refused(f"{len(named)} users are named {text!r} ({handles}): give one as NAME#ID")
    return named[0]


def keys_create(
    config: Config, where: Target, name: str, kudos: float, is_admin: bool, trusted: bool
) -> list[str]:
    name = check_username(name)
    _check_amount(kudos, "--kudos")
    key = new_api_key()

    def create(store: Store) -> UserRecord | list[UserRecord]:
        return store.create_named_user(
            username=name,
            key_hash=hash_key(key),
            kudos=kudos,
            admin=is_admin,
            trusted=trusted,
            now=time.time(),
            actor=audit.CLI_ACTOR,
        )

    created = run(config, where, create)
    if isinstance(created, list):
        handles = ", ".join(u.handle for u in created)
        raise Refused(
            f"a user named {name!r} exists already in {where.shown} ({handles}); "
            f"`hordelite keys rotate {created[0].handle}` gives it a new key, "
            "or choose another name"
        )
    return [
        f"database: {where.shown}",
        f"user {created.handle} created with {kudos:g} kudos.",
        f"API key (shown once, keep it): {key}",
    ]


def keys_list(config: Config, where: Target) -> list[str]:
    users = run(config, where, lambda store: store.list_users())
    rows = [
        (
            str(u.id),
            u.handle,
            f"{u.kudos:g}",
            _key_state(u, config),
            ",".join(r for r, on in (("admin", u.admin), ("trusted", u.trusted)) if on) or "-",
            str(len(u.worker_ids)),
        )
        for u in users
    ]
    return [
        f"database: {where.shown}",
        *_table(("ID", "USER", "KUDOS", "KEY", "ROLE", "WORKERS"), rows),
    ]


def _key_state(user: UserRecord, config: Config) -> str:
    if user.anonymous:
        return "public" if config.horde.allow_anonymous else "off"
    return "active" if user.active else "revoked"


def keys_revoke(config: Config, where: Target, user: str) -> list[str]:
    def revoke(store: Store) -> tuple[UserRecord, int]:
        entry = _registered(resolve_user(store, user), "revoke")
        return entry, store.set_key(
            user_id=entry.id, key_hash=None, now=time.time(), actor=audit.CLI_ACTOR
        )

    entry, lent = run(config, where, revoke)
    note = "" if entry.active else " (it was revoked already)"
    return [
        f"database: {where.shown}",
        f"user {entry.handle}: key revoked{note}; it no longer authenticates"
        f"{_lent_keys_gone(lent)}. "
        f"`hordelite keys rotate {entry.handle}` gives it a new one.",
    ]


def keys_rotate(config: Config, where: Target, user: str) -> list[str]:
    key = new_api_key()

    def rotate(store: Store) -> tuple[UserRecord, int]:
        entry = _registered(resolve_user(store, user), "rotate")
        return entry, store.set_key(
            user_id=entry.id, key_hash=hash_key(key), now=time.time(), actor=audit.CLI_ACTOR
        )

    entry, lent = run(config, where, rotate)
    return [
        f"database: {where.shown}",
        f"user {entry.handle}: new key; the old one no longer authenticates"
        f"{_lent_keys_gone(lent)}.",
        f"API key (shown once, keep it): {key}",
    ]


def _lent_keys_gone(count: int) -> str:
    # The shared keys lent with the old key go with it (decision 0058).
    if count == 0:
        return ""
    return f", nor do the {count} shared key{'s' if count > 1 else ''} it lent"


def _registered(entry: UserRecord, action: str) -> UserRecord:
    if entry.anonymous:
        raise Refused(
            f"cannot {action} the anonymous key, every client knows it; "
            "set horde.allow_anonymous = false to turn anonymous access off"
        )
    return entry


def kudos_grant(config: Config, where: Target, user: str, amount: float) -> list[str]:
    _check_amount(amount, "N")

    def grant(store: Store) -> tuple[UserRecord, tuple[float, float]]:
        entry = resolve_user(store, user)
        return entry, store.grant_kudos(
            user_id=entry.id, amount=amount, now=time.time(), actor=audit.CLI_ACTOR
        )

    entry, (before, after) = run(config, where, grant)
    return [
        f"database: {where.shown}",
        f"user {entry.handle}: {amount:+g} kudos, {before:g} -> {after:g}.",
    ]


def _check_amount(amount: float, name: str) -> None:
    if not math.isfinite(amount) or abs(amount) > 1e12:
        raise Refused(f"{name}: expected a number of kudos, got {amount}")


def workers_list(config: Config, where: Target) -> list[str]:
    now = time.time()
    entries = run(config, where, lambda store: store.list_all_workers())
    rows = [
        (
            w.name,
            w.id,
            f"{w.owner}#{w.owner_id}",
            _state(w, now),
            _ago(now - w.last_check_in),
            ",".join(w.models),
            w.chat_model or "-",
            str(w.threads),
            str(w.requests_fulfilled),
        )
        for w in entries
    ]
    header = ("NAME", "ID", "OWNER", "STATE", "LAST POP", "MODELS", "CHAT", "THREADS", "JOBS")
    if not rows:
        return [f"database: {where.shown}", "no workers yet: a worker appears with its first pop"]
    return [f"database: {where.shown}", *_table(header, rows)]


def _state(worker: WorkerRecord, now: float) -> str:
    if worker.maintenance:
        return "maintenance"
    return "online" if is_online(worker.online_until, now) else "offline"


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    if seconds < 172800:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} days ago"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


# modes ----------------------------------------------------------------------------

# The modes by their CLI name (``hordelite modes set MODE on|off``).
MODE_NAMES = ("maintenance", "invite_only", "raid")


def modes_show(config: Config, where: Target) -> list[str]:
    modes = run(config, where, lambda store: store.read_modes_sync())
    return [f"database: {where.shown}", *_mode_lines(modes)]


def modes_set(config: Config, where: Target, mode: str, state: str) -> list[str]:
    if mode not in MODE_NAMES:
        raise Refused(f"MODE: expected one of {', '.join(MODE_NAMES)}, got {mode!r}")
    if state not in ("on", "off"):
        raise Refused(f"STATE: expected on or off, got {state!r}")
    changes = {mode: state == "on"}
    _, after = run(
        config, where, lambda store: store.set_modes_sync(changes=changes, now=time.time())
    )
    return [
        f"database: {where.shown}",
        *_mode_lines(after),
        "every serving process sees the change within 2 s",
    ]


def _mode_lines(modes: Modes) -> list[str]:
    return [f"{name}: {'on' if getattr(modes, name) else 'off'}" for name in MODE_NAMES]


# db upgrade -----------------------------------------------------------------------


def db_upgrade(config: Config, where: Target) -> list[str]:
    db = Database(where.database, 1, prepare=config.storage.prepared_statements)
    try:
        _, (before, after) = _migrate(config, db, where)
    finally:
        db.dispose()
    return [f"database {where.shown}: schema version {before} -> {after}"]


def _migrate(config: Config, db: Database, where: Target) -> tuple[Store, tuple[int, int]]:
    """The horde's Store, and the schema versions before and after bringing it up to date."""
    try:
        horde = Horde(config, db)
        return horde.store, horde.migrate()
    except RuntimeError as exc:  # a schema newer than this hordelite
        raise Refused(f"{where.shown}: {exc}") from None


# audit ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AuditArgs(AuditText):
    """``hordelite audit``'s flags as given (checked by ``audit_read``): the
    query's, and ``--json``."""

    as_json: bool = False


def audit_read(config: Config, where: Target, args: AuditArgs) -> list[str]:
    """A page of the audit trail, newest first: a table, or with ``--json``
    one JSON object a line (the database and the next page's command then
    go to stderr, so that stdout is JSON alone)."""
    query = _audit_query(args, time.time())
    found = run(config, where, lambda store: store.audit_entries(query=query))
    notes = [f"database: {where.shown}"]
    if len(found) == query.limit:
        notes.append(f"next page: {_next_page(query, found[-1].id, args.as_json)}")
    elif not found:
        notes.append("no entries" + (" match" if query != AuditQuery(limit=query.limit) else ""))
    if args.as_json:
        for note in notes:
            print(note, file=sys.stderr)
        return [json.dumps(entry_json(e), ensure_ascii=False) for e in found]
    rows = [
        (
            str(e.id),
            _when(e.at),
            e.actor,
            e.address or "-",
            e.action,
            e.target or "-",
            json.dumps(dict(e.detail), ensure_ascii=False) if e.detail else "-",
        )
        for e in found
    ]
    header = ("ID", "WHEN (UTC)", "ACTOR", "ADDRESS", "ACTION", "TARGET", "DETAIL")
    table = _table(header, rows) if rows else []
    return [notes[0], *table, *notes[1:]]


def _audit_query(args: AuditArgs, now: float) -> AuditQuery:
    """The query of the flags; refused naming the flag of a bad value."""
    try:
        return parse_query(args, audit.ACTIONS, now, "--")
    except HordeError as refusal:
        raise Refused(refusal.message) from None


def _next_page(query: AuditQuery, last_id: int, as_json: bool) -> str:
    """The command of the page after the one shown: the same filters (a
    duration as the time it named), older than its last entry."""
    words = ["hordelite", "audit"]
    for action in query.actions:
        words += ["--action", action]
    if query.actor is not None:
        words += ["--actor", query.actor]
    if query.target is not None:
        words += ["--target", query.target]
    if query.since is not None:
        words += ["--since", _when(query.since, "T") + "Z"]
    if query.limit != DEFAULT_PAGE:
        words += ["--limit", str(query.limit)]
    words += ["--before", str(last_id)]
    if as_json:
        words.append("--json")
    return shlex.join(words)


def _when(at: float, sep: str = " ") -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(sep, "seconds")[:19]
