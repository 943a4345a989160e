"""Moderation, black box: a fresh ``hordelite serve`` subprocess on SQLite
and on PostgreSQL (a schema of its own), reached over HTTP as clients
behind a trusted proxy reach it (``server.trusted_proxies`` is 127.0.0.1,
so each request's X-Forwarded-For is its client's address), and the
``hordelite`` commands run as the operator runs them, in subprocesses on
the same database.

The fixture ``moderated`` is the harness: a running horde with an admin
(created by ``hordelite keys create --admin``), its ``cli(...)`` and
``client(address)``. Scenarios:

* an admin's user edit and worker pause through the routes, and a
  ``hordelite kudos grant`` at the CLI, each appear in ``hordelite audit``
  with its actor and address (the forwarded one for the routes, none for
  the CLI);
* an admin's timeout of a range through the AI Horde's route refuses a
  client in it (403 TimeoutIP), ``hordelite addresses list`` and
  ``hordelite audit`` show it, and ``hordelite addresses lift`` is
  enforced by the running horde within seconds;
* a prompt filter and maintenance mode set by an admin through the AI
  Horde's routes refuse a client's request (400 CorruptPrompt, nothing
  charged, the match not echoed, and the address timed out for it; 400
  MaintenanceMode), and the filter, the refusal, the timeout and the mode
  appear in ``hordelite audit`` with their actor
  and address, the prompt nowhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration._helpers import ServeProcess, run_hordelite

MODEL = "blackbox-model"


@dataclasses.dataclass
class Moderated:
    """A running ``hordelite serve`` and its operator's view.

    ``url``: where it serves; ``config``: its config file (every ``cli``
    command is given it, so each finds the same database); ``admin_key`` /
    ``admin``: the admin created at the CLI and its ``name#id``."""

    url: str
    config: Path
    admin_key: str
    admin: str

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``hordelite --config CONFIG argv...``."""
        return run_hordelite(
            "--config", str(self.config), *argv, cwd=self.config.parent, timeout=60
        )

    def create_user(self, name: str, *flags: str) -> tuple[str, str]:
        """A user created at the CLI: its key and ``name#id``."""
        done = self.cli("keys", "create", name, *flags)
        assert done.returncode == 0, done.stderr
        created = re.search(r"user (\S+#\d+) created", done.stdout)
        key = re.search(r"API key \(shown once, keep it\): (\S+)", done.stdout)
        assert created, done.stdout
        assert key, done.stdout
        return key.group(1), created.group(1)

    def audit(self, *flags: str) -> list[dict[str, Any]]:
        """``hordelite audit --json`` and its entries, newest first."""
        done = self.cli("audit", "--json", *flags)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    def client(self, address: str, key: str | None = None) -> httpx.Client:
        """A client whose requests come, through the trusted proxy, from
        ``address``, under ``key`` (the admin's by default)."""
        headers = {"X-Forwarded-For": address, "apikey": key or self.admin_key}
        return httpx.Client(base_url=f"{self.url}/api/v2", headers=headers, timeout=10)


def write_config(folder: Path, database: str, **sections: dict[str, Any]) -> Path:
    """A config file: the horde on a free port of 127.0.0.1, believing
    127.0.0.1's forwarded headers, on ``database``; ``sections`` add keys
    (``horde={"allow_anonymous": False}``)."""
    base: dict[str, dict[str, Any]] = {
        "server": {"host": "127.0.0.1", "port": 0, "trusted_proxies": "127.0.0.1"},
        "storage": {"database": database},
    }
    for name, keys in sections.items():
        base.setdefault(name, {}).update(keys)
    lines: list[str] = []
    for name, keys in base.items():
        lines.append(f"[{name}]")
        # A JSON string, number or boolean is TOML's too.
        lines += [f"{key} = {json.dumps(value)}" for key, value in keys.items()]
    config = folder / "hordelite.toml"
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return config


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def blackbox_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database no horde used yet: a SQLite file in the test's folder, or
    a fresh PostgreSQL schema (``serve`` migrates it, as in production)."""
    if request.param == "postgresql":
        return str(request.getfixturevalue("postgres_schema_url"))
    return str(tmp_path / "horde.db")


@contextlib.contextmanager
def serve_moderated(folder: Path, database: str, **sections: dict[str, Any]) -> Iterator[Moderated]:
    """A fresh horde served from ``folder`` on ``database``, with an admin
    created at the CLI once it runs; stopped at the block's end."""
    config = write_config(folder, database, **sections)
    served = ServeProcess(config)
    try:
        horde = Moderated(served.url, config, "", "")
        horde.admin_key, horde.admin = horde.create_user("moderator", "--admin")
        yield horde
    finally:
        served.close()


@pytest.fixture
def moderated(tmp_path: Path, blackbox_database: str) -> Iterator[Moderated]:
    """The harness: a fresh ``hordelite serve`` on SQLite and on PostgreSQL,
    with an admin. A test that needs other settings calls
    ``serve_moderated(tmp_path, blackbox_database, horde={...})`` itself."""
    with serve_moderated(tmp_path, blackbox_database) as horde:
        yield horde


# Scenarios --------------------------------------------------------------------------


def _worker(horde: Moderated, key: str) -> str:
    """A worker of ``key``'s user, registered by its first pop; its id."""
    with httpx.Client(base_url=f"{horde.url}/api/v2", timeout=10) as client:
        pop = client.post(
            "/generate/text/pop",
            headers={"apikey": key},
            json={
                "name": "blackbox-worker",
                "models": [MODEL],
                "max_length": 64,
                "max_context_length": 1024,
                "bridge_agent": "blackbox-worker:1:test",
            },
        )
        assert pop.status_code == 200, pop.text
        found = client.get("/workers/name/blackbox-worker")
        assert found.status_code == 200, found.text
        return str(found.json()["id"])


def test_route_and_cli_actions_appear_in_hordelite_audit_with_actor_and_address(
    moderated: Moderated,
) -> None:
    owner_key, owner = moderated.create_user("owner")
    worker_id = _worker(moderated, owner_key)
    owner_id = owner.split("#")[1]
    with moderated.client("203.0.113.50") as client:
        edited = client.put(f"/users/{owner_id}", json={"trusted": True, "concurrency": 4})
        assert edited.status_code == 200, edited.text
    with moderated.client("2001:db8::7") as client:
        paused = client.put(f"/workers/{worker_id}", json={"paused": True})
        assert paused.status_code == 200, paused.text
    granted = moderated.cli("kudos", "grant", owner, "12")
    assert granted.returncode == 0, granted.stderr

    admin_id = int(moderated.admin.split("#")[1])
    moderation = moderated.audit("--action", "user.edit,worker.pause,kudos.grant")
    assert [
        (e["action"], e["actor"], e["actor_id"], e["address"], e["target"]) for e in moderation
    ] == [
        ("kudos.grant", "cli", None, "", owner),
        # An IPv6 client as the horde counts it: its /64.
        ("worker.pause", moderated.admin, admin_id, "2001:db8::/64", worker_id),
        ("user.edit", moderated.admin, admin_id, "203.0.113.50", owner),
    ]
    assert moderation[0]["detail"] == {"amount": 12.0, "before": 0.0, "after": 12.0}
    assert moderation[1]["detail"] == {"name": "blackbox-worker", "paused": [False, True]}
    assert moderation[2]["detail"] == {"concurrency": [None, 4], "trusted": [False, True]}

    # The table an operator reads, and the admin route, say the same.
    table = moderated.cli("audit", "--actor", moderated.admin)
    assert table.returncode == 0, table.stderr
    rows = [line.split() for line in table.stdout.splitlines()[2:]]
    assert [(r[3], r[4], r[5]) for r in rows] == [
        (moderated.admin, "2001:db8::/64", "worker.pause"),
        (moderated.admin, "203.0.113.50", "user.edit"),
    ]
    with moderated.client("203.0.113.50") as client:
        read = client.get("/operations/audit", params={"action": "worker.pause"})
        assert read.status_code == 200, read.text
        assert [e["id"] for e in read.json()] == [moderation[1]["id"]]


def test_an_address_timed_out_by_a_route_and_lifted_at_the_cli(moderated: Moderated) -> None:
    requester_key, _ = moderated.create_user("requester")
    text = {"prompt": "Hello", "params": {"max_length": 16}, "models": [MODEL]}
    with moderated.client("203.0.113.70") as admin:
        timed = admin.post("/operations/ipaddr", json={"ipaddr": "203.0.113.0/24", "hours": 2})
        assert (timed.status_code, timed.json()) == (200, {"message": "OK"})
    with moderated.client("203.0.113.9", requester_key) as flooder:
        refused = flooder.post("/generate/text/async", json=text)
        assert (refused.status_code, refused.json()["rc"]) == (403, "TimeoutIP"), refused.text
        assert re.search(r"for 7(199|200) more seconds", refused.json()["message"])
    listed = moderated.cli("addresses", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[2].split()[:3] == ["203.0.113.0/24", "2.0", "h"]
    entries = moderated.audit("--action", "address.timeout")
    assert [(e["actor"], e["address"], e["target"]) for e in entries] == [
        (moderated.admin, "203.0.113.70", "203.0.113.0/24")
    ]

    lifted = moderated.cli("addresses", "lift", "203.0.113.0/24")
    assert lifted.returncode == 0, lifted.stderr
    # The running horde sees the change within seconds (it polls the
    # rules' version); polled with a deadline.
    deadline = time.monotonic() + 20.0
    with moderated.client("203.0.113.9", requester_key) as requester:
        while (status := requester.post("/generate/text/async", json=text).status_code) == 403:
            assert time.monotonic() < deadline, "the lift was not enforced within 20 s"
            time.sleep(0.05)
        assert status == 202
    assert moderated.audit("--action", "address.lift")[0]["actor"] == "cli"


def test_a_filter_and_maintenance_set_through_the_routes_refuse_and_are_audited(
    moderated: Moderated,
) -> None:
    requester_key, requester = moderated.create_user("writer", "--kudos", "50")
    text = {"params": {"max_length": 16}, "models": [MODEL]}
    with moderated.client("203.0.113.80") as admin:
        made = admin.put("/filters", json={"regex": "forbidden ?words", "filter_type": 10})
        assert made.status_code == 201, made.text
    with moderated.client("198.51.100.4", requester_key) as writer:
        refused = writer.post("/generate/text/async", json={**text, "prompt": "Forbidden  WORDS"})
        assert (refused.status_code, refused.json()["rc"]) == (400, "CorruptPrompt")
        assert "forbidden" not in refused.json()["message"].lower()  # the match is not echoed
        assert writer.get("/find_user").json()["kudos"] == 50  # nothing charged
        # The refusal is its address's offence: timed out, however clean.
        again = writer.post("/generate/text/async", json={**text, "prompt": "Fine words"})
        assert (again.status_code, again.json()["rc"]) == (403, "TimeoutIP")
    with moderated.client("198.51.100.5", requester_key) as writer:
        passed = writer.post("/generate/text/async", json={**text, "prompt": "Fine words"})
        assert passed.status_code == 202, passed.text

    with moderated.client("203.0.113.80") as admin:
        on = admin.put("/status/modes", json={"maintenance_mode": True})
        assert on.status_code == 200, on.text
    with moderated.client("198.51.100.5", requester_key) as writer:
        closed = writer.post("/generate/text/async", json={**text, "prompt": "Fine words"})
        assert (closed.status_code, closed.json()["rc"]) == (400, "MaintenanceMode")

    entries = moderated.audit("--action", "filter.create,request.refused,address.timeout,mode.set")
    assert [(e["action"], e["actor"], e["address"], e["target"]) for e in entries] == [
        ("mode.set", moderated.admin, "203.0.113.80", "horde"),
        ("address.timeout", "horde", "", "198.51.100.4"),
        ("request.refused", requester, "198.51.100.4", "filter:1"),
        ("filter.create", moderated.admin, "203.0.113.80", "filter:1"),
    ]
    assert "Forbidden" not in json.dumps(entries)  # the trail keeps no prompt
