"""The llama.cpp tier: a real ``llama-server`` running a tiny generated model.

The binary comes from ``HORDELITE_TEST_LLAMA_SERVER`` (``.ci/run`` sets it
from ``tests/llamacpp/build_llama_server.py``, which builds it once into a
cache); without it the tier is skipped, saying so. The tests that run it are marked
``llamacpp``: ``pytest -m llamacpp`` runs the tier alone.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.llamacpp.tiny_model import CONTEXT, write_tiny_model

BINARY_ENV = "HORDELITE_TEST_LLAMA_SERVER"


@dataclasses.dataclass(frozen=True)
class LlamaServer:
    url: str
    port: int
    model_path: Path
    log: Path

    async def get(self, path: str) -> Any:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            r = await client.get(path)
        r.raise_for_status()
        return r.json()

    async def post(self, path: str, body: Any) -> Any:
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as client:
            r = await client.post(path, json=body)
        r.raise_for_status()
        return r.json()

    async def metrics(self) -> dict[str, float]:
        """``/metrics`` (Prometheus text) as {name: value}."""
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            r = await client.get("/metrics")
        r.raise_for_status()
        values = {}
        for line in r.text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    binary = os.environ.get(BINARY_ENV)
    if not binary:
        pytest.skip(
            f"{BINARY_ENV} is not set: the llama.cpp tier is skipped "
            "(build it with python3 tests/llamacpp/build_llama_server.py)"
        )
    path = Path(binary)
    assert path.is_file(), f"{BINARY_ENV}={binary} is not a file"
    return path


@pytest.fixture(scope="session")
def llama_server(
    llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    """llama-server with the tiny model: one slot of CONTEXT tokens, Jinja
    templates, the /metrics route; its log in a file."""
    folder = tmp_path_factory.mktemp("llama")
    model = write_tiny_model(folder / "tiny-llama.gguf")
    port = free_port()
    log = folder / "llama-server.log"
    command = [
        str(llama_server_binary),
        *("-m", str(model), "--host", "127.0.0.1", "--port", str(port)),
        *("--ctx-size", str(CONTEXT), "-np", "1", "--threads", "1"),
        *("--jinja", "--metrics", "--no-webui"),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    server = LlamaServer(f"http://127.0.0.1:{port}", port, model, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log.read_text(errors="replace")
            try:
                if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
