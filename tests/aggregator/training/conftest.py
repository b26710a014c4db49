"""Fixtures for the training tests: tiny synthetic tables, real SQLite ledger files.

Every test that imports torch/Opacus is marked `train` and skipped, with the
install hint, when the extra is missing.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fedldp.collector.ledger import Ledger, open_ledger

SUBJECT = "dataset:synthetic"
PURPOSE = "train:test-mlp"
ROWS = 200
FEATURES = 4


def write_table(path: Path, *, rows: int = ROWS, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """A linearly separable-ish 2-class table (4 features), as CSV with a header."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES))
    y = (x @ np.array([1.0, -1.0, 0.5, 0.0]) + 0.3 * rng.normal(size=rows) > 0).astype(int)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([f"f{i}" for i in range(FEATURES)] + ["label"])
        for xi, yi in zip(x, y, strict=True):
            w.writerow([f"{v:.6f}" for v in xi] + [int(yi)])
    return x, y


@pytest.fixture()
def ledger_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture()
def ledger(ledger_url: str) -> Iterator[Ledger]:
    led = open_ledger(ledger_url)
    led.set_central_cap(SUBJECT, PURPOSE, epsilon_cap=Decimal("10"), delta_cap=Decimal("1e-4"))
    yield led
    led.close()


@pytest.fixture(scope="session")
def receipt_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The training service's receipt key pair (private .key, public .pub), made once."""
    from fedldp.authoring import generate_key, write_private_key, write_public_key

    folder = tmp_path_factory.mktemp("receipt-key")
    key = generate_key()
    write_private_key(key, folder / "receipts.key")
    write_public_key(key.public_key(), folder / "receipts.pub")
    return folder / "receipts.key", folder / "receipts.pub"


@pytest.fixture(scope="session")
def data_key_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The service's secret data-digest key (datakey.py), made once."""
    from fedldp.aggregator.central.datakey import generate_data_key

    path = tmp_path_factory.mktemp("data-key") / "data.hkey"
    generate_data_key(path)
    return path


@pytest.fixture()
def check_receipt(
    receipt_key: tuple[Path, Path], ledger: Ledger, data_key_path: Path
) -> Callable[..., Any]:
    """`check_receipt(path, **kw)`: verify_receipt against the fixture's key and ledger
    (seeded runs accepted unless accept_seeded=False is passed; the data key given)."""
    from fedldp.aggregator.central.datakey import load_data_key
    from fedldp.aggregator.central.signing import trusted_keys
    from fedldp.aggregator.training.receipt import verify_receipt
    from fedldp.client.policy import load_public_key

    trusted = trusted_keys([load_public_key(receipt_key[1])])

    def check(path: Path, **kwargs: Any) -> Any:
        kwargs.setdefault("accept_seeded", True)
        kwargs.setdefault("ledger", ledger)
        kwargs.setdefault("data_key", load_data_key(data_key_path))
        return verify_receipt(path, trusted=trusted, **kwargs)

    return check


@pytest.fixture()
def table(tmp_path: Path) -> Path:
    path = tmp_path / "train.csv"
    write_table(path)
    return path


ConfigFactory = Callable[..., Any]


@pytest.fixture()
def make_config(
    tmp_path: Path,
    ledger_url: str,
    table: Path,
    receipt_key: tuple[Path, Path],
    data_key_path: Path,
) -> ConfigFactory:
    """Build a validated TrainConfig; keyword sections update the defaults."""
    from fedldp.aggregator.training.config import config_from_mapping

    def make(**sections: dict[str, Any]) -> Any:
        raw: dict[str, dict[str, Any]] = {
            "budget": {
                "ledger": ledger_url,
                "subject": SUBJECT,
                "purpose": PURPOSE,
                "epsilon": "1",
                "delta": "0.00001",
            },
            "data": {
                "source": "csv",
                "path": str(table),
                "label": "label",
                "features": [f"f{i}" for i in range(FEATURES)],
                "num_classes": 2,
                "rows": ROWS,
                "privacy_unit": "one synthetic row",
            },
            "model": {"hidden": [8]},
            "training": {
                "epochs": 2,
                "max_grad_norm": 1.0,
                "learning_rate": 0.5,
                "expected_batch_size": 40,
            },
            "accountant": {"kind": "rdp"},
            "randomness": {"source": "seeded", "seed": 3},
            "output": {"dir": str(tmp_path / "out")},
            "receipt": {
                "signing_key": str(receipt_key[0]),
                "data_digest_key": str(data_key_path),
            },
        }
        for name, values in sections.items():
            raw.setdefault(name, {}).update(values)
            for key in [k for k, v in values.items() if v is None]:
                del raw[name][key]
        return config_from_mapping(raw)

    return make


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """One intra-op thread: on a shared 2-core machine torch's default pool thrashes
    (measured 20x slower); the tests never depend on parallelism."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
