"""Make the Python 3.12 venv with horde_sdk 0.33.3, once, under the cache.

    python3 tests/compat/sdk033_venv.py /path/to/python3.12

prints the venv's interpreter on stdout. .ci/run calls it before the tests,
as it builds llama-server, so that the first run on a machine spends its
minute of pip outside the compatibility test's time limit; the test calls
``sdk_python`` too, which is then at once. Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

SDK_VERSION = "0.33.3"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hordelite"


def sdk_python(interpreter: str) -> Path:
    """The venv's interpreter with horde_sdk ``SDK_VERSION``, made when missing."""
    venv = CACHE / f"horde-sdk-{SDK_VERSION}"
    python = venv / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"horde-sdk-{SDK_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker at a time
        ready = venv / ".ready"  # written last: the venv is whole
        if not ready.exists():
            subprocess.run([interpreter, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", f"horde_sdk=={SDK_VERSION}"],
                check=True,
                timeout=600,
            )
            ready.touch()
    return python


if __name__ == "__main__":
    print(sdk_python(sys.argv[1]))
