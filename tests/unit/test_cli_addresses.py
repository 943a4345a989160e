"""``hordelite addresses list|timeout|block|lift``: the operator's timeouts
and blocks at the shell, audited as ``cli``, enforced by a running horde."""

from __future__ import annotations

from pathlib import Path

import pytest

from hordelite.cli import main
from hordelite.config import Config
from hordelite.contract.limits import ADDRESS_RULES_SECONDS
from hordelite.storage import audit
from hordelite.storage.database import Database
from hordelite.testing import FakeTextWorker, open_horde
from tests.integration._helpers import eventually
from tests.unit._cli_isolation import isolated  # noqa: F401 (autouse)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> str:
    url = (
        str(request.getfixturevalue("postgres_schema_url"))
        if request.param == "postgresql"
        else str(tmp_path / "cli.db")
    )
    assert main(["db", "upgrade", "--database", url]) == 0
    capsys.readouterr()
    return url


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def audit_trail(database: str) -> list[audit.AuditEntry]:
    db = Database(database, 1)
    try:
        return db.run_sync(audit.entries, False)
    finally:
        db.dispose()


def test_timeout_block_list_and_lift_each_audited_as_cli(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, "addresses", "list", "--database", database)
    assert (code, out.splitlines()[-1]) == (0, "no address is timed out or blocked")
    code, out, _ = cli(
        capsys, "addresses", "timeout", "2001:db8:1:2::7", "--hours", "2", "--database", database
    )
    assert (code, out.splitlines()[-1]) == (0, "2001:db8:1:2::/64 timed out for 2 h.")
    code, out, _ = cli(capsys, "addresses", "block", "198.51.100.9/24", "--database", database)
    assert (code, out.splitlines()[-1]) == (0, "198.51.100.0/24 blocked until lifted.")
    code, out, _ = cli(capsys, "addresses", "list", "--database", database)
    lines = out.splitlines()[1:]
    assert lines[0].split() == ["ADDRESS", "LEFT", "BY"]
    assert lines[1].split() == ["198.51.100.0/24", "blocked", "operator"]
    assert lines[2].split()[0] == "2001:db8:1:2::/64"
    assert lines[2].split()[1] in ("2.0", "1.9")  # hours left
    code, out, _ = cli(capsys, "addresses", "lift", "198.51.100.0/24", "--database", database)
    assert (code, out.splitlines()[-1]) == (0, "198.51.100.0/24 lifted.")
    code, out, _ = cli(capsys, "addresses", "lift", "198.51.100.0/24", "--database", database)
    assert out.splitlines()[-1] == "198.51.100.0/24 had no timeout or block."
    entries = audit_trail(database)
    assert [(e.action, e.target, e.actor) for e in reversed(entries)] == [
        ("address.timeout", "2001:db8:1:2::/64", "cli"),
        ("address.block", "198.51.100.0/24", "cli"),
        ("address.lift", "198.51.100.0/24", "cli"),
        ("address.lift", "198.51.100.0/24", "cli"),
    ]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("timeout", "nowhere", "--hours", "1"), "ADDRESS: 'nowhere' is not an IP address"),
        (("timeout", "203.0.113.7", "--hours", "0"), "--hours: expected more than 0"),
        (("timeout", "203.0.113.7", "--hours", "nan"), "--hours: expected more than 0"),
        (("block", "1.2.3.4/33"), "ADDRESS:"),
    ],
)
def test_a_bad_address_or_duration_is_refused_in_one_line(
    database: str, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], says: str
) -> None:
    code, _, err = cli(capsys, "addresses", *argv, "--database", database)
    assert code == 1
    assert err.startswith(f"hordelite: {says}")
    assert len(err.splitlines()) == 1
    assert audit_trail(database) == []


@pytest.mark.anyio
async def test_a_running_horde_enforces_a_block_from_the_shell_within_seconds(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A worker's pops poll it: they queue nothing, so no budget fills (and
    # no offence times the address out) meanwhile.
    config = Config().replace(server={"trusted_proxies": "127.0.0.1"})
    async with open_horde(config=config, database=database) as horde:
        owner = await horde.create_key("bob")
        async with FakeTextWorker(horde.url, owner, models=["m"]) as worker:
            worker.client.headers["X-Forwarded-For"] = "203.0.113.7"

            async def status() -> int:
                response = await worker.client.post("/generate/text/pop", json=worker.pop_body())
                return response.status_code

            assert await status() == 200
            assert main(["addresses", "block", "203.0.113.0/24", "--database", database]) == 0

            async def refused() -> bool:
                return await status() == 403

            await eventually(refused, within=10 * ADDRESS_RULES_SECONDS)
