"""deploy/systemd/fedldp-collector.service and fedldp-shuffler.service: valid, and hardened
(exposure <= 3).

Runs `systemd-analyze verify` and `systemd-analyze security --offline=true` on a
copy whose ExecStart points at this checkout's `fedldp` (verify checks that the
command exists). Skipped, with the reason, where systemd-analyze is missing or
too old for --offline (systemd < 252).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (apt-get install systemd)"
)


@pytest.fixture(params=["fedldp-collector.service", "fedldp-shuffler.service"])
def unit(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    name: str = request.param
    source = UNITS / name
    fedldp = Path(sys.executable).with_name("fedldp")
    text = source.read_text(encoding="utf-8").replace("/opt/fedldp/venv/bin/fedldp", str(fedldp))
    path = tmp_path / source.name
    path.write_text(text, encoding="utf-8")
    return path


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run(
        [SYSTEMD_ANALYZE, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_unit_verifies(unit: Path) -> None:
    result = _analyze("verify", str(unit))
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_is_hardened(unit: Path) -> None:
    for setting in ("UMask=0077", "ProtectSystem=strict", "NoNewPrivileges=true",
                    "CapabilityBoundingSet=\n", "SystemCallFilter=@system-service"):  # fmt: skip
        assert setting in unit.read_text(encoding="utf-8"), setting
    result = _analyze("security", "--offline=true", str(unit))
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("systemd-analyze is older than 252 (no --offline)")
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert found, result.stdout + result.stderr
    assert float(found.group(1)) <= 3.0, result.stdout
