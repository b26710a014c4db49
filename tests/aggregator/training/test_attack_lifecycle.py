"""Attack on training's side of the shared reservation lifecycle (engine.py
`_reserved_run`): after the data-opened mark, *any* failure must settle the
reservation in full as spent (reservations.py, docs/training.md). A failure while
removing the run's temporary files must not skip that."""

from __future__ import annotations

from decimal import Decimal

import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install 'fedldp[train]'")
pytest.importorskip("opacus", reason="needs the train extra: pip install 'fedldp[train]'")

from fedldp.aggregator.training import train_private
from fedldp.aggregator.training.config import DataConfig
from fedldp.aggregator.training.data import DataError, Dataset
from fedldp.aggregator.training.errors import TrainingAbortedError
from fedldp.aggregator.training.publish import MODEL_FILE
from fedldp.collector.ledger import Ledger

from .conftest import PURPOSE, SUBJECT, ConfigFactory

pytestmark = [
    pytest.mark.train,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def test_a_failed_cleanup_still_settles_an_opened_run_as_spent(
    make_config: ConfigFactory, ledger: Ledger
) -> None:
    cfg = make_config()

    def load(data: DataConfig) -> Dataset:
        (res,) = ledger.reservations(SUBJECT, PURPOSE)
        blocker = cfg.output_dir / f"{MODEL_FILE}.tmp-{res.id}"
        blocker.mkdir(parents=True)  # the temporary model path cannot be unlinked
        (blocker / "keep").write_text("x", encoding="utf-8")
        raise DataError("a value does not fit the declared schema")

    with pytest.raises(TrainingAbortedError):  # the run's own failure, not the cleanup's
        train_private(cfg, ledger=ledger, load=load)
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.data_opened_at is not None  # the data was opened
    assert (res.status, res.epsilon_spent) == ("settled", cfg.budget.epsilon)
    assert ledger.central_spend(SUBJECT, PURPOSE)[0] == Decimal(cfg.budget.epsilon)
