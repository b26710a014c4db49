"""Training under the refund rule and one owner per reservation (SQLite and PostgreSQL).

Failures are injected before the first read (the ledger cannot record the
data-opened mark: cancelled, nothing read) and after it (a data error, an
interrupt mid-training: settled as spent, the full reservation). Two training
processes with one idempotency key: exactly one reads and trains.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install 'fedldp[train]'")
pytest.importorskip("opacus", reason="needs the train extra: pip install 'fedldp[train]'")

from fedldp.aggregator.training import ReservationTakenError, TrainingAbortedError, train_private
from fedldp.aggregator.training.config import DataConfig
from fedldp.aggregator.training.data import DataError, Dataset
from fedldp.collector.ledger import Ledger

from .conftest import PURPOSE, SUBJECT, ConfigFactory

pytestmark = [
    pytest.mark.train,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
WORKER = Path(__file__).parent.parent / "race_worker.py"


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgresql_url"))


class LedgerDown:
    """The real ledger, except that recording `open_data` fails (an unreachable ledger)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def open_data(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("ledger unreachable")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def test_failure_before_the_first_read_cancels(make_config: ConfigFactory, ledger: Ledger) -> None:
    reads: list[DataConfig] = []

    def load(cfg: DataConfig) -> Dataset:
        reads.append(cfg)
        raise AssertionError("read")

    with pytest.raises(TrainingAbortedError, match="cancelled \\(no data was read\\)"):
        train_private(make_config(), ledger=LedgerDown(ledger), load=load)
    assert reads == []
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "cancelled" and res.data_opened_at is None
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(0), Decimal(0))


def test_data_error_after_opening_is_charged(make_config: ConfigFactory, ledger: Ledger) -> None:
    def load(cfg: DataConfig) -> Dataset:
        raise DataError("row 7 has a label that is not a class")

    cfg = make_config()
    with pytest.raises(TrainingAbortedError, match="settled as spent"):
        train_private(cfg, ledger=ledger, load=load)
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled" and res.data_opened_at is not None
    assert (res.epsilon_spent, res.delta_spent) == (cfg.budget.epsilon, cfg.budget.delta)


def test_interrupt_mid_training_is_charged(
    make_config: ConfigFactory, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opacus.optimizers import DPOptimizer

    calls = {"n": 0}
    original = DPOptimizer.add_noise

    def interrupted(self: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        original(self)

    monkeypatch.setattr(DPOptimizer, "add_noise", interrupted)
    cfg = make_config(training={"grad_sample_mode": "hooks"})
    with pytest.raises(KeyboardInterrupt):
        train_private(cfg, ledger=ledger)
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert (res.status, res.epsilon_spent) == ("settled", cfg.budget.epsilon)
    assert "KeyboardInterrupt" in (res.close_reason or "")
    assert not cfg.output_dir.exists() or list(cfg.output_dir.iterdir()) == []


def test_two_training_processes_with_one_key_train_once(
    make_config: ConfigFactory, ledger: Ledger, tmp_path: Path
) -> None:
    cfg = make_config(budget={"idempotency_key": "nightly-2026-12-01"})
    raw = {
        "budget": {
            "ledger": cfg.budget.ledger,
            "subject": SUBJECT,
            "purpose": PURPOSE,
            "epsilon": "1",
            "delta": "0.00001",
            "idempotency_key": "nightly-2026-12-01",
        },
        "data": {
            "source": "csv",
            "path": cfg.data.path,
            "label": "label",
            "features": ["f0", "f1", "f2", "f3"],
            "num_classes": 2,
            "rows": 200,
            "privacy_unit": "one synthetic row",
        },
        "model": {"hidden": [8]},
        "training": {
            "epochs": 1,
            "max_grad_norm": 1.0,
            "expected_batch_size": 40,
            "learning_rate": 0.5,
        },
        "accountant": {"kind": "rdp"},
        "output": {"dir": str(cfg.output_dir)},
    }
    config_json = tmp_path / "config.json"
    config_json.write_text(json.dumps(raw))
    marker, go, out = tmp_path / "reads", tmp_path / "go", tmp_path / "a.json"
    args = [str(config_json), str(marker), str(go), str(out)]
    first = subprocess.Popen([sys.executable, str(WORKER), "train", *args])
    deadline = time.monotonic() + 120
    while not marker.exists():  # the first run has opened the data and holds the key
        assert time.monotonic() < deadline and first.poll() is None, "first run never read"
        time.sleep(0.05)
    # the second run, in this process, with the same configuration and key
    reads: list[DataConfig] = []

    def load(c: DataConfig) -> Dataset:
        reads.append(c)
        pytest.fail("read")

    with pytest.raises(ReservationTakenError, match="never trains twice"):
        train_private(cfg, load=load)
    assert reads == []
    go.touch()
    assert first.wait(120) == 0
    a = json.loads(out.read_text())
    assert "ok" in a
    assert marker.read_text().splitlines() == ["read"]
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled" and res.id == a["ok"]
