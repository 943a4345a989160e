"""Every bound is named once, in hordelite/contract/limits.py.

A length bound written as a literal where it is checked drifts from its
twin elsewhere (the API key's 255 was written three times): these tests read
the package's source and refuse a literal bound in the two shapes a check
takes, ``len(x) > 255`` and a field reader's ``f.get_str(body, ..., 1000)``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from hordelite.contract import limits

PACKAGE = Path(__file__).resolve().parents[2] / "hordelite"


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _is_bound(node: ast.AST) -> bool:
    """A literal number that reads as a bound: 0 and 1 (emptiness) are not."""
    if isinstance(node, ast.BinOp):  # 10**7, 36 * 1024 * 1024
        return _is_bound(node.left) or _is_bound(node.right)
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
        and node.value > 1
    )


def _is_len(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len"


def literal_bounds(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            if any(_is_len(p) for p in parts) and any(_is_bound(p) for p in parts):
                yield node.lineno, ast.unparse(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "f"  # hordelite.contract._fields as f
            and node.func.attr.startswith("get_")
            and any(_is_bound(a) for a in node.args)
        ):
            yield node.lineno, ast.unparse(node)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_checks_a_length_against_a_literal(path: Path) -> None:
    found = list(literal_bounds(ast.parse(path.read_text(encoding="utf-8"))))
    assert not found, f"{path.name}: name these bounds in contract/limits.py: {found}"


@pytest.mark.parametrize(
    "source",
    [
        "if len(key) > 255: pass",
        "ok = 1 <= len(key) <= 255",
        "x = f.get_str(body, 'webhook', 'webhook', 1024, None)",
        "x = f.get_str(body, 'generation', 'generation', 10**7)",
    ],
)
def test_the_scan_finds_a_literal_bound(source: str) -> None:
    # The guard above passes on a clean package; this shows it would see one.
    assert list(literal_bounds(ast.parse(source)))


@pytest.mark.parametrize(
    "source",
    [
        "if len(key) > MAX_API_KEY_CHARS: pass",
        "if len(items) > 1: pass",
        "x = f.get_str(body, 'state', 'state', MAX_STATE_CHARS, 'ok')",
        "x = f.get_int(body, 'amount', 'amount', 1, MAX_REQUEST_N, 1)",
    ],
)
def test_the_scan_passes_a_named_bound(source: str) -> None:
    assert not list(literal_bounds(ast.parse(source)))


def test_limits_holds_only_final_constants_each_assigned_once() -> None:
    tree = ast.parse(Path(limits.__file__).read_text(encoding="utf-8"))
    names = []
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            assert isinstance(node, ast.AnnAssign), ast.unparse(node)
            assert ast.unparse(node.annotation) == "Final", ast.unparse(node)
            assert isinstance(node.target, ast.Name)
            names.append(node.target.id)
    assert len(names) == len(set(names))


def test_no_other_module_defines_a_name_that_limits_defines() -> None:
    # A moved constant left behind (or re-defined) is two sources again.
    names = {n for n in vars(limits) if n.isupper()}
    for path in _sources():
        if path.name == "limits.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for target in targets:
                if isinstance(target, ast.Name):
                    assert target.id not in names, f"{path.name} defines {target.id} again"
