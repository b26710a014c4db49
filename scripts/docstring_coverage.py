"""Docstring coverage of public names, per package; fails under the thresholds below.

    python scripts/docstring_coverage.py [--all] [--list]

A *public name* is a module-level function or class whose name does not start
with ``_``, or a method (properties included) of such a class whose name does not
start with ``_``, in a module whose own name does not start with ``_`` (private
modules such as ``client/mechanisms/_common.py`` are skipped). A method that
overrides a documented method of an ancestor class defined in the same package
inherits that contract (`inspect.getdoc` does the same) and counts as documented.
`typing.overload` stubs and generated protobuf code are not counted.

Exit status 1 when a checked package is under its threshold (`THRESHOLDS`); 0
otherwise. `--all` also prints the packages without a threshold, `--list` every
undocumented name.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Package folder -> the least share of documented public names (a percentage).
THRESHOLDS: dict[str, float] = {
    "client": 100.0,
    "fedldp": 100.0,
    "authoring": 100.0,
    "collector": 100.0,
    "aggregator": 100.0,
    "conformance": 100.0,
}
#: Folders measured (and printed with --all) without a threshold: none today, every
#: package folder is held at 100 %.
OTHERS: tuple[str, ...] = ()


@dataclass
class Coverage:
    """Documented and undocumented public names of one package."""

    documented: int = 0
    missing: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        """All public names counted."""
        return self.documented + len(self.missing)

    @property
    def percent(self) -> float:
        """Documented share in percent (100 when there is nothing to document)."""
        return 100.0 if self.total == 0 else 100.0 * self.documented / self.total


def _public_modules(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*.py")
        if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))
        and not any(
            part.startswith("_") and part != "__init__.py" for part in p.relative_to(folder).parts
        )
    )


def _documented_methods(tree: ast.Module) -> dict[str, set[str]]:
    """Class name -> its methods with a docstring (for inherited contracts)."""
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {
                item.name
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and ast.get_docstring(item)
            }
    return out


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        if isinstance(base, ast.Subscript):  # Generic[...] and Mechanism[int, ...]
            base = base.value
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
    return names


def _is_overload(node: ast.AST) -> bool:
    """A `typing.overload` stub: the implementation after it carries the docstring."""
    decorators = getattr(node, "decorator_list", [])
    return any(
        (isinstance(d, ast.Name) and d.id == "overload")
        or (isinstance(d, ast.Attribute) and d.attr == "overload")
        for d in decorators
    )


def measure(folder: Path) -> Coverage:
    """The docstring coverage of the public names under `folder`."""
    modules = {path: ast.parse(path.read_text(), str(path)) for path in _public_modules(folder)}
    documented_by_class: dict[str, set[str]] = {}
    bases_of: dict[str, list[str]] = {}
    for tree in modules.values():
        for name, methods in _documented_methods(tree).items():
            documented_by_class.setdefault(name, set()).update(methods)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases_of.setdefault(node.name, []).extend(_base_names(node))

    def inherited_docs(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """Documented methods of `name`'s ancestors defined in the package."""
        out: set[str] = set()
        for base in bases_of.get(name, []):
            if base not in seen:
                out |= documented_by_class.get(base, set())
                out |= inherited_docs(base, seen | {name})
        return out

    coverage = Coverage()

    def count(label: str, documented: bool) -> None:
        if documented:
            coverage.documented += 1
        else:
            coverage.missing.append(label)

    for path, tree in modules.items():
        where = path.relative_to(folder.parent)
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_") or _is_overload(node):
                continue
            count(f"{where}:{node.lineno} {node.name}", ast.get_docstring(node) is not None)
            if not isinstance(node, ast.ClassDef):
                continue
            inherited = inherited_docs(node.name)
            for item in node.body:
                if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if item.name.startswith("_") or _is_overload(item):
                    continue
                count(
                    f"{where}:{item.lineno} {node.name}.{item.name}",
                    ast.get_docstring(item) is not None or item.name in inherited,
                )
    return coverage


def main(argv: list[str] | None = None) -> int:
    """Print the coverage per package; 1 when a package is under its threshold."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="also packages without a threshold")
    parser.add_argument("--list", action="store_true", help="list every undocumented name")
    args = parser.parse_args(argv)
    folders = [*THRESHOLDS, *(OTHERS if args.all else ())]
    failed = False
    for name in folders:
        coverage = measure(REPO_ROOT / name)
        threshold = THRESHOLDS.get(name)
        verdict = ""
        if threshold is not None:
            ok = coverage.percent >= threshold
            failed |= not ok
            verdict = f" (threshold {threshold:g} %: {'ok' if ok else 'FAIL'})"
        print(
            f"{name:12} {coverage.documented:5}/{coverage.total:<5} "
            f"{coverage.percent:6.1f} % documented{verdict}"
        )
        if args.list or (threshold is not None and coverage.percent < threshold):
            for label in coverage.missing:
                print(f"    undocumented: {label}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
