"""The dependencies whose private names hordelite uses are held to their
tested ranges in one list (hordelite/pinned.py), the same in pyproject.toml,
the lock (constraints.txt) inside them, and the check at start names a
dependency outside its range (decision 0074)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from hordelite import pinned

ROOT = Path(__file__).resolve().parents[2]


def _requirements() -> dict[str, Requirement]:
    """Every requirement of pyproject.toml (the test extras too), by name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    listed = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    return {canonicalize_name(r.name): r for r in map(Requirement, listed)}


def _locked() -> dict[str, str]:
    """name -> version of each ``name==version`` line of constraints.txt."""
    locked = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep, f"not an exact pin: {line!r}"
        assert re.fullmatch(r"[\w.+!-]+", version), f"not an exact pin: {line!r}"
        locked[canonicalize_name(name)] = version
    return locked


def test_a_version_outside_its_range_is_named_with_the_range() -> None:
    versions = {"hypercorn": "0.17.3"}
    lines = pinned.untested(lambda name: versions.get(name) or _inside(name))
    assert len(lines) == 1
    assert "hypercorn 0.17.3" in lines[0]
    assert "hypercorn>=0.18,<0.19" in lines[0]


def test_a_pinned_dependency_not_installed_is_named_with_the_range() -> None:
    lines = pinned.untested(lambda name: None if name == "h11" else _inside(name))
    assert lines == ["h11 is not installed; hordelite is tested with h11>=0.16,<0.17"]


def _inside(name: str) -> str:
    """The lowest version of a pin's range: inside it."""
    tested = next(p.tested for p in pinned.PINS if p.distribution == name)
    return tested.removeprefix(">=").split(",")[0]


def test_the_installed_versions_are_the_tested_ones() -> None:
    assert pinned.untested() == []


def test_pyproject_holds_each_pinned_dependency_to_the_same_range() -> None:
    requirements = _requirements()
    for pin in pinned.PINS:
        requirement = requirements[canonicalize_name(pin.distribution)]
        assert requirement.specifier == SpecifierSet(pin.tested), pin.distribution


def test_the_range_is_read_as_pip_reads_it() -> None:
    tested = ">=0.18,<0.19"
    versions = [
        "0.17.3", "0.18", "0.18.0", "0.18.0rc1", "0.18.0.dev2", "0.18.0.post1",
        "0.18.1", "0.18.5rc1", "0.18.5-rc.1", "0.18.9+deb12", "0.19.0rc1", "0.19.0_dev3",
        "0.19", "0.19.0", "1.0",
    ]  # fmt: skip
    for version in versions:
        expected = SpecifierSet(tested).contains(version, prereleases=True)
        assert pinned.inside(version, tested) is expected, version


def test_each_private_use_names_a_module_and_a_definition_that_exist() -> None:
    for pin in pinned.PINS:
        assert pin.uses, pin.distribution
        for use in pin.uses:
            files, _, names = use.where.partition(": ")
            for file in files.split(", "):
                source = (ROOT / file).read_text(encoding="utf-8")
                for name in filter(None, names.split(", ")):
                    defined = name.rsplit(".", 1)[-1]
                    assert re.search(rf"^\s*(async def|def|class) {defined}\b", source, re.M), (
                        f"{use.where}: no {defined} in {file}"
                    )


def test_the_lock_pins_every_requirement_inside_pyprojects_ranges() -> None:
    locked = _locked()
    assert "hordelite" not in locked
    for name, requirement in _requirements().items():
        assert name in locked, f"{name} is not in constraints.txt"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"constraints.txt pins {name}=={locked[name]}, outside {requirement}"
        )
    for pin in pinned.PINS:
        assert pinned.inside(locked[canonicalize_name(pin.distribution)], pin.tested)


def test_the_readmes_install_commands_use_the_lock() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    installs = [line for line in text.splitlines() if line.startswith("python3 -m venv .venv")]
    assert len(installs) == 2, installs  # the quick start and the test command
    for line in installs:
        assert "-c constraints.txt" in line, line
