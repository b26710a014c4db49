"""`fedldp demo --shuffle`: the three roles on loopback print ε0 and the central (ε, δ).

Real processes throughout (the collector, then `fedldp shuffler pull`, `release`, `analyze`);
100 simulated devices (the demo policy releases nothing below 100), one process (a few seconds).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from demo_testkit import one_collector_process_env


@pytest.mark.slow  # five processes and 100 SDK devices: ~5 s idle, ~20 s on a loaded machine
def test_demo_shuffle_runs_the_three_roles(tmp_path: Path) -> None:
    """Every report reaches the analyzer, which prints both guarantees."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from fedldp.cli import main; sys.exit(main())",
         "demo", "--shuffle", "--devices", "100", "--processes", "1", "--threads", "8",
         "--seed", "3", "--reinstall-fraction", "0", "--out", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=300, check=False,
        env=one_collector_process_env(),  # the collector's process count is not tested here
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "reports accepted:                    100" in out
    assert "100 added, 100 waiting" in out
    assert "released 100 shuffled ciphertexts" in out
    assert "valid reports: 100; invalid dropped: none" in out
    assert "local ε0 = 2 per report; shuffled central (ε, δ) = (" in out
    assert "collector count: 100 (from the shuffler's manifest; caps n)" in out
    assert (tmp_path / "demo" / "analyzer" / "analyzer.key").stat().st_mode & 0o077 == 0
