"""The documents speak only of the repository, and the README tells a new
self-hoster what they need to start."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")

# References to files the repository does not hold: the specification's
# files and folders, design notes kept elsewhere, and the specification's
# numbering (its parts and its decision records, which would read as this
# repository's docs/decisions).
OUTSIDE = re.compile(
    r"seeds?/|\.\./shared|/work/|DESIGN\.md|STYLE\.md|\b\d{3}_[0-9a-f]+\.txt"
    r"|(?<![\d,.\w])00[0-4](?= step|:| \"|\))|\bADR \d{4}"
)


def documents() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "hordelite.toml", ROOT / "bench" / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    for package in ("hordelite", "bench", "tests"):
        files += sorted((ROOT / package).rglob("*.py"))
    return [f for f in files if f != Path(__file__).resolve()]


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_document_refers_to_files_outside_the_repository(path: Path) -> None:
    found = [
        f"{number}: {line.strip()}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_readme_gives_host_port_the_python_version_and_the_horde_sdk_base_url() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    version = project["requires-python"].removeprefix(">=")
    assert f"Python {version} or newer" in README
    assert "--host 0.0.0.0" in README
    assert "--port N" in README
    assert "AI_HORDE_URL=http://127.0.0.1:7001/api/" in README
    for command in ("keys list", "keys create", "keys rotate", "keys revoke", "kudos grant"):
        assert f"hordelite {command}" in README
    assert "hordelite workers list" in README


# A relative link, without its #anchor: [text](path) not starting with a
# scheme, an anchor alone or a mail address.
LINK = re.compile(r"\]\((?![a-z]+:|#)([^)\s#]+)(?:#[^)\s]*)?\)")


@pytest.mark.parametrize(
    "path",
    [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_relative_link_names_a_file_of_the_repository(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    broken = [
        target
        for target in LINK.findall(text)
        if not (path.parent / target).resolve().exists()
        or not (path.parent / target).resolve().is_relative_to(ROOT)
    ]
    assert not broken, broken


def test_the_deploy_how_to_is_linked_from_the_readme_and_the_internet_how_to() -> None:
    assert "](docs/how-to/deploy.md)" in README
    exposed = (ROOT / "docs" / "how-to" / "expose_to_the_internet.md").read_text(encoding="utf-8")
    assert "](deploy.md)" in exposed
