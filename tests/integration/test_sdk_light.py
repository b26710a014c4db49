"""The SDK records and sends with the base install only (no numpy, click, SQLAlchemy...)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sdk_testkit import CHILD, Deployment, ledger_rows, running_deployment

HEAVY = [
    "numpy",
    "scipy",
    "sqlalchemy",
    "click",
    "torch",
    "opacus",
    "matplotlib",
    "psycopg",
    "alembic",
    "prometheus_client",
]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def test_round_trip_with_heavy_modules_blocked(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical()
    collector = deployment.start()  # the collector runs here, with its own dependencies
    args = [
        "roundtrip",
        collector.address,
        str(tmp_path / "state"),
        str(deployment.trust_dir()),
        deployment.token(),
    ]
    code = (
        "import runpy, sys\n"
        f"for name in {HEAVY!r}:\n"
        "    sys.modules[name] = None  # importing it raises ImportError\n"
        f"sys.argv = [{str(CHILD)!r}, *{args!r}]\n"
        f"runpy.run_path({str(CHILD)!r}, run_name='__main__')\n"
        "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{HEAVY!r} and sys.modules[m] is not None))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["FLUSHED 1 0", "LOADED []"]
    assert len(ledger_rows(collector)) == 1
