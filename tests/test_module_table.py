"""docs/architecture.md's module table is the tree's (scripts/module_table.py): a
module added, removed or re-described without regenerating the table fails."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "module_table", REPO_ROOT / "scripts" / "module_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_table_is_current() -> None:
    script = _script()
    page = script.ARCHITECTURE.read_text(encoding="utf-8")
    assert script.replaced(page) == page, "run: python scripts/module_table.py"
    assert script.main(["--check"]) == 0


def test_every_module_is_a_row() -> None:
    """The mechanisms and aggregator modules the hand-written list missed (issue 29)."""
    page = _script().ARCHITECTURE.read_text(encoding="utf-8")
    for path in ("client/mechanisms/loloha.py", "client/mechanisms/square_wave.py",
                 "aggregator/engines/sqlparse.py", "collector/server.py"):  # fmt: skip
        assert f"| `{path}` |" in page, path
    assert "CollectorServicer.Submit" not in page  # no such method


def test_a_missing_or_stale_row_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script()
    table = script.table()  # the tree's table, read once for the four pages below
    monkeypatch.setattr(script, "table", lambda: table)
    page = script.ARCHITECTURE.read_text(encoding="utf-8")
    missing = "\n".join(ln for ln in page.splitlines() if "`client/mechanisms/grr.py`" not in ln)
    assert script.replaced(missing) != missing
    stale = page.replace("| `collector/server.py` | ", "| `collector/server.py` | Old text. ", 1)
    assert script.replaced(stale) != stale
    gone = page.replace("| `client/wire.py` |", "| `client/wire.py` |\n| `client/gone.py` | x |")
    assert script.replaced(gone) != gone
    with pytest.raises(script.ModuleTableError):
        script.replaced("no markers here")


def test_a_module_without_a_docstring_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "bare.py").write_text("X = 1\n", encoding="utf-8")
    monkeypatch.setattr(script, "REPO_ROOT", tmp_path)
    with pytest.raises(script.ModuleTableError, match=r"pkg/bare\.py has no module docstring"):
        script.rows("pkg")
