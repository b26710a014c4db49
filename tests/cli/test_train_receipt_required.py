"""A local `fedldp train` refuses to run without a receipt signing key (issue 29.10).

An unsigned receipt can never be verified (`fedldp verify training` refuses it),
so, like `fedldp release --receipt` without `--signing-key`, a local run without
`[receipt] signing_key` is a usage error (exit 2) found before anything is
reserved, read or written. The shipped example configuration has the section.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from fedldp.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "train.toml"


def _config(tmp_path: Path, *, receipt: bool) -> Path:
    text = EXAMPLE.read_text(encoding="utf-8").replace(
        'ledger = "sqlite:////var/lib/fedldp/ledger.db"',
        f'ledger = "sqlite:///{tmp_path / "ledger.db"}"',
    )
    if not receipt:
        text = text[: text.index("[receipt]")]
    path = tmp_path / "train.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_local_run_without_a_signing_key_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path, receipt=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    out = CliRunner().invoke(main, ["train", "--config", str(config)])
    assert out.exit_code == 2, out.output
    assert "has no [receipt] signing_key" in out.output
    assert "fedldp keys generate --out keys --name receipts" in out.output
    assert "Traceback" not in out.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no ledger, no output


def test_the_example_configuration_names_a_signing_key(tmp_path: Path) -> None:
    from fedldp.aggregator.training.config import load_config

    signing_key = load_config(_config(tmp_path, receipt=True)).receipt.signing_key
    assert signing_key is not None and signing_key.endswith("keys/receipts.key")
