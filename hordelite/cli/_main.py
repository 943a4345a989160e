from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from hordelite.config import Config, load_config
from hordelite.errors import ConfigError, StorageUnavailable
from hordelite.horde.service import Horde, hash_key, new_api_key
from hordelite.server import open_server
from hordelite.storage import queries
from hordelite.storage.database import Database
from hordelite.worker import Worker, WorkerError

DEFAULT_CONFIG = "hordelite.toml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hordelite", description="A self-hostable AI Horde.")
    parser.add_argument(
        "--config",
        help=f"configuration file (default: ./{DEFAULT_CONFIG} when it exists)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the horde")
    serve.add_argument("--host", help="address to listen on (server.host)")
    serve.add_argument("--port", type=int, help="port to listen on (server.port)")
    serve.add_argument("--database", help="SQLite file or postgresql:// URL (storage.database)")
    serve.add_argument("--backend", choices=["trio", "asyncio"], help="event loop (server.backend)")

    keys = commands.add_parser("keys", help="manage API keys")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    create = key_commands.add_parser("create", help="create a user and print its new API key once")
    create.add_argument("name")
    create.add_argument("--kudos", type=float, default=0.0)
    create.add_argument("--admin", action="store_true")
    create.add_argument("--trusted", action="store_true")
    create.add_argument("--database", help="SQLite file or postgresql:// URL")

    _worker_parser(commands)

    db = commands.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="run pending schema migrations")
    upgrade.add_argument("--database", help="SQLite file or postgresql:// URL")
    return parser


# The worker's flags: (flag, type, [worker] key, help).
_WORKER_FLAGS: tuple[tuple[str, type, str, str], ...] = (
    ("--horde", str, "horde", "the horde's base URL"),
    ("--key", str, "key", "the worker owner's API key"),
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
    for key in ("host", "port", "backend"):
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
    args = _parser().parse_args(argv)
    try:
        config = _config(args)
        if args.command == "serve":
            return _serve(config)
        if args.command == "keys":
            return _create_key(config, args)
        if args.command == "worker":
            return _work(config)
        return _upgrade(config)
    except ConfigError as exc:
        print(f"hordelite: configuration error: {exc}", file=sys.stderr)
        return 2
    except StorageUnavailable as exc:
        print(f"hordelite: cannot open the database: {exc}", file=sys.stderr)
        return 1


def _serve(config: Config) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    anyio.run(_run, config, backend=config.server.backend)
    return 0


async def _run(config: Config) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_server(config) as running:
            print(
                f"hordelite {running.horde.heartbeat()['version']} serving at {running.url}",
                flush=True,
            )
            print(f"  database: {config.storage.database}", flush=True)
            print("  create a key: hordelite keys create NAME [--kudos N]", flush=True)
            print("  anonymous key: 0000000000 (Ctrl+C stops)", flush=True)
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


def _create_key(config: Config, args: argparse.Namespace) -> int:
    db = Database(config.storage.database, 1)
    try:
        Horde(config, db).migrate()
        key = new_api_key()
        user_id = db.run_sync(
            queries.create_user,
            True,
            args.name,
            hash_key(key),
            args.kudos,
            args.admin,
            args.trusted,
            _now(),
        )
    finally:
        db.dispose()
    print(f"user {args.name}#{user_id} created with {args.kudos:g} kudos.")
    print(f"API key (shown once, keep it): {key}")
    return 0


def _upgrade(config: Config) -> int:
    db = Database(config.storage.database, 1)
    try:
        before, after = Horde(config, db).migrate()
    finally:
        db.dispose()
    print(f"database {config.storage.database}: schema version {before} -> {after}")
    return 0


def _now() -> float:
    import time

    return time.time()
