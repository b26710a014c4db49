"""Regenerate (or check) the conformance vectors: `python -m conformance.generate [--check]`.

The files are a pure function of the Python reference: fixed keys, fixed seeds,
sorted keys, one JSON layout. `--check` regenerates in memory and exits 1 when
any file differs (CI runs the same comparison in tests/conformance).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conformance.contract_vectors import hash_vectors, report_id_vectors, wire_vectors
from conformance.mechanism_vectors import mechanism_vectors
from conformance.policy_vectors import policy_vectors
from conformance.sealed_vectors import sealed_vectors

#: The folder of the vectors of wire contract version 1 (proto/fedldp/v1).
VECTORS_DIR = Path(__file__).resolve().parent / "v1"

#: File name -> the function that builds its content.
FILES: dict[str, Callable[[], dict[str, Any]]] = {
    "mechanisms.json": mechanism_vectors,
    "hashes.json": hash_vectors,
    "wire.json": wire_vectors,
    "report_ids.json": report_id_vectors,
    "policies.json": policy_vectors,
    "sealed.json": sealed_vectors,
}


def render(content: dict[str, Any]) -> str:
    """The one JSON layout of every vector file (compact rows, sorted keys, final newline)."""
    return json.dumps(content, sort_keys=True, indent=1, ensure_ascii=True) + "\n"


def generate() -> dict[str, str]:
    """Every vector file's text, by name."""
    return {name: render(build()) for name, build in FILES.items()}


def drift(directory: Path = VECTORS_DIR) -> list[str]:
    """Names of the files that are missing or differ from a fresh generation."""
    stale = []
    for name, text in generate().items():
        path = directory / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def main(argv: list[str] | None = None) -> int:
    """Write the vectors (default) or check them (--check)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail on drift, write nothing")
    args = parser.parse_args(argv)
    if args.check:
        stale = drift()
        for name in stale:
            print(f"conformance/v1/{name} is stale: run python -m conformance.generate")
        return 1 if stale else 0
    VECTORS_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in generate().items():
        (VECTORS_DIR / name).write_text(text, encoding="utf-8")
        print(f"wrote conformance/v1/{name} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
