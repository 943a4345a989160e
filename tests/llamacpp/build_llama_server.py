"""Build llama.cpp's ``llama-server`` for the CPU, once, into a cache folder.

    python3 tests/llamacpp/build_llama_server.py

prints the path of the binary on stdout (and what it did, with the time it
took, on stderr). The sources are the llama.cpp that the ``llama-cpp-python``
sdist pinned below vendors, downloaded from PyPI and checked against its
sha256; only ``vendor/llama.cpp`` is extracted. The cache folder is
``$HORDELITE_LLAMA_SERVER_CACHE`` or ``~/.cache/hordelite/llama-server``,
holding one ``<sdist version>-<flags hash>`` folder per build: a build whose
marker file (written last) exists is reused at once; a folder without it (an
interrupted build) is removed and built again. A lock file keeps two runs
from building at once: the second waits, then reuses the first's build.

Standard library only, so CI can run it before the test environment exists.
Needs cmake and a C++ compiler. Takes some minutes on two cores.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: the repository's root on the path, for tests.cached_folder.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.cached_folder import content_hash, ensure_folder, say

SDIST_VERSION = "0.3.36"
SDIST_URL = (
    "https://files.pythonhosted.org/packages/ec/e9/"
    "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
    f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
)
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VENDORED = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
# A portable CPU build of the server alone: no network client, no TLS, no
# tests or examples, one static binary.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DBUILD_SHARED_LIBS=OFF",
)
TARGET = "llama-server"
CACHE_ENV = "HORDELITE_LLAMA_SERVER_CACHE"


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "hordelite" / "llama-server"


def build_folder(root: Path) -> Path:
    """The folder of this sdist built with these flags."""
    return root / f"{SDIST_VERSION}-{content_hash(*CMAKE_FLAGS, TARGET)}"


def download(folder: Path) -> Path:
    """The sdist, its sha256 checked."""
    sdist = folder / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    say(f"downloading {SDIST_URL}")
    digest = hashlib.sha256()
    with urllib.request.urlopen(SDIST_URL, timeout=120) as response, sdist.open("wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != SDIST_SHA256:
        raise SystemExit(
            f"the sdist's sha256 is {digest.hexdigest()}, not the pinned {SDIST_SHA256}"
        )
    return sdist


def extract_vendored(sdist: Path, source: Path) -> None:
    """Only ``vendor/llama.cpp``, into ``source``."""
    with tarfile.open(sdist) as archive:
        members = []
        for member in archive.getmembers():
            if not member.name.startswith(VENDORED) or member.name == VENDORED:
                continue
            member.name = member.name[len(VENDORED) :]
            members.append(member)
        if not members:
            raise SystemExit(f"the sdist holds no {VENDORED}")
        archive.extractall(source, members=members, filter="data")


def build(folder: Path) -> Path:
    """Download, extract, configure and build into ``folder``; the binary."""
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        work = Path(scratch)
        source, build_dir = work / "llama.cpp", work / "build"
        extract_vendored(download(work), source)
        jobs = str(os.cpu_count() or 1)
        # cmake's output to stderr: stdout carries only the binary's path.
        configure = ["cmake", "-S", source, "-B", build_dir, *CMAKE_FLAGS]
        subprocess.run(configure, check=True, stdout=sys.stderr)
        compile_ = ["cmake", "--build", build_dir, "--target", TARGET, "-j", jobs]
        subprocess.run(compile_, check=True, stdout=sys.stderr)
        binary = folder / TARGET
        shutil.copy2(build_dir / "bin" / TARGET, binary)
    return binary


def ensure_built(root: Path | None = None) -> Path:
    """The cached binary, built first when missing."""
    folder = ensure_folder(
        build_folder(root or cache_root()),
        build,
        needs=[TARGET],
        note=f"{SDIST_URL}\n{' '.join(CMAKE_FLAGS)}",
    )
    return folder / TARGET


def main() -> None:
    print(ensure_built())


if __name__ == "__main__":
    main()
