"""No function in the packages is over the length limit (scripts/function_length.py)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "function_length", REPO_ROOT / "scripts" / "function_length.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_no_function_is_over_the_limit() -> None:
    script = _script()
    functions = script.measure()
    assert len(functions) > 1000  # the packages were found and walked
    assert script.problems(functions) == []


def test_the_measure_catches_a_planted_long_function(tmp_path: Path) -> None:
    """The broken variant: a long method (decorators not counted, nested functions
    measured too) is reported, an allowed one is not, and a stale entry is."""
    package = tmp_path / "pkg"
    package.mkdir()
    filler = "\n".join(f"    x{i} = {i}" for i in range(8))
    (package / "mod.py").write_text(
        textwrap.dedent(
            """
            import functools

            class Box:
                @functools.cache
                @functools.cache
                def long(self) -> None:
            {body}

            def allowed() -> None:
                def inner() -> None:
            {inner}
            """
        ).format(
            body=textwrap.indent(filler, "    "),
            inner=textwrap.indent(filler, "    "),
        )
    )
    script = _script()
    functions = script.measure(tmp_path, ("pkg",))
    lengths = {f.name: f.length for f in functions}
    assert lengths == {"Box.long": 9, "allowed": 10, "allowed.inner": 9}
    found = script.problems(
        functions, limit=8, allowed={"pkg/mod.py:allowed": "why", "pkg/mod.py:gone": "why"}
    )
    assert len(found) == 3
    assert any("Box.long is 9 lines" in line for line in found)
    assert any("allowed.inner is 9 lines" in line for line in found)
    assert any("pkg/mod.py:gone is on the allow-list" in line for line in found)
    assert script.problems(functions, limit=10, allowed={}) == []
