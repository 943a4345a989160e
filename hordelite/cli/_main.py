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

    db = commands.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="run pending schema migrations")
    upgrade.add_argument("--database", help="SQLite file or postgresql:// URL")
    return parser


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
    return config.replace(server=server, storage=storage)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = _config(args)
        if args.command == "serve":
            return _serve(config)
        if args.command == "keys":
            return _create_key(config, args)
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
