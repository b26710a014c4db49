"""The import rules of docs/architecture.md: which role may import which."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Folder -> packages no module in it may import (at any depth, lazily or not).
FORBIDDEN = {
    "client": ("fedldp.collector", "fedldp.aggregator", "fedldp.authoring"),
    "collector": ("fedldp.aggregator",),
    "authoring": ("fedldp.collector", "fedldp.aggregator"),
}


def imported_modules(source: str) -> set[str]:
    """Every module an `import` or `from ... import` statement in `source` names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def violations(folder: str) -> list[str]:
    """`file: module` for each forbidden import under `folder`."""
    out = []
    for path in sorted((REPO_ROOT / folder).rglob("*.py")):
        for module in sorted(imported_modules(path.read_text())):
            if module.startswith(FORBIDDEN[folder]):
                out.append(f"{path.relative_to(REPO_ROOT)}: {module}")
    return out


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_role_imports_what_it_must_not(folder: str) -> None:
    assert violations(folder) == []


def test_the_scan_sees_lazy_and_from_imports() -> None:
    """Broken variant: a lazy import inside a function is found, a mention in text is not."""
    source = (
        '"""Talks about fedldp.aggregator in prose."""\n'
        "def f():\n"
        "    from fedldp.aggregator import reports\n"
        "    import fedldp.collector.ledger\n"
    )
    modules = imported_modules(source)
    assert "fedldp.aggregator" in modules
    assert "fedldp.collector.ledger" in modules
    assert not any(m.startswith("fedldp.client") for m in modules)
