"""The coding agents' install script's cache: a finished install is reused,
an unfinished one is installed again, the folder is named by the hash of
the lock, and stdout carries only the two binaries' paths. ``npm ci`` is
replaced by a stand-in that writes the binaries."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.agents import install_clis as script
from tests.cached_folder import MARKER


@pytest.fixture
def installs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    made: list[Path] = []

    def install(folder: Path) -> None:
        made.append(folder)
        for binary in script.BINARIES:
            (folder / binary).parent.mkdir(parents=True, exist_ok=True)
            (folder / binary).write_text("binary")

    monkeypatch.setattr(script, "install", install)
    return made


def test_a_finished_install_is_reused_without_installing_again(
    tmp_path: Path, installs: list[Path]
) -> None:
    first = script.ensure_installed(tmp_path)
    second = script.ensure_installed(tmp_path)
    folder = script.install_folder(tmp_path)
    assert first == second == tuple(folder / b for b in script.BINARIES)
    assert installs == [folder]
    assert (folder / MARKER).is_file()


def test_an_install_without_its_marker_is_removed_and_installed_again(
    tmp_path: Path, installs: list[Path]
) -> None:
    folder = script.install_folder(tmp_path)
    (folder / "node_modules").mkdir(parents=True)
    (folder / "node_modules" / "half-written").write_text("")
    codex, _ = script.ensure_installed(tmp_path)
    assert installs == [folder]
    assert codex.read_text() == "binary"
    assert not (folder / "node_modules" / "half-written").exists()


def test_the_cache_folder_is_named_by_the_hash_of_the_package_files(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    for name in script.MANIFESTS:
        shutil.copy2(script.HERE / name, manifests / name)
    folder = script.install_folder(tmp_path, manifests)
    assert folder == script.install_folder(tmp_path)
    assert folder.name.startswith("agents-")
    lock = manifests / "package-lock.json"
    lock.write_text(lock.read_text().replace("0.171.0", "0.172.0"))
    assert script.install_folder(tmp_path, manifests) != folder


def test_the_script_prints_only_the_binaries_paths_on_stdout(
    tmp_path: Path,
    installs: list[Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(script.CACHE_ENV, str(tmp_path))
    script.main()
    out, err = capsys.readouterr()
    folder = script.install_folder(tmp_path)
    assert out == f"{folder / script.BINARIES[0]}\n{folder / script.BINARIES[1]}\n"
    assert "built" in err
