"""The horde's own CPU per text and chat cycle, in process, without HTTP.

A cycle is what a requester and a worker ask of the horde for one request:
queue it, pop it, submit the reply, read the status twice (as polling
clients do). This runs cycles straight through ``Horde``'s in-process
methods on a fresh SQLite file (trio, in-process signals), so what it
measures is the service, storage and contract work of a cycle: the part a
change to the horde's structure moves, and that the HTTP stack hides in
text_cycle.py's figures. A third figure, ``http``, is the text cycle over
real HTTP to an ``open_horde`` in the same process (httpx as the client,
whose work counts too and is the same in every tree).

With ``--against TREE`` (another checkout of hordelite, e.g. a worktree of
an older commit) it alternates rounds between this checkout and TREE, each
round a fresh child process (``PYTHONPATH`` set to the tree's root), and
prints each round's figures, their medians and the ratio of this checkout's
to TREE's, measured in the same run.

    .venv/bin/python bench/service_cycle.py [--cycles N]
    .venv/bin/python bench/service_cycle.py --against ../old-tree --rounds 6
    .venv/bin/python bench/service_cycle.py --against ../old-tree --instructions --cycles 100

CPU time on a shared machine drifts by tens of percent between rounds;
``--instructions`` counts instead (valgrind's callgrind, about fifty times
slower), which gives the same figure run after run.

``--filters N`` gives every horde N prompt filters (bench/filters.py's
rules, none matching the cycles' prompts) before its cycles, so that the
cycles pay for the screen of every prompt and message; a tree without
prompt filters runs without them:

    .venv/bin/python bench/service_cycle.py --against ../old-tree --instructions --filters 100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (  # bench/ is the script's folder, so on sys.path
    POSTGRES_ENV,
    REDIS_DB,
    REDIS_ENV,
    STORAGES,
    never_refusing_budgets,
    storage_urls,
)

ROOT = Path(__file__).resolve().parent.parent
# text and chat: through the horde's methods; http: the text cycle over real
# HTTP to an open_horde in the same process (httpx; the client's work is
# counted too, the same in every tree).
KINDS = ("text", "chat", "http")
MODEL = "bench-model"
AGENT = "bench:1:service_cycle"
CHAT_FEATURES = ["json_schema", "structured_output_enforced", "prompt_overflow_refused"]
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}


def text_body(n: int) -> dict[str, Any]:
    return {"prompt": f"Once upon a time {n}", "params": {"max_length": 32}, "models": [MODEL]}


def chat_body(n: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Answer with one JSON object."},
            {"role": "user", "content": f"Name a colour. {n}"},
        ],
        "max_tokens": 32,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "colour", "strict": True, "schema": SCHEMA},
        },
    }


POP = {"name": "bench-worker", "models": [MODEL], "max_length": 512, "max_context_length": 4096}
CHAT_POP = {
    **POP,
    "chat_jobs": True,
    "chat_features": CHAT_FEATURES,
    "chat_limits": {"max_context_length": 4096, "max_length": 512},
    "model_id": MODEL,
    "image_transports": [],
}


# Prompt filters each horde holds (--filters), set in the process before it runs.
FILTERS = [0]


async def add_filters(horde: Any) -> None:
    """FILTERS[0] prompt filters, written by an admin, when the tree has them."""
    if not FILTERS[0] or not hasattr(horde, "moderation"):
        return
    from filters import _rules  # bench/filters.py, beside this script

    _, admin = await horde.create_user("bench-admin", admin=True)
    for regex in _rules(FILTERS[0]):
        await horde.moderation.create(admin, {"regex": regex, "filter_type": 10}, "")


def budgets() -> dict[str, dict[str, int]]:
    """The [budgets] section of a tree that has them, never refusing."""
    section = never_refusing_budgets()
    return {"budgets": section} if section else {}


async def cycles(kind: str, count: int, warmup: int, storage: str = "sqlite") -> float:
    """CPU microseconds per ``kind`` cycle, over ``count`` after ``warmup``."""
    if kind == "http":
        return await http_cycles(count, warmup, storage)
    from hordelite.horde.service import Horde
    from hordelite.signals import open_signals
    from hordelite.storage.database import Database

    with (
        tempfile.TemporaryDirectory(prefix="hordelite-bench-") as tmp,
        storage_urls(storage, str(Path(tmp) / "horde.db")) as (database, signals_url),
    ):
        config = _config(database, signals_url)
        db = Database(database)
        async with open_signals(signals_url) as signals:
            horde = Horde(config, db, signals=signals)
            horde.migrate()
            _, key = await horde.create_user("bench", kudos=1e9, trusted=True)
            await add_filters(horde)
            await horde.pop(key, CHAT_POP if kind == "chat" else POP)  # the worker comes online
            started = 0.0
            for n in range(warmup + count):
                if n == warmup:
                    started = time.process_time()
                await one_cycle(horde, key, kind, n)
            spent = time.process_time() - started
        db.dispose()
    return spent / count * 1e6


def _config(database: str, signals_url: str) -> Any:
    from hordelite.config import Config

    return Config().replace(
        storage={"database": database}, signals={"url": signals_url}, **budgets()
    )


async def one_cycle(horde: Any, key: str, kind: str, n: int) -> None:
    if kind == "text":
        queued = await horde.submit_text(key, text_body(n), AGENT)
        job = (await horde.pop(key, POP)).job
        await horde.submit(key, {"id": job.id, "generation": "The end.", "state": "ok", "seed": 1})
        status = horde.text_status
    else:
        queued = await horde.submit_chat(key, chat_body(n), AGENT)
        job = (await horde.pop(key, CHAT_POP)).job
        reply = {
            "id": job.id,
            "model_id": job.model,
            "state": "ok",
            "message": {"role": "assistant", "content": '{"colour": "blue"}'},
            "finish_reason": "stop",
        }
        await horde.submit(key, reply)
        status = horde.chat_status
    for _ in range(2):
        answer = await status(queued.id)
    assert answer.done, answer


async def http_cycles(count: int, warmup: int, storage: str = "sqlite") -> float:
    """CPU microseconds per text cycle over HTTP (server and client)."""
    import httpx

    from hordelite.testing import open_horde

    with (
        tempfile.TemporaryDirectory(prefix="hordelite-bench-") as tmp,
        storage_urls(storage, str(Path(tmp) / "horde.db")) as (database, signals_url),
    ):
        config = _config(database, signals_url)
        async with open_horde(config=config) as horde:
            key = await horde.create_key("bench", kudos=1e9, trusted=True)
            await add_filters(horde.horde)
            base = horde.url + "/api/v2"
            async with httpx.AsyncClient(base_url=base, headers={"apikey": key}) as client:
                await client.post("/generate/text/pop", json=POP)  # the worker comes online
                started = 0.0
                for n in range(warmup + count):
                    if n == warmup:
                        started = time.process_time()
                    await one_http_cycle(client, n)
                spent = time.process_time() - started
    return spent / count * 1e6


async def one_http_cycle(client: Any, n: int) -> None:
    queued = (await client.post("/generate/text/async", json=text_body(n))).json()
    job = (await client.post("/generate/text/pop", json=POP)).json()
    submit = {"id": job["id"], "generation": "The end.", "state": "ok", "seed": 1}
    await client.post("/generate/text/submit", json=submit)
    for _ in range(2):
        status = (await client.get(f"/generate/text/status/{queued['id']}")).json()
    assert status["done"], status


def child(count: int, warmup: int, kinds: list[str], storage: str) -> dict[str, float]:
    import trio

    return {kind: trio.run(cycles, kind, count, warmup, storage) for kind in kinds}


def run_child(tree: Path, count: int, warmup: int, storage: str) -> dict[str, float]:
    """CPU microseconds per cycle of each kind, in a child on ``tree``."""
    out = subprocess.run(
        _child_command(count, warmup, ",".join(KINDS), storage),
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _child_command(count: int, warmup: int, kinds: str, storage: str = "sqlite") -> list[str]:
    return [
        sys.executable,
        str(Path(__file__)),
        "--child",
        "--cycles",
        str(count),
        "--warmup",
        str(warmup),
        "--kinds",
        kinds,
        "--storage",
        storage,
        "--filters",
        str(FILTERS[0]),
    ]


def instructions(
    tree: Path, count: int, warmup: int, storage: str = "sqlite", kinds: tuple[str, ...] = KINDS
) -> dict[str, float]:
    """Instructions per cycle of each kind, counted by valgrind's callgrind
    (repeatable whatever else the machine does): the difference between a
    child of ``warmup + count + 1`` cycles and one of ``warmup + 1``, so that
    start-up and imports cancel out."""
    per_kind = {}
    for kind in kinds:
        totals = []
        for cycles in (1, count + 1):
            with tempfile.TemporaryDirectory() as tmp:
                out = subprocess.run(
                    [
                        "valgrind",
                        "--tool=callgrind",
                        f"--callgrind-out-file={tmp}/callgrind.out",
                        *_child_command(cycles, warmup, kind, storage),
                    ],
                    env={**os.environ, "PYTHONPATH": str(tree)},
                    cwd=tree,
                    capture_output=True,
                    text=True,
                    check=True,
                )
            collected = next(line for line in out.stderr.splitlines() if "Collected" in line)
            totals.append(int(collected.rsplit(":", 1)[1]))
        per_kind[kind] = (totals[1] - totals[0]) / count
    return per_kind


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=1500, help="timed cycles per kind")
    parser.add_argument("--warmup", type=int, default=200, help="untimed cycles first")
    parser.add_argument("--against", type=Path, help="another hordelite checkout to alternate with")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per tree with --against")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per cycle under valgrind (one round per tree; slow, repeatable)",
    )
    parser.add_argument(
        "--storage",
        choices=STORAGES,
        default="sqlite",
        help="a fresh SQLite file (default); a new PostgreSQL schema "
        f"(${POSTGRES_ENV}); or that and Redis signals (${REDIS_ENV}, database {REDIS_DB})",
    )
    parser.add_argument(
        "--filters", type=int, default=0, help="prompt filters each horde holds (default 0)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help="the cycles to count with --instructions"
    )
    args = parser.parse_args()
    FILTERS[0] = args.filters
    if args.child:
        print(json.dumps(child(args.cycles, args.warmup, args.kinds.split(","), args.storage)))
        return 0
    trees = {"this": ROOT}
    if args.against is not None:
        trees["against"] = args.against.resolve()
    if args.instructions:
        return _report_instructions(trees, args.cycles, args.warmup, args.storage, args.kinds)
    rounds = args.rounds if args.against is not None else 1
    seen: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    print(_row("round", "tree", [f"{k} us/cycle" for k in KINDS]))
    for r in range(rounds):
        # Alternate which tree goes first, so drift in machine speed falls on both.
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in order:
            figures = run_child(trees[name], args.cycles, args.warmup, args.storage)
            seen[name].append(figures)
            print(_row(str(r + 1), name, [f"{figures[k]:.0f}" for k in KINDS]))
    medians = {
        name: {kind: statistics.median(f[kind] for f in runs) for kind in KINDS}
        for name, runs in seen.items()
    }
    for name, m in medians.items():
        print(_row("median", name, [f"{m[k]:.0f}" for k in KINDS]))
    _report_ratio(medians, 2)
    return 0


def _row(first: str, tree: str, cells: list[str]) -> str:
    return f"{first:<8}{tree:<10}" + "".join(f"{c:>18}" for c in cells)


def _report_ratio(figures: dict[str, dict[str, float]], digits: int) -> None:
    if "against" in figures:
        ratio = ", ".join(
            f"{k} {figures['this'][k] / figures['against'][k]:.{digits}f}" for k in figures["this"]
        )
        print(f"ratio this / against: {ratio}")
    print(f"command: python bench/service_cycle.py {' '.join(sys.argv[1:])}")


def _report_instructions(
    trees: dict[str, Path], count: int, warmup: int, storage: str, kinds: str
) -> int:
    chosen = tuple(kinds.split(","))
    counted = {
        name: instructions(tree, count, warmup, storage, chosen) for name, tree in trees.items()
    }
    print(_row("", "tree", [f"{k} instr/cycle" for k in chosen]))
    for name, c in counted.items():
        print(_row("", name, [f"{c[k]:,.0f}" for k in chosen]))
    _report_ratio(counted, 3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
