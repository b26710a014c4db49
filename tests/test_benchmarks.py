"""Every bench/ script takes --quick and --json (docs/figures.md says so, and
`make bench-quick` runs each with them). A static check: no benchmark runs here."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _options(path: Path) -> set[str]:
    """The option strings of every `add_argument` call in `path`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            found.update(
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            )
    return found


def _benchmarks() -> list[Path]:
    return [p for p in sorted((REPO_ROOT / "bench").glob("*.py")) if not p.name.startswith("_")]


def test_every_benchmark_takes_quick_and_json() -> None:
    benchmarks = _benchmarks()
    assert len(benchmarks) >= 20
    missing = {p.stem: {"--quick", "--json"} - _options(p) for p in benchmarks}
    assert {name: sorted(m) for name, m in missing.items() if m} == {}


def test_the_check_sees_a_benchmark_without_quick(tmp_path: Path) -> None:
    script = tmp_path / "b.py"
    script.write_text('p.add_argument("--json", type=Path)\n', encoding="utf-8")
    assert _options(script) == {"--json"}


def test_make_bench_quick_runs_every_benchmark() -> None:
    """The Makefile takes the list from bench/*.py rather than naming scripts."""
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert "BENCHES := $(filter-out _%,$(basename $(notdir $(wildcard bench/*.py))))" in makefile
    assert "for b in $(BENCHES); do $(BIN)/python -m bench.$$b --quick --json" in makefile
