"""Install the coding agents' command-line clients, Codex CLI and Claude
Code, once, into a cache folder.

    python3 tests/agents/install_clis.py

prints the path of ``codex`` on its first line and of ``claude`` on its
second (what it did, with the time it took, goes to stderr). The versions
are pinned by ``package.json`` and installed with ``npm ci`` from
``package-lock.json`` beside this script, so every package's integrity
hash is checked. The cache folder is ``$HORDELITE_AGENTS_CACHE`` or
``~/.cache/hordelite``, holding one ``agents-<hash of the two files>``
folder per lock: a folder whose marker file (written last) exists is
reused at once, one without it (an interrupted install) is removed and
installed again, and a lock file keeps two runs from installing at once
(``tests/cached_folder.py``).

Standard library only, so CI can run it before the test environment
exists. Needs ``npm`` (and ``node``, which runs ``codex``'s launcher).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: the repository's root on the path, for tests.cached_folder.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.cached_folder import content_hash, ensure_folder

HERE = Path(__file__).resolve().parent
MANIFESTS = ("package.json", "package-lock.json")
CACHE_ENV = "HORDELITE_AGENTS_CACHE"
# The binaries npm links, relative to the install folder: codex, then claude.
BINARIES = ("node_modules/.bin/codex", "node_modules/.bin/claude")


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "hordelite"


def install_folder(root: Path, manifests: Path = HERE) -> Path:
    """The folder of the packages these manifests pin."""
    return root / f"agents-{content_hash(*((manifests / m).read_bytes() for m in MANIFESTS))}"


def install(folder: Path, manifests: Path = HERE) -> None:
    """``npm ci`` of the manifests into ``folder``; each client is then run
    once (``--version``), so a folder that cannot run them is never marked
    whole. npm's output goes to stderr: stdout carries only the paths."""
    for name in MANIFESTS:
        shutil.copy2(manifests / name, folder / name)
    npm = ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"]
    subprocess.run(npm, cwd=folder, check=True, stdout=sys.stderr)
    for binary in BINARIES:
        subprocess.run([folder / binary, "--version"], check=True, stdout=sys.stderr, timeout=60)


def ensure_installed(root: Path | None = None) -> tuple[Path, Path]:
    """The cached ``codex`` and ``claude``, installed first when missing."""
    folder = ensure_folder(
        install_folder(root or cache_root()),
        install,
        needs=BINARIES,
        note=(HERE / "package.json").read_text(),
    )
    codex, claude = (folder / b for b in BINARIES)
    return codex, claude


def main() -> None:
    for binary in ensure_installed():
        print(binary)


if __name__ == "__main__":
    main()
