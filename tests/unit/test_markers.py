"""The ``postgres`` marker selects exactly the tests that use the PostgreSQL
test server: ``-m postgres`` runs them alone, ``-m "not postgres"`` runs the
rest (pytest collects in a child process, as a developer's command would)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A parametrised fixture (storage), a parametrised fixture and direct uses
# (the CLI), and a direct use in an integration test.
FILES = (
    "tests/storage/test_migrations.py",
    "tests/unit/test_cli.py",
    "tests/integration/test_chat_write_lock.py",
)


def collected(*options: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *options, *FILES],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: none selected
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_the_postgres_marker_selects_the_postgresql_tests_and_not_postgres_the_others() -> None:
    postgres = collected("-m", "postgres")
    others = collected("-m", "not postgres")
    assert postgres
    assert others
    for test in postgres | others:
        if "postgresql" in test.split("[")[-1]:
            assert test in postgres, test
        if "sqlite" in test.split("[")[-1]:
            assert test in others, test
    # Tests that take the server's fixture directly, with no parameter to tell.
    assert any("test_a_postgresql_password_is_never_printed" in t for t in postgres)
    assert any("test_on_postgresql_a_reply_is_verified" in t for t in postgres)
