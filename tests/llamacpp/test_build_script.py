"""The llama-server build script's cache: a finished build is reused, an
unfinished one is built again, and stdout carries only the binary's path.
The build itself is replaced by a stand-in that writes the binary."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cached_folder import MARKER
from tests.llamacpp import build_llama_server as script


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    made: list[Path] = []

    def build(folder: Path) -> Path:
        made.append(folder)
        binary = folder / script.TARGET
        binary.write_text("binary")
        return binary

    monkeypatch.setattr(script, "build", build)
    return made


def test_a_finished_build_is_reused_without_building_again(
    tmp_path: Path, builds: list[Path]
) -> None:
    first = script.ensure_built(tmp_path)
    second = script.ensure_built(tmp_path)
    assert first == second == script.build_folder(tmp_path) / script.TARGET
    assert len(builds) == 1
    assert (first.parent / MARKER).is_file()


def test_a_build_without_its_marker_is_removed_and_built_again(
    tmp_path: Path, builds: list[Path]
) -> None:
    folder = script.build_folder(tmp_path)
    folder.mkdir(parents=True)
    (folder / script.TARGET).write_text("half written")
    (folder / "leftover.o").write_text("")
    binary = script.ensure_built(tmp_path)
    assert builds == [folder]
    assert binary.read_text() == "binary"
    assert not (folder / "leftover.o").exists()


def test_the_cache_folder_is_named_by_the_sdist_version_and_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(script.CACHE_ENV, str(tmp_path))
    folder = script.build_folder(script.cache_root())
    assert folder.parent == tmp_path
    assert folder.name.startswith(f"{script.SDIST_VERSION}-")
    monkeypatch.setattr(script, "CMAKE_FLAGS", (*script.CMAKE_FLAGS, "-DGGML_AVX2=ON"))
    assert script.build_folder(tmp_path) != folder


def test_the_script_prints_only_the_binarys_path_on_stdout(
    tmp_path: Path,
    builds: list[Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(script.CACHE_ENV, str(tmp_path))
    script.main()
    out, err = capsys.readouterr()
    assert out == f"{script.build_folder(tmp_path) / script.TARGET}\n"
    assert "built" in err
