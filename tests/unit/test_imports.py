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


# The layers of the package, lowest first, as a table: each part of hordelite
# (a top-level module or package) and the other parts it may import. A part
# may always import itself. The test reads every module's source and fails on
# any import the table does not allow: an arrow pointing up, or sideways
# between siblings. To move a boundary, edit this table (and say why here).
#
# - The pure parts, no I/O: errors, clock, contract (the wire's rules; inside
#   hordelite it uses errors only) and the package root (__version__).
# - config reads the configuration, by the contract's limits.
# - _http is Hypercorn and Quart on whichever loop runs (config's server
#   settings only); _wire, below it, the strict HTTP/1.1 that Hypercorn's
#   connections run on (of hordelite, only the pure contract's limits and
#   errors: a chunk-size line's bound, the rc of a body past the limit).
# - The adapters to the outside, siblings that never import each other:
#   storage (the database), signals (wake-ups across processes), blobs (image
#   bytes; their AWS signing inside) and guarded_fetch (client image URLs).
# - horde is the service over them.
# - _request is what the routes share (the horde of the current app, the
#   JSON body, refusal counts).
# - api (native routes, dashboard, health, metrics, blobs) and front (the
#   OpenAI /v1 front) are siblings: neither imports the other.
# - app assembles the two into one Quart app; lean answers the hottest of
#   their routes before it (the same service calls, renders and envelopes,
#   decision 0061), so it sits above both; server runs the two with the
#   horde's storage, signals and blobs; cli and testing sit on top.
# - worker is a client of the horde over HTTP and imports nothing of the
#   server: only the pure parts, config and fake_backend (an OpenAI-compatible
#   stand-in for an LLM server, served by `--backend fake`).
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
    "_request": PURE | {"config", "horde"},
    "api": PURE | {"config", "http", "_request", "horde", "blobs"},
    # An OpenAI call waits on the horde's signals, with their one rule for
    # when to look again (signals.look_again_by).
    "front": PURE | {"config", "http", "_request", "horde", "signals"},
    "app": PURE | {"config", "http", "_request", "horde", "blobs", "api", "front"},
    "lean": PURE | {"config", "http", "horde", "api", "front"},
    "server": PURE
    | {"config", "http", "storage", "signals", "blobs", "horde", "app", "api", "lean"},
    "worker": PURE | {"config", "http"},
    "cli": PURE | {"config", "http", "storage", "horde", "server", "worker", "pinned"},
    "testing": PURE | {"config", "storage", "blobs", "horde", "server", "worker"},
    "__main__": {"cli"},
}


def _part(module: str) -> str:
    """The part of hordelite a module belongs to: hordelite.storage.pop ->
    storage, hordelite.app -> app, hordelite -> hordelite."""
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


def test_imports_point_down_the_layers() -> None:
    sources = _sources()
    upward = []
    for module, path in sources.items():
        part = _part(module)
        for line, imported in _imports(module, path, set(sources)):
            target = _part(imported)
            if target != part and target not in LAYERS[part]:
                upward.append(
                    f"{module} (line {line}) imports {imported}: {part} may import only "
                    f"{', '.join(sorted(LAYERS[part])) or 'nothing of hordelite'}"
                )
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


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
