"""Every module of the package imports on its own, and imports only what
its layer allows (the table LAYERS below).

An import cycle only shows when the cycle's modules are imported in a
particular order: the test imports each module first, in a fresh interpreter
with no other hordelite module loaded before it (third-party packages may stay
loaded between modules: only hordelite's own imports can form a cycle here).
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

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


# A fresh interpreter imports each of ~150 modules: on a loaded machine this
# takes longer than the suite's default 60 s.
@pytest.mark.timeout(240)
def test_every_module_imports_first() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(_modules())],
        capture_output=True,
        text=True,
        timeout=230,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


# The layers of the package, lowest first, as a table: each part of hordelite
# (a top-level module or package) and the other parts it may import. A part
# may always import itself. The test reads every module's source and fails on
# any import the table does not allow: an arrow pointing up, or sideways
# between siblings. To move a boundary, edit this table (and say why here).
#
# - The pure parts, no I/O: errors, clock, contract (the wire's rules; inside
#   hordelite it uses errors only) and the package root (__version__).
# - config reads the configuration, by the contract's limits.
# - http is everything HTTP below the horde (config's server settings only):
#   the server over Hypercorn, the strict wire and the connection, the
#   request and answer types, the dispatcher, the envelopes and the Quart
#   shell. It knows no route: it never imports the horde or the routes.
# - The adapters to the outside, siblings that never import each other:
#   storage (the database), signals (wake-ups across processes), blobs (image
#   bytes; their AWS signing inside) and guarded_fetch (client image URLs).
# - horde is the service over them.
# - api (native routes, dashboard, health, metrics, blobs) and front (the
#   OpenAI /v1 front) are siblings: neither imports the other; both write
#   their routes as http's handlers.
# - http.routes, the route table, is the one module of http above them: it
#   lists the routes of both and builds the dispatcher that serves them.
#   server runs it with the horde's storage, signals and blobs; cli and
#   testing sit on top.
# - worker is a client of the horde over HTTP and imports nothing of the
#   server: only the pure parts, config and http's server (its fake_backend,
#   an OpenAI-compatible stand-in for an LLM server served by `--backend fake`,
#   runs on it).
PURE = {"hordelite", "errors", "clock", "contract"}
LAYERS: dict[str, set[str]] = {
    "hordelite": set(),
    "errors": set(),
    "clock": set(),
    "contract": {"errors"},
    "config": {"contract", "errors"},
    # The dependencies pinned where their private names are used, and the
    # check of their versions at start (it reads only package metadata).
    "pinned": set(),
    "http": PURE | {"config"},
    "storage": PURE | {"config"},
    "signals": PURE | {"config"},
    "blobs": PURE | {"config"},
    "outbound": PURE | {"config"},
    "horde": PURE | {"config", "storage", "signals", "blobs", "outbound"},
    "api": PURE | {"config", "http", "horde", "blobs"},
    # An OpenAI call waits on the horde's signals, with their one rule for
    # when to look again (signals.look_again_by).
    "front": PURE | {"config", "http", "horde", "signals"},
    "http.routes": PURE | {"config", "http", "horde", "blobs", "api", "front"},
    # server renders a webhook's body in the native envelope (api._render).
    "server": PURE
    | {"config", "http", "http.routes", "storage", "signals", "blobs", "horde", "api"},
    "worker": PURE | {"config", "http"},
    "cli": PURE | {"config", "http", "storage", "horde", "server", "worker", "pinned"},
    "testing": PURE | {"config", "storage", "blobs", "horde", "server", "worker"},
    "__main__": {"cli"},
}


# Modules that are a part of their own inside a package (see LAYERS).
_OWN_PARTS = {"hordelite.http.routes": "http.routes"}


def _part(module: str) -> str:
    """The part of hordelite a module belongs to: hordelite.storage.pop ->
    storage, hordelite.server -> server, hordelite -> hordelite."""
    if module in _OWN_PARTS:
        return _OWN_PARTS[module]
    return module.split(".")[1] if "." in module else module


def _sources() -> dict[str, Path]:
    root = Path(hordelite.__file__).parent
    sources = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("hordelite", *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        sources[".".join(parts)] = path
    return sources


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, hordelite module) for every import in the source: at the top,
    inside functions and under ``if TYPE_CHECKING`` alike. ``from x import y``
    imports the module x.y when there is one, else x."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                name = f"{base}.{alias.name}"
                found.append((node.lineno, name if name in known else base))
    return [(line, name) for line, name in found if name.split(".")[0] == "hordelite"]


def test_the_layer_table_is_an_order() -> None:
    """No cycle in the table: each part can be given a layer above all it imports."""
    placed: list[str] = []
    waiting = dict(LAYERS)
    while waiting:
        ready = [part for part, allowed in waiting.items() if allowed <= set(placed) | {part}]
        assert ready, f"the layer table has a cycle among {sorted(waiting)}"
        placed += ready
        for part in ready:
            del waiting[part]


def test_every_part_is_in_the_layer_table() -> None:
    parts = {_part(module) for module in _sources()}
    assert parts == set(LAYERS), "add the new part to LAYERS, with what it may import"


def _against_the_layers(imports: dict[str, list[tuple[int, str]]]) -> list[str]:
    """Each import of ``imports`` (module -> its (line, hordelite module)
    imports) that the table does not allow."""
    upward = []
    for module, found in imports.items():
        part = _part(module)
        for line, imported in found:
            target = _part(imported)
            if target != part and target not in LAYERS[part]:
                upward.append(
                    f"{module} (line {line}) imports {imported}: {part} may import only "
                    f"{', '.join(sorted(LAYERS[part])) or 'nothing of hordelite'}"
                )
    return upward


def test_imports_point_down_the_layers() -> None:
    sources = _sources()
    imports = {module: _imports(module, path, set(sources)) for module, path in sources.items()}
    upward = _against_the_layers(imports)
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        # Out of the HTTP package: its machinery knows no horde and no route.
        ("hordelite.http.dispatch", "hordelite.horde.service"),
        ("hordelite.http.request", "hordelite.api.native"),
        ("hordelite.http.shell", "hordelite.http.routes"),
        # Into it, upward: a route's module never imports the table.
        ("hordelite.api.native", "hordelite.http.routes"),
        ("hordelite.front.openai", "hordelite.http.routes"),
        # Sideways between the two families of routes.
        ("hordelite.front.openai", "hordelite.api.native"),
    ],
)
def test_an_import_up_into_or_out_of_the_http_package_is_caught(module: str, imported: str) -> None:
    assert _against_the_layers({module: [(1, imported)]})


def test_the_worker_loads_nothing_of_the_server() -> None:
    """What the worker's command loads, in a fresh interpreter: the static
    table above, checked once at run time."""
    script = (
        "import sys, hordelite.worker, hordelite.worker._worker, hordelite.worker.fake_backend; "
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('hordelite.')}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    loaded = set(ast.literal_eval(out.stdout.strip().splitlines()[-1]))
    assert loaded <= {
        "worker",
        "fake_backend",
        "http",
        "_wire",
        "config",
        "contract",
        "errors",
        "clock",
    }


# hordelite's top level: the package's entry points, the parts every
# layer shares, the server that runs them and the table of pinned dependencies
# (pinned, which cli reads at start); everything else lives in a
# package of its own.
TOP_LEVEL = {"__init__", "__main__", "clock", "config", "errors", "pinned", "server"}


def test_the_top_level_holds_only_the_named_modules() -> None:
    root = Path(hordelite.__file__).parent
    assert {path.stem for path in root.glob("*.py")} == TOP_LEVEL
