"""Distributed DP-SGD (`fedldp train --nproc N`): same accounting, one reservation, noise once.

Every run here is real: gloo on CPU, spawned processes, a real SQLite ledger, a
signed receipt checked by `fedldp verify training`. Two-process runs cost ~10-20 s
each on the shared 2-core machine (mostly the workers importing torch and Opacus).
"""

from __future__ import annotations

import multiprocessing
import tempfile
import warnings
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install 'fedldp[train]'")
pytest.importorskip("opacus", reason="needs the train extra: pip install 'fedldp[train]'")

import numpy as np
import torch
from click.testing import CliRunner
from fedldp.aggregator.training import (
    DistributedError,
    TrainingAbortedError,
    train_private,
)
from fedldp.collector.ledger import Ledger

from fedldp.cli import main

from . import ddp_helpers
from .conftest import PURPOSE, SUBJECT, write_table

pytestmark = [
    pytest.mark.train,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
warnings.filterwarnings("ignore", module="opacus")

ConfigFactory = Callable[..., Any]
ROWS = 1000
HOLDOUT = 2000
# The accounting fields a multi-process run must share with the one-process run.
SAME_TRAINING = (
    "declared_rows",
    "sample_rate",
    "expected_batch_size",
    "steps",
    "planned_steps",
    "step_limit",
    "stop_reason",
    "noise_multiplier",
    "noise_calibrated",
    "max_grad_norm",
    "check_every_steps",
)
SAME_PRIVACY = ("epsilon_budget", "delta", "epsilon_spent", "delta_spent", "epsilon")


def _toml(tmp_path: Path, ledger_url: str, key: Path, data_key: Path, out: str, seed: int) -> Path:
    text = f"""
[budget]
ledger = "{ledger_url}"
subject = "{SUBJECT}"
purpose = "{PURPOSE}"
epsilon = "2"
delta = "0.00001"

[data]
source = "csv"
path = "train.csv"
label = "label"
features = ["f0", "f1", "f2", "f3"]
num_classes = 2
rows = {ROWS}
privacy_unit = "one synthetic row"

[model]
hidden = [8]

[training]
epochs = 3
max_grad_norm = 1.0
learning_rate = 0.5
expected_batch_size = 100

[accountant]
kind = "prv"

[randomness]
source = "seeded"
seed = {seed}

[output]
dir = "{out}"

[receipt]
signing_key = "{key}"
data_digest_key = "{data_key}"
"""
    path = tmp_path / f"{out}.toml"
    path.write_text(text)
    return path


def _accuracy(model_path: Path, holdout: tuple[np.ndarray, np.ndarray]) -> float:
    from fedldp.aggregator.training.config import ModelConfig
    from fedldp.aggregator.training.models import build_mlp

    model = build_mlp(ModelConfig(hidden=(8,)), 4, 2)
    model.load_state_dict(torch.load(model_path, weights_only=True))
    with torch.no_grad():
        pred = model(torch.as_tensor(holdout[0], dtype=torch.float32)).argmax(1).numpy()
    return float((pred == holdout[1]).mean())


def _settled_reservations(ledger: Ledger) -> list[Any]:
    return [r for r in ledger.reservations(SUBJECT, PURPOSE) if r.status == "settled"]


def _assert_one_reservation_per_run(ledger: Ledger, runs: int, spent: Decimal) -> None:
    """Each run reserved exactly once and was charged only its own spend."""
    settled = _settled_reservations(ledger)
    assert len(settled) == runs, f"{len(settled)} reservations for {runs} runs"
    assert ledger.central_spend(SUBJECT, PURPOSE)[0] == spent


def test_two_processes_same_accounting_receipt_and_accuracy(
    tmp_path: Path,
    ledger: Ledger,
    ledger_url: str,
    receipt_key: tuple[Path, Path],
    data_key_path: Path,
) -> None:
    write_table(tmp_path / "train.csv", rows=ROWS)
    holdout = write_table(tmp_path / "holdout.csv", rows=HOLDOUT, seed=8)
    runner = CliRunner()
    receipts, accuracy = {}, {}
    spent = Decimal(0)
    for nproc in (1, 2):
        out = f"out{nproc}"
        config = _toml(tmp_path, ledger_url, receipt_key[0], data_key_path, out, seed=3)
        run = runner.invoke(main, ["train", "--config", str(config), "--nproc", str(nproc)])
        assert run.exit_code == 0, run.output
        assert f"processes {nproc}" in run.output
        receipt_path = tmp_path / out / "receipt.json"
        verified = runner.invoke(
            main,
            [
                "verify",
                "training",
                str(receipt_path),
                "--ledger",
                ledger_url,
                "--trusted-key",
                str(receipt_key[1]),
                "--data-key",
                str(data_key_path),
                "--accept-seeded",
            ],
        )
        assert verified.exit_code == 0, verified.output
        assert "FAIL" not in verified.output and "ok   dataset" in verified.output
        from fedldp.aggregator.training.receipt import load_receipt

        receipts[nproc] = load_receipt(receipt_path)
        accuracy[nproc] = _accuracy(tmp_path / out / "model.pt", holdout)
        spent += Decimal(receipts[nproc]["privacy"]["epsilon_spent"])
        _assert_one_reservation_per_run(ledger, nproc, spent)  # one more per run, not N

    one, two = receipts[1], receipts[2]
    for name in SAME_TRAINING:
        assert one["training"][name] == two["training"][name], name
    for name in SAME_PRIVACY:
        assert one["privacy"][name] == two["privacy"][name], name
    assert one["privacy"]["accountant"]["state"] == two["privacy"]["accountant"]["state"]
    assert (one["training"]["processes"], two["training"]["processes"]) == (1, 2)
    assert one["training"]["steps"] == 30 and one["training"]["sample_rate"] == 0.1
    assert set(one) == set(two) and set(one["training"]) == set(two["training"])
    assert one["dataset"]["digest"] == two["dataset"]["digest"]
    # Accuracy within noise: over seeds 1-8 the one-process run's holdout accuracy was
    # 0.93 with a standard deviation of about 0.004 (range 0.920-0.932; two-process
    # seeds 1-3 alike). The two runs sample different batches and noise, so their
    # difference has sd ~0.006; 0.03 is 5 sd. Both must also beat the majority class.
    assert abs(accuracy[1] - accuracy[2]) <= 0.03, accuracy
    assert min(accuracy.values()) >= 0.85, accuracy


def test_each_rank_reserving_is_caught(make_config: ConfigFactory, ledger: Ledger) -> None:
    """The broken variant: every rank runs the whole pipeline (reserves, trains, settles).
    The check the two-process test uses sees two reservations for one run."""
    spent = Decimal(0)
    for rank in range(2):
        cfg = make_config(
            budget={"idempotency_key": f"run-rank{rank}"},
            output={"dir": str(Path(tempfile.mkdtemp()) / f"rank{rank}")},
        )
        spent += train_private(cfg, ledger=ledger).epsilon_spent
    with pytest.raises(AssertionError, match="2 reservations for 1 runs"):
        _assert_one_reservation_per_run(ledger, 1, spent)


def test_noise_is_added_once_per_step_in_total(tmp_path: Path) -> None:
    """With a zero clipped-gradient sum the applied gradient is the noise alone, whose sd
    must be σC/B (one draw of N(0, σ²C²) per step, over the global expected batch B).

    4,096 noise values per variant: the sample sd's relative error is ~1.1 %, so the
    bounds [0.93, 1.07] fail a correct run with probability < 1e-9 (fixed seeds anyway).
    The broken variant (each rank adds the full noise at its own batch, then the ranks
    average) gives √2 ≈ 1.41 and is rejected; so would a noise N times smaller.
    """
    result = ddp_helpers.noise_probe_two_ranks(str(tmp_path / "store"))
    assert 0.93 <= result["hooks"] <= 1.07, result  # rank 1's local batch was empty
    assert 0.93 <= result["ghost"] <= 1.07, result
    assert not 0.93 <= result["broken"] <= 1.07, result
    assert abs(result["broken"] - 2**0.5) < 0.07, result
    # the shard sampler: every step yields a batch on every rank (empty ones included),
    # and the two shards are disjoint and cover the rows
    shard0, shard1 = result["shard_batches"]
    assert len(shard0) == len(shard1) == 10  # int(1 / 0.1) steps, none skipped
    assert any(b == [] for b in shard0 + shard1)
    rows0 = {i for b in shard0 for i in b}
    rows1 = {i for b in shard1 for i in b}
    assert rows0.isdisjoint(rows1) and rows0 | rows1 <= set(range(7))


def test_a_failing_worker_leaves_the_reservation_spent(
    make_config: ConfigFactory, ledger: Ledger
) -> None:
    cfg = make_config(budget={"idempotency_key": "crash"}, training={"grad_sample_mode": "hooks"})
    with pytest.raises(TrainingAbortedError, match="settled as spent"):
        train_private(cfg, ledger=ledger, model=ddp_helpers.FailsOnRankOne(), nproc=2)
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled"
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal("1"), Decimal("0.00001"))
    assert not cfg.output_dir.exists() or list(cfg.output_dir.iterdir()) == []
    assert multiprocessing.active_children() == []  # no worker left behind


def test_bad_nproc_is_refused_before_reserving(make_config: ConfigFactory, ledger: Ledger) -> None:
    for bad in (0, -2, True):
        with pytest.raises(DistributedError, match="positive integer"):
            train_private(make_config(), ledger=ledger, nproc=bad)
    assert ledger.reservations(SUBJECT) == []
    refused = CliRunner().invoke(main, ["train", "--config", "x.toml", "--nproc", "0"])
    assert refused.exit_code == 2
