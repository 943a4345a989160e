"""Every module of the package imports on its own.

An import cycle only shows when the cycle's modules are imported in a
particular order: the test imports each module first, in a fresh interpreter
with no other hordelite module loaded before it (third-party packages may stay
loaded between modules: only hordelite's own imports can form a cycle here).
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import hordelite

_SCRIPT = """
import importlib, json, sys, traceback
failures = {}
for name in json.loads(sys.argv[1]):
    for loaded in [m for m in sys.modules if m == "hordelite" or m.startswith("hordelite.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failures[name] = traceback.format_exc(limit=-3)
print(json.dumps(failures))
"""


def _modules() -> list[str]:
    # __main__ runs the command line when imported; what it imports is
    # hordelite.cli, imported here on its own.
    return sorted(
        info.name
        for info in pkgutil.walk_packages(hordelite.__path__, prefix="hordelite.")
        if info.name != "hordelite.__main__"
    )


def test_the_walk_finds_the_packages() -> None:
    modules = _modules()
    assert {"hordelite.front.openai", "hordelite.api.native", "hordelite.storage.queries"} <= set(
        modules
    )


def test_every_module_imports_first() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(_modules())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}
