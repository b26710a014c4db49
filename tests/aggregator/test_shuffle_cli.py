"""`fedldp shuffler keygen / release / analyze`: the three roles from the command line.

The shuffler's release runs as its own process (the installed `fedldp` entry point); the
analyzer prints the estimate, the dropped payloads and both guarantees; a batch below the
minimum is refused with exit status 1 and nothing released.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner
from fedldp.aggregator.shuffle_analyzer import load_public_key
from fedldp.aggregator.shuffler import ShuffleSpool
from fedldp.client.mechanisms.base import CategoryOutput
from fedldp.client.sealed import seal_info, seal_output

from fedldp.cli import main
from tests.aggregator.test_reports import _folders

FEDLDP = [str(Path(sys.executable).with_name("fedldp"))]


def test_keygen_release_analyze(tmp_path: Path, authority: Any, make_policy: Any) -> None:
    """Sealed GRR reports go through a real shuffler process; the analyzer reports both ε."""
    policy = make_policy("shuffled", epsilon="2", min_reports=50)
    trust, policies = _folders(authority, policy, tmp_path)
    runner = CliRunner()
    keygen = runner.invoke(main, ["shuffler", "keygen", "--out", str(tmp_path / "keys")])
    assert keygen.exit_code == 0, keygen.output
    assert (tmp_path / "keys" / "analyzer.key").stat().st_mode & 0o777 == 0o600
    public = load_public_key(tmp_path / "keys" / "analyzer.pub")
    info = seal_info(policy.policy_id, policy.version, policy.digest)
    rng = np.random.default_rng(5)
    outputs = policy.mechanism.perturb_batch(rng.integers(0, 4, size=300), rng)
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add(
        "shuffled-w1",
        [seal_output(CategoryOutput(int(o)), public, info=info).ciphertext for o in outputs]
        + [b"not a ciphertext"],
    )
    release = [*FEDLDP, "shuffler", "release", "--spool", str(tmp_path / "spool.sqlite")]
    release += ["--batch", "shuffled-w1", "--out", str(tmp_path / "out")]
    too_small = subprocess.run([*release, "--min-batch", "1000"], capture_output=True, text=True)
    assert too_small.returncode == 1 and "fewer than the minimum 1000" in too_small.stderr
    done = subprocess.run([*release, "--min-batch", "100"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "released 301 shuffled ciphertexts" in done.stdout
    analyze = runner.invoke(
        main,
        [
            "shuffler",
            "analyze",
            str(tmp_path / "out" / "shuffled-w1.shuffled"),
            "--analyzer-key",
            str(tmp_path / "keys" / "analyzer.key"),
            "--policy",
            "shuffled",
            "--policies",
            str(policies),
            "--trust",
            str(trust),
        ],
    )
    assert analyze.exit_code == 0, analyze.output
    assert "valid reports: 300; invalid dropped: MALFORMED_SEALED: 1" in analyze.output
    assert "local ε0 = 2 per report; shuffled central (ε, δ) = (" in analyze.output
    assert "red" in analyze.output


def test_bad_inputs_get_one_error_line(tmp_path: Path) -> None:
    """A missing spool is a usage error (nothing created); keygen never overwrites a key."""
    runner = CliRunner()
    args = ["shuffler", "release", "--spool", str(tmp_path / "absent.sqlite"), "--batch", "b"]
    missing = runner.invoke(main, [*args, "--out", str(tmp_path / "o"), "--min-batch", "1"])
    assert missing.exit_code == 2 and not (tmp_path / "absent.sqlite").exists()
    assert runner.invoke(main, ["shuffler", "keygen", "--out", str(tmp_path / "k")]).exit_code == 0
    again = runner.invoke(main, ["shuffler", "keygen", "--out", str(tmp_path / "k")])
    assert again.exit_code == 1 and "not overwritten" in again.output
    assert again.exception is None or isinstance(again.exception, SystemExit)
