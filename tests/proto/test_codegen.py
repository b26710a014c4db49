"""The committed protobuf bindings are exactly what the pinned generator makes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATED_DIR = REPO_ROOT / "proto" / "fedldp" / "v1"


def test_generated_code_matches_proto(tmp_path: Path) -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools (dev extra) is not installed: pip install -e '.[dev]'")
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    regenerated = sorted((tmp_path / "fedldp" / "v1").glob("*_pb2*"))
    committed = sorted(GENERATED_DIR.glob("*_pb2*"))
    assert [p.name for p in regenerated] == [p.name for p in committed]
    stale = [p.name for p in regenerated if p.read_bytes() != (GENERATED_DIR / p.name).read_bytes()]
    assert not stale, f"regenerate with `python scripts/gen_proto.py`; stale: {stale}"
