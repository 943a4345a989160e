from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import anyio
from sqlalchemy.exc import SQLAlchemyError

from hordelite import __version__, pinned
from hordelite.cli import _addresses, _admin, _filters
from hordelite.cli._processes import Supervisor, serve_child
from hordelite.config import Config, load_config, processes_problem
from hordelite.contract.limits import ANONYMOUS_API_KEY
from hordelite.errors import ConfigError, StorageUnavailable
from hordelite.horde.service import Horde
from hordelite.http.server import base_url, claim_port, listen
from hordelite.server import blob_location, open_server
from hordelite.storage.database import Database
from hordelite.worker import Worker, WorkerError

DEFAULT_CONFIG = "hordelite.toml"


class _Parser(argparse.ArgumentParser):
    """A usage error is one line (and exit code 2), not the usage text."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hordelite", description="A self-hostable AI Horde.")
    parser.add_argument("--version", action="version", version=f"hordelite {__version__}")
    parser.add_argument(
        "--config",
        help=f"configuration file (default: ./{DEFAULT_CONFIG} when it exists)",
    )
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{serve,keys,kudos,workers,addresses,audit,filters,modes,worker,db}",
    )
    # The parent of every command that opens the database: each takes --database.
    database = _Parser(add_help=False)
    database.add_argument(
        "--database",
        help="SQLite file or postgresql:// URL (storage.database, HORDELITE_DATABASE_URL)",
    )

    _serve_parser(commands, database)
    _keys_parser(commands, database)
    _kudos_parser(commands, database)
    _command_group(commands, database, "workers")  # no arguments
    _addresses_parser(commands, database)
    _audit_parser(commands, database)
    _modes_parser(commands, database)
    _filters_parser(commands, database)
    _worker_parser(commands)
    _command_group(commands, database, "db")
    return parser


def _serve_parser(commands: Any, database: argparse.ArgumentParser) -> None:
    serve = commands.add_parser("serve", help="run the horde", parents=[database])
    serve.add_argument("--host", help="address to listen on (server.host)")
    serve.add_argument("--port", type=int, help="port to listen on (server.port)")
    serve.add_argument("--backend", choices=["trio", "asyncio"], help="event loop (server.backend)")
    serve.add_argument(
        "--processes",
        type=int,
        help="processes serving the port, each a whole horde (server.processes)",
    )
    # A serving process started by ``serve --processes N``: the inherited
    # listening socket and its control socket to the parent (cli/_processes.py).
    serve.add_argument("--socket-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--control-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--slot", type=int, default=0, help=argparse.SUPPRESS)


# The commands made of subcommands (``hordelite keys create NAME``): each
# one's help and its subcommands' (each opens the database). The
# subcommand chosen is ``args.<command>_command``, by which ``_subcommand``
# finds what ``_ADMIN`` runs.
_COMMAND_GROUPS: dict[str, tuple[str, dict[str, str]]] = {
    "keys": (
        "manage users and their API keys",
        {
            "list": "the users: id, name, kudos, whether the key is active",
            "create": "create a user and print its new API key once",
            "revoke": "make a user's key unusable",
            "rotate": "give a user a new key (printed once); the old one stops",
        },
    ),
    "kudos": (
        "change a user's kudos",
        {"grant": "add N kudos to a user (negative takes them away)"},
    ),
    "workers": (
        "the workers the horde knows",
        {"list": "every worker, online or not, with its owner"},
    ),
    "addresses": (
        "time out or block client addresses and ranges",
        {
            "list": "every timeout and block in force",
            "timeout": "refuse an address or range for some hours",
            "block": "refuse an address or range until lifted",
            "lift": "lift an address's or range's timeout or block",
        },
    ),
    "modes": (
        "the horde's maintenance, invite-only and raid modes",
        {"show": "the modes as stored", "set": "turn a mode on or off (audited as cli)"},
    ),
    "filters": (
        "prompt filters (docs/reference/filters.md)",
        {
            "list": "every filter",
            "add": "add a filter",
            "edit": "change a filter's fields",
            "remove": "delete a filter",
            "test": "what the filters would do with a prompt",
        },
    ),
    "db": (
        "database maintenance",
        {"upgrade": "create the database or run pending schema migrations"},
    ),
}


def _command_group(
    commands: Any, database: argparse.ArgumentParser, name: str
) -> dict[str, argparse.ArgumentParser]:
    """The command ``name`` of ``_COMMAND_GROUPS`` and its subcommands'
    parsers by name, for their arguments."""
    group_help, subcommands = _COMMAND_GROUPS[name]
    group = commands.add_parser(name, help=group_help)
    sub = group.add_subparsers(
        dest=f"{name}_command", required=True, metavar="{" + ",".join(subcommands) + "}"
    )
    return {
        command: sub.add_parser(command, help=text, parents=[database])
        for command, text in subcommands.items()
    }


def _keys_parser(commands: Any, database: argparse.ArgumentParser) -> None:
    keys = _command_group(commands, database, "keys")
    create = keys["create"]
    create.add_argument(
        "name", help="a name no other user has (compared ignoring case and look-alikes)"
    )
    create.add_argument("--kudos", type=float, default=0.0)
    create.add_argument("--admin", action="store_true")
    create.add_argument("--trusted", action="store_true")
    keys["revoke"].add_argument("user", help=_USER_HELP)
    keys["rotate"].add_argument("user", help=_USER_HELP)


def _kudos_parser(commands: Any, database: argparse.ArgumentParser) -> None:
    kudos = _command_group(commands, database, "kudos")
    kudos["grant"].add_argument("user", help=_USER_HELP)
    kudos["grant"].add_argument("amount", type=float, metavar="N")


def _addresses_parser(commands: Any, database: argparse.ArgumentParser) -> None:
    addresses = _command_group(commands, database, "addresses")
    for command in ("timeout", "block", "lift"):
        addresses[command].add_argument("address", help=_ADDRESS_HELP)
    addresses["timeout"].add_argument(
        "--hours", type=float, required=True, help="how long, in hours"
    )


_ADDRESS_HELP = "an IP address (an IPv6 one counts as its /64) or a CIDR range"


def _audit_parser(commands: Any, database: argparse.ArgumentParser) -> None:
    # Values are checked by _admin.audit_read: a bad one is refused in one
    # line naming its flag (exit 1), as the other operator commands refuse.
    audit = commands.add_parser(
        "audit",
        help="the audit trail: moderators' actions, newest first",
        parents=[database],
    )
    audit.add_argument(
        "--action",
        action="append",
        default=[],
        dest="audit_actions",
        metavar="ACTION",
        help="only these actions (repeat it, or a,b,c); see docs/reference/audit.md",
    )
    audit.add_argument("--actor", help="only this actor: NAME#ID, cli or horde")
    audit.add_argument("--target", help="only on this target (a user's NAME#ID, a worker's id)")
    audit.add_argument("--since", help="only since: a duration back (2h, 7d) or an ISO time")
    audit.add_argument("--before", metavar="ID", help="the next page: entries older than ID")
    audit.add_argument("--limit", help="entries a page (default 50, at most 500)")
    audit.add_argument("--json", action="store_true", help="one JSON object a line")


def _modes_parser(commands: Any, database: argparse.ArgumentParser) -> None:
    modes = _command_group(commands, database, "modes")
    modes["set"].add_argument(
        "mode", choices=_admin.MODE_NAMES, metavar="MODE", help="maintenance, invite_only or raid"
    )
    modes["set"].add_argument("state", choices=("on", "off"), metavar="STATE", help="on or off")


def _filters_parser(commands: Any, database: argparse.ArgumentParser) -> None:
    filters = _command_group(commands, database, "filters")
    listing = filters["list"]
    listing.add_argument("--type", type=int, dest="filter_type", help="only this filter type")
    listing.add_argument("--contains", help="only those whose regex or description has this")
    add = filters["add"]
    add.add_argument("regex", help="an RE2 regular expression, matched on normalised text")
    _filter_fields(add, required_type=True)
    edit = filters["edit"]
    edit.add_argument("filter_id", metavar="FILTER")
    edit.add_argument("--regex")
    _filter_fields(edit, required_type=False)
    filters["remove"].add_argument("filter_id", metavar="FILTER")
    filters["test"].add_argument("prompt")


def _filter_fields(parser: argparse.ArgumentParser, *, required_type: bool) -> None:
    parser.add_argument(
        "--type", type=int, dest="filter_type", required=required_type, help="10 to 29"
    )
    parser.add_argument("--action", choices=["refuse", "flag", "replace"])
    parser.add_argument("--replacement", help="what a replace filter puts in place of a match")
    parser.add_argument("--description")


def _filter_body(args: argparse.Namespace) -> dict[str, Any]:
    fields = ("regex", "filter_type", "action", "replacement", "description")
    return {name: getattr(args, name, None) for name in fields}


_USER_HELP = "the user: its id, NAME#ID, or its name"


# The worker's flags: (flag, type, [worker] key, help).
_WORKER_FLAGS: tuple[tuple[str, type, str, str], ...] = (
    ("--horde", str, "horde", "the horde's base URL"),
    (
        "--key",
        str,
        "key",
        "the worker owner's API key; prefer the environment variable HORDELITE_WORKER_KEY, "
        "since every user of the machine sees a flag in ps",
    ),
    ("--name", str, "name", "the worker's name on the horde"),
    ("--backend", str, "backend", "the backend's base URL (OpenAI-compatible), or fake"),
    ("--threads", int, "threads", "jobs served at once"),
    ("--features", str, "features", "optional chat features the backend implements, a,b,c"),
    ("--model-id", str, "model_id", "the model id to declare (default: the backend's)"),
    ("--context", int, "context", "context size in tokens (default: the backend's)"),
    ("--max-length", int, "max_length", "most tokens generated for one reply"),
    ("--tools-max-temperature", float, "tools_max_temperature", "declare a temperature clamp"),
    ("--template-overhead", int, "template_overhead", "tokens of a tool preamble"),
    ("--wait", float, "wait", "seconds a pop long-polls"),
    ("--grace-period", float, "grace_period", "seconds jobs get at SIGINT/SIGTERM"),
)


def _worker_parser(commands: Any) -> None:
    worker = commands.add_parser(
        "worker", help="serve chat and text jobs from an OpenAI-compatible backend"
    )
    for flag, kind, key, text in _WORKER_FLAGS:
        worker.add_argument(
            flag,
            type=kind,
            dest=f"worker_{key}",
            metavar=key.upper(),
            help=f"{text} (worker.{key})",
        )


def _config(args: argparse.Namespace) -> Config:
    path = args.config
    if path is None and Path(DEFAULT_CONFIG).is_file():
        path = DEFAULT_CONFIG
    config = load_config(path)
    server: dict[str, Any] = {}
    for key in ("host", "port", "backend", "processes"):
        if getattr(args, key, None) is not None:
            server[key] = getattr(args, key)
    storage = {"database": args.database} if getattr(args, "database", None) else {}
    worker = {
        key: getattr(args, f"worker_{key}")
        for _, _, key, _ in _WORKER_FLAGS
        if getattr(args, f"worker_{key}", None) is not None
    }
    return config.replace(server=server, storage=storage, worker=worker)


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "serve" and args.socket_fd is not None and args.control_fd is not None:
            return _serve_child(args.socket_fd, args.control_fd, args.slot)
        config = _config(args)
        if args.command == "serve":
            return _serve(config)
        if args.command == "worker":
            return _work(config)
        where = _admin.target(config, args.database, _config_file(args))
        for line in _ADMIN[(args.command, _subcommand(args))](config, where, args):
            print(line)
        return 0
    except ConfigError as exc:
        _refuse(f"configuration error: {exc}")
        return 2
    except StorageUnavailable as exc:
        _refuse(f"cannot open the database: {exc}")
        return 1
    except _admin.Refused as exc:
        _refuse(str(exc))
        return 1
    except SQLAlchemyError as exc:
        _refuse(f"database error: {getattr(exc, 'orig', None) or exc}")
        return 1


def _refuse(message: str) -> None:
    """One line on stderr: a refusal is never a traceback."""
    print(f"hordelite: {' '.join(message.split())}", file=sys.stderr)


def _subcommand(args: argparse.Namespace) -> str:
    return str(getattr(args, f"{args.command}_command", ""))


_ADMIN: dict[tuple[str, str], Callable[[Config, _admin.Target, argparse.Namespace], list[str]]] = {
    ("keys", "list"): lambda c, w, a: _admin.keys_list(c, w),
    ("keys", "create"): lambda c, w, a: _admin.keys_create(
        c, w, a.name, a.kudos, a.admin, a.trusted
    ),
    ("keys", "revoke"): lambda c, w, a: _admin.keys_revoke(c, w, a.user),
    ("keys", "rotate"): lambda c, w, a: _admin.keys_rotate(c, w, a.user),
    ("kudos", "grant"): lambda c, w, a: _admin.kudos_grant(c, w, a.user, a.amount),
    ("workers", "list"): lambda c, w, a: _admin.workers_list(c, w),
    ("addresses", "list"): lambda c, w, a: _addresses.addresses_list(c, w),
    ("addresses", "timeout"): lambda c, w, a: _addresses.addresses_timeout(
        c, w, a.address, a.hours
    ),
    ("addresses", "block"): lambda c, w, a: _addresses.addresses_block(c, w, a.address),
    ("addresses", "lift"): lambda c, w, a: _addresses.addresses_lift(c, w, a.address),
    ("audit", ""): lambda c, w, a: _admin.audit_read(
        c,
        w,
        _admin.AuditArgs(a.audit_actions, a.actor, a.target, a.since, a.before, a.limit, a.json),
    ),
    ("modes", "show"): lambda c, w, a: _admin.modes_show(c, w),
    ("modes", "set"): lambda c, w, a: _admin.modes_set(c, w, a.mode, a.state),
    ("filters", "list"): lambda c, w, a: _filters.filters_list(c, w, a.filter_type, a.contains),
    ("filters", "add"): lambda c, w, a: _filters.filters_add(c, w, _filter_body(a)),
    ("filters", "edit"): lambda c, w, a: _filters.filters_edit(c, w, a.filter_id, _filter_body(a)),
    ("filters", "remove"): lambda c, w, a: _filters.filters_remove(c, w, a.filter_id),
    ("filters", "test"): lambda c, w, a: _filters.filters_test(c, w, a.prompt),
    ("db", "upgrade"): lambda c, w, a: _admin.db_upgrade(c, w),
}


def _config_file(args: argparse.Namespace) -> str | None:
    if args.config is not None:
        return str(args.config)
    return DEFAULT_CONFIG if Path(DEFAULT_CONFIG).is_file() else None


def _serve(config: Config) -> int:
    problem = processes_problem(config)
    if problem is not None:  # before anything is bound or migrated
        raise ConfigError(problem)
    _log_setup()
    pinned.warn_untested(logging.getLogger("hordelite.pinned").warning)
    if config.server.processes > 1:
        return _serve_processes(config)
    _claim_metrics_port(config)
    with _listen_refused(config):
        anyio.run(_run, config, backend=config.server.backend)
    return 0


def _log_setup() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _serve_processes(config: Config) -> int:
    """Bind once, migrate once, then supervise the serving processes."""
    with contextlib.ExitStack() as stack:
        with _listen_refused(config):
            # The port held by nothing else (another horde's shared sockets
            # included), then one socket per process on it (port 0: the one
            # the kernel picked): the kernel spreads new connections over
            # them, where one shared socket would let one process accept
            # most of them.
            port = claim_port(config.server)
            same_port = dataclasses.replace(config.server, port=port)
            socks = [
                stack.enter_context(listen(same_port, shared=True))
                for _ in range(config.server.processes)
            ]
            first = socks[0]
        _claim_metrics_port(config)
        _migrate(config)
        lines = banner(config, base_url(first), __version__)
        return Supervisor(config, socks).run(lines)


def _claim_metrics_port(config: Config) -> None:
    """The metrics port, held by nothing else: each serving process binds it
    itself, with SO_REUSEPORT when there are several (server._serve_metrics),
    and its refusal names the metrics port, not the horde's."""
    if not (config.metrics.enabled and config.metrics.port):
        return
    metrics = dataclasses.replace(config.server, host=config.metrics.host, port=config.metrics.port)
    try:
        claim_port(metrics)
    except OSError as exc:
        message = _address_error(
            exc, f"{metrics.host}:{metrics.port}", "metrics.port", "metrics.host"
        )
        if message is None:
            raise
        raise _admin.Refused(message) from None


def _migrate(config: Config) -> None:
    db = Database(config.storage.database, 1, prepare=config.storage.prepared_statements)
    try:
        Horde(config, db).migrate()
    except RuntimeError as exc:  # a schema newer than this hordelite
        raise _admin.Refused(f"{_admin.shown_database(config.storage.database)}: {exc}") from None
    finally:
        db.dispose()


def _serve_child(socket_fd: int, control_fd: int, slot: int) -> int:
    _log_setup()
    return serve_child(socket_fd, control_fd, slot)


@contextlib.contextmanager
def _listen_refused(config: Config) -> Iterator[None]:
    """A socket the server could not listen on ends the command with one
    line (``_admin.Refused``), not a traceback; any other error goes on."""
    try:
        yield
    except Exception as exc:
        message = _listen_error(exc, config)
        if message is None:
            raise
        raise _admin.Refused(message) from None


def _listen_error(exc: BaseException, config: Config) -> str | None:
    """One line for a socket the server could not listen on (wrapped in
    exception groups by the task groups it went through), else None."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            message = _listen_error(inner, config)
            if message is not None:
                return message
        return None
    if not isinstance(exc, OSError):
        return None
    return _address_error(exc, f"{config.server.host}:{config.server.port}", "--port", "--host")


def _address_error(exc: OSError, where: str, port_option: str, host_option: str) -> str | None:
    """One line for an address that cannot be listened on, else None."""
    if exc.filename is not None:  # a file's error is no socket's
        return None
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: the port is in use (by another horde or program); "
            f"choose another with {port_option}"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {where}: no such address on this machine; "
            f"choose another with {host_option}"
        )
    if exc.errno == errno.EACCES:
        return (
            f"cannot listen on {where}: permission denied (ports below 1024 need privileges); "
            f"choose another with {port_option}"
        )
    return None


def banner(config: Config, url: str, version: str) -> list[str]:
    """What ``hordelite serve`` prints once it listens: no password, and
    the anonymous key only when anonymous access is on."""
    lines = [
        f"hordelite {version} serving at {url} (Ctrl+C stops)",
        f"  database: {_admin.shown_database(config.storage.database)}",
        # A folder made at start (with PostgreSQL, in the current directory
        # unless blobs.directory says): the operator should know of it, and keep it.
        f"  {blob_location(config)}",
        f"  native API: {url}/api/v2/ (horde_sdk: AI_HORDE_URL={url}/api/)",
        f"  OpenAI front: {url}/v1",
    ]
    if config.dashboard.enabled:
        lines.insert(1, f"  dashboard and chat playground: {url}/")
    if config.server.processes > 1:
        lines.append(
            f"  processes: {config.server.processes}, each a whole horde on this port "
            f"(process {os.getpid()} supervises them)"
        )
    if config.horde.allow_anonymous:
        lines.append(f"  anonymous key: {ANONYMOUS_API_KEY}")
    else:
        lines.append("  anonymous access: off (horde.allow_anonymous): every request needs a key")
    lines.append("  create a key: hordelite keys create NAME [--kudos N]")
    return lines


async def _run(config: Config) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_server(config) as running:
            version = running.horde.upkeep.heartbeat()["version"]
            for line in banner(config, running.url, version):
                print(line, flush=True)
            async for signum in signals:
                print(f"hordelite: {signal.Signals(signum).name}, stopping", flush=True)
                break


def _work(config: Config) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    try:
        worker = Worker(config.worker)
    except WorkerError as exc:
        raise ConfigError(str(exc)) from None
    try:
        anyio.run(_run_worker, worker, backend=config.server.backend)
    except WorkerError as exc:
        print(f"hordelite worker: {exc}", file=sys.stderr)
        return 1
    return 0


async def _run_worker(worker: Worker) -> None:
    """Serve until SIGINT/SIGTERM, then let the jobs in hand finish within
    the grace period (a second signal faults them at once)."""
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signals, worker)
            await worker.serve()
            tg.cancel_scope.cancel()
    except* WorkerError as group:
        raise group.exceptions[0] from None


async def _stop_on_signals(worker: Worker) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        received = 0
        async for signum in signals:
            received += 1
            name = signal.Signals(signum).name
            if received == 1:
                print(f"hordelite worker: {name}, stopping (again: fault the jobs now)", flush=True)
                worker.stop()
            else:
                worker.stop(0)
