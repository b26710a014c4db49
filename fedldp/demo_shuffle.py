"""`fedldp demo --shuffle`: the shuffler and the analyzer, after the collector took the reports.

The three roles run as a deployment would run them, each with only what it may hold
(docs/shuffle.md): the collector (already run by `fedldp.demo`, its own process) charged and
stored each device's sealed payload; the shuffler reads the window's ciphertexts from the
collector's ledger read-only (`fedldp shuffler pull`: ciphertexts only) and releases them in a
uniformly random order (`fedldp shuffler release`, which writes the manifest beside the
batch file: the ledger's count of the batch's reports); the analyzer, the only holder of the
private key, opens, checks and estimates (`fedldp shuffler analyze`, which takes the collector
count from that manifest). Each runs as its own `fedldp` process, so what it prints is what an
operator sees. The demo runs `pull` and `release` rather than `fedldp shuffler serve`: the
daemon releases a window only after it closed (a day, in the demo), and the demo's devices
report into the current window.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from fedldp.aggregator.shuffler import batch_path
from fedldp.demo import AUDIENCE, POLICY_ID, SHUFFLE_MIN_BATCH, WINDOW_SECONDS


def _role(name: str, args: list[str]) -> str:
    """Run `fedldp ARGS` as its own process; its output (a ClickException on failure)."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from fedldp.cli import main; sys.exit(main())", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if done.returncode != 0:
        raise click.ClickException(f"the {name} failed: {done.stderr.strip() or done.stdout}")
    return done.stdout


def shuffle_roles(
    out: Path, collector_config: Path, now: int, truth: dict[str, float], accepted: int
) -> None:
    """Pull, release and analyze the demo policy's current window; print each role's output
    and the true shares next to the analyzer's estimates. The manifest's collector count
    (what the analyzer caps n with) must equal `accepted`, the devices' accepted reports."""
    window = now - now % WINDOW_SECONDS
    spool, batches = out / "shuffler" / "spool.db", out / "shuffler" / "batches"
    batches.mkdir(parents=True, exist_ok=True)
    click.echo("")
    click.echo(
        "shuffler: "
        + _role(
            "shuffler",
            [
                "shuffler",
                "pull",
                "--config",
                str(collector_config),
                "--policy",
                POLICY_ID,
                "--window",
                str(window),
                "--spool",
                str(spool),
            ],
        ).strip()
    )
    batch = f"{POLICY_ID}.v1.{window}"
    # where release (for the signed min_batch) and analyze find the verified policy
    signed = ["--policies", str(out / "policies"), "--trust", str(out / "trust")]
    signed += ["--audience", AUDIENCE]
    click.echo(
        "shuffler: "
        + _role(
            "shuffler",
            [
                "shuffler",
                "release",
                "--spool",
                str(spool),
                "--batch",
                batch,
                "--out",
                str(batches),
                "--min-batch",
                str(SHUFFLE_MIN_BATCH),
                *signed,
            ],
        ).strip()
    )
    analysis = _role(
        "analyzer",
        [
            "shuffler",
            "analyze",
            str(batch_path(batches, batch)),
            "--analyzer-key",
            str(out / "analyzer" / "analyzer.key"),
            "--policy",
            POLICY_ID,
            *signed,
        ],
    )
    from fedldp.aggregator.shuffle_manifest import read_manifest

    manifest = read_manifest(batch_path(batches, batch))
    if manifest is None or manifest.collector_count != accepted:  # the demo's own cross-check
        raise click.ClickException(
            f"the manifest's collector count is not the {accepted} reports the collector accepted"
        )
    click.echo("analyzer:")
    click.echo(analysis.rstrip())
    click.echo("true shares: " + ", ".join(f"{k} {v:.4f}" for k, v in truth.items()))
