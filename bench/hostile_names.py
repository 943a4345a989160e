"""A hostile user against names and an admin's pause, black-box (issue 35,
findings 8; decision 0073), on a fresh default ``hordelite serve``.

1. A registered user renames itself (``PUT /api/v2/users/{id}``) onto
   another user's exact name, the admin's, "Anonymous", a case variant, a
   full-width look-alike, the name with a zero-width space, a right-to-left
   override and a line separator. Prints each answer, then runs
   ``hordelite kudos grant <name> 5`` on the name taken.
2. An admin pauses a worker; its owner deletes it and pops again under the
   same name while a request waits. Prints whether the new worker is paused
   and whether it got the job.

    python bench/hostile_names.py --port 7170 --dir /tmp/hostile-names

Creates the database under ``--dir`` (removed first), starts the server on
127.0.0.1:``--port`` and stops it at the end. ``--python`` runs another
interpreter (another checkout's, say, with PYTHONPATH set).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

MODEL = "hostile/model"
RENAMES = [
    ("another user's exact name", "req2"),
    ("the admin's name", "root"),
    ("the anonymous user's name", "Anonymous"),
    ("a case variant", "REQ2"),
    ("a full-width look-alike", "\uff52\uff45\uff51\uff12"),
    ("a zero-width space inside", "req\u200b2"),
    ("a right-to-left override", "\u202egnp.exe"),
    ("a line separator", "a\u2028b"),
]


def cli(python: list[str], config: Path, *args: str) -> str:
    done = subprocess.run(
        [*python, "-m", "hordelite", "--config", str(config), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    return (done.stdout + done.stderr).strip()


def create(python: list[str], config: Path, name: str, *flags: str) -> tuple[int, str]:
    out = cli(python, config, "keys", "create", name, "--kudos", "100", *flags)
    key = re.search(r"API key \(shown once, keep it\): (\S+)", out)
    handle = re.search(r"user (\S+)#(\d+) created", out)
    if key is None or handle is None:
        raise SystemExit(out)
    return int(handle.group(2)), key.group(1)


def wait_up(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/api/v2/status/heartbeat", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("the server did not start")


def renames(http: httpx.Client, user_id: int, key: str) -> int:
    accepted = 0
    for what, name in RENAMES:
        r = http.put(f"/api/v2/users/{user_id}", json={"username": name}, headers={"apikey": key})
        body: dict[str, Any] = r.json()
        ok = r.status_code == 200
        accepted += ok
        print(
            f"  {what:28} {name!r:22} -> {r.status_code} {body.get('rc', '')} "
            f"{body.get('message', '')[:70]}"
        )
    return accepted


def pop(http: httpx.Client, key: str) -> dict[str, Any]:
    body = {"name": "owned-worker", "models": [MODEL], "max_length": 64, "max_context_length": 4096}
    r = http.post("/api/v2/generate/text/pop", json=body, headers={"apikey": key})
    return {"status": r.status_code, **r.json()}


def pause_evasion(http: httpx.Client, admin: str, owner: str, requester: str) -> None:
    first = pop(http, owner)
    workers = http.get("/api/v2/workers", params={"type": "text"}).json()
    worker_id = next(w["id"] for w in workers if w["name"] == "owned-worker")
    r = http.put(f"/api/v2/workers/{worker_id}", json={"paused": True}, headers={"apikey": admin})
    print(f"  first pop {first['status']}; admin pauses it: {r.status_code} {r.json()}")
    body = {"prompt": "Say hi.", "params": {"max_length": 16}, "models": [MODEL]}
    r = http.post("/api/v2/generate/text/async", json=body, headers={"apikey": requester})
    print(f"  a request waits: {r.status_code}")
    paused_pop = pop(http, owner)
    print(f"  the paused worker pops: job {paused_pop.get('id')}")
    r = http.delete(f"/api/v2/workers/{worker_id}", headers={"apikey": owner})
    print(f"  its owner deletes it: {r.status_code}")
    again = pop(http, owner)
    if again.get("id") is None:  # a first pop registers; the next one claims
        again = pop(http, owner)
    workers = http.get("/api/v2/workers", params={"type": "text"}).json()
    new = next((w for w in workers if w["name"] == "owned-worker"), {})
    print(
        f"  popped again under the name: {again['status']}, job {again.get('id')}, "
        f"new worker paused: {new.get('paused')}, maintenance: {new.get('maintenance_mode')}"
    )
    print(f"PAUSE EVADED: {again.get('id') is not None}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=7170)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/hostile-names"))
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    python = [args.python]
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    config = args.dir / "hordelite.toml"
    database = args.dir / "horde.db"
    config.write_text(
        f'[server]\nhost = "127.0.0.1"\nport = {args.port}\n'
        f"[storage]\ndatabase = {json.dumps(str(database))}\n",
        encoding="utf-8",
    )
    print(cli(python, config, "db", "upgrade"))
    _, admin = create(python, config, "root", "--admin")
    create(python, config, "req2")
    mallory_id, mallory = create(python, config, "mallory")
    _, owner = create(python, config, "owner")
    _, requester = create(python, config, "requester")
    log = (args.dir / "serve.log").open("w")
    server = subprocess.Popen(
        [*python, "-m", "hordelite", "--config", str(config), "serve"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=os.environ.copy(),
    )
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_up(url, time.monotonic() + 30)
        with httpx.Client(base_url=url, timeout=10) as http:
            print("renames of mallory:")
            accepted = renames(http, mallory_id, mallory)
            print(f"RENAMES ACCEPTED: {accepted} of {len(RENAMES)}")
            http.put(
                f"/api/v2/users/{mallory_id}",
                json={"username": "req2"},
                headers={"apikey": mallory},
            )
            print("hordelite kudos grant req2 5:")
            print("  " + cli(python, config, "kudos", "grant", "req2", "5").replace("\n", "\n  "))
            print("pause evasion:")
            pause_evasion(http, admin, owner, requester)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


if __name__ == "__main__":
    main()
