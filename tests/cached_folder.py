"""A folder made once into a cache and reused: the logic the test suite's
set-up scripts share (``tests/llamacpp/build_llama_server.py``,
``tests/agents/install_clis.py``).

    folder = ensure_folder(root / "name-<hash of the inputs>", fill)

A folder whose marker file (written last, after ``fill`` returned) exists
is reused at once. A folder without it, left by an interrupted run, is
removed and filled again. A lock file beside the folder keeps two runs
from filling it at once: the second waits, then reuses the first's.

Standard library only, so CI can run the scripts before the test
environment exists; what they do is said on stderr, stdout being theirs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

MARKER = "BUILT"  # written last: its presence means the folder is whole


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def content_hash(*parts: bytes | str) -> str:
    """12 hex digits of the sha256 of ``parts`` joined by newlines: a cache
    folder's name carries the hash of its inputs, so that changed inputs
    make a new folder."""
    joined = b"\n".join(p.encode() if isinstance(p, str) else p for p in parts)
    return hashlib.sha256(joined).hexdigest()[:12]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on ``path`` (created if missing), waiting for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another run holds {path}; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_folder(
    folder: Path, fill: Callable[[Path], object], *, needs: Iterable[str] = (), note: str = ""
) -> Path:
    """``folder``, filled first by ``fill(folder)`` unless a whole one is
    cached: its marker and each of ``needs`` (paths inside it) exist.

    ``note`` goes into the marker file with the time the filling took. An
    exception from ``fill`` propagates and leaves the folder without its
    marker, so the next run starts it again.
    """
    with locked(folder.with_name(folder.name + ".lock")):
        if (folder / MARKER).is_file() and all((folder / p).exists() for p in needs):
            say(f"reusing {folder}")
            return folder
        if folder.exists():
            say(f"removing the unfinished {folder}")
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        started = time.monotonic()
        fill(folder)
        seconds = time.monotonic() - started
        (folder / MARKER).write_text(f"{note}\n{seconds:.0f} s\n".lstrip("\n"))
        say(f"built {folder} in {seconds / 60:.1f} min ({seconds:.0f} s)")
        return folder
