"""The fixture of the CLI tests: each command runs as an operator's would,
in a folder of its own, with no configuration from the checkout or the
shell. Imported by each CLI test module (``from ... import isolated``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No ./hordelite.toml from the checkout, no configuration from the shell.
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("HORDELITE_") and not name.startswith("HORDELITE_TEST_"):
            monkeypatch.delenv(name)
