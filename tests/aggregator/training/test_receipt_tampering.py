"""Signed training receipts checked against the ledger: every tamper fails on its own check.

The forger is given the strongest position: the trusted receipt key itself
(a compromised signer), so the signature passes and only the binding to the
ledger can catch the change; the same forgeries signed by another key, or
edited without re-signing, fail on the signature. SQLite and PostgreSQL.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install 'fedldp[train]'")
pytest.importorskip("opacus", reason="needs the train extra: pip install 'fedldp[train]'")

from fedldp.aggregator.central.signing import TRAINING_RECEIPT_TYPE, sign, trusted_keys
from fedldp.aggregator.training import train_private
from fedldp.aggregator.training.receipt import load_receipt, replay_epsilons, verify_receipt
from fedldp.authoring import generate_key, load_private_key
from fedldp.client.policy import load_public_key
from fedldp.collector.ledger import Ledger, open_ledger

from .conftest import ConfigFactory

pytestmark = [
    pytest.mark.train,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgresql_url"))


def _double_noise(r: dict[str, Any]) -> None:
    """σ doubled and every ε recomputed from it: a self-consistent forgery."""
    r["training"]["noise_multiplier"] *= 2
    hist = r["privacy"]["accountant"]["state"]["history"]
    for h in hist:
        h[0] *= 2
    r["privacy"]["epsilon"].update(replay_epsilons(r))


def _raise_budget(r: dict[str, Any]) -> None:
    r["privacy"]["epsilon_budget"] = "5"


def _other_reservation(r: dict[str, Any]) -> None:
    r["ledger"]["reservation_id"] = "0" * 32


def _seeded(r: dict[str, Any]) -> None:
    r["randomness"] = {"source": "seeded"}
    r["for_release"] = False


TAMPERS: list[tuple[Callable[[dict[str, Any]], None], str, str]] = [
    (_double_noise, "accountant inputs", "noise_multiplier"),
    (_raise_budget, "reservation", "receipt epsilon_budget 5 != ledger's 1"),
    (_other_reservation, "reservation", "no reservation '000"),
    (_seeded, "randomness", "a seeded run is not for release"),
]


def test_each_tamper_fails_with_its_own_message(
    make_config: ConfigFactory,
    ledger: Ledger,
    check_receipt: Callable[..., Any],
    receipt_key: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    cfg = make_config(randomness={"source": "os-entropy", "seed": None})
    result = train_private(cfg, ledger=ledger)
    path = result.receipt_path
    assert check_receipt(path, accept_seeded=False).ok
    original = load_receipt(path)
    trusted_key = load_private_key(receipt_key[0])

    def write(receipt: dict[str, Any], key: Any = trusted_key) -> None:
        path.write_text(json.dumps(sign(TRAINING_RECEIPT_TYPE, receipt, key)))

    for tamper, check, message in TAMPERS:
        forged = copy.deepcopy(original)
        tamper(forged)
        write(forged)  # signed with the trusted key: only the ledger binding can tell
        failures = check_receipt(path, accept_seeded=False).failures()
        assert check in failures and message in failures[check], (tamper.__name__, failures)
        assert "signature" not in failures

    forged = copy.deepcopy(original)
    _double_noise(forged)
    write(forged, generate_key())  # signed by anyone else
    assert "untrusted key" in check_receipt(path).failures()["signature"]

    # the untouched receipt re-signed by another key the verifier ALSO trusts: the
    # ledger binds the reservation to the run's key (`receipt_key_id`), so it fails
    other = generate_key()
    write(original, other)
    both = trusted_keys([load_public_key(receipt_key[1]), other.public_key()])
    failures = verify_receipt(path, trusted=both, ledger=ledger, accept_seeded=True).failures()
    assert set(failures) == {"receipt key"}, failures
    assert "not signed by key" in failures["receipt key"]

    # the model replaced together with its digest in the receipt
    model = path.parent / "model.pt"
    model.write_bytes(model.read_bytes() + b"\0")
    forged = copy.deepcopy(original)
    forged["model"]["artifact_sha256"] = hashlib.sha256(model.read_bytes()).hexdigest()
    write(forged)
    failures = check_receipt(path, accept_seeded=False).failures()
    assert set(failures) == {"artifact"} and "the ledger's record" in failures["artifact"]

    # edited after signing, signature kept: the signature check says so
    envelope = sign(TRAINING_RECEIPT_TYPE, original, trusted_key)
    altered = copy.deepcopy(original)
    _raise_budget(altered)
    envelope["payload"] = sign(TRAINING_RECEIPT_TYPE, altered, trusted_key)["payload"]
    envelope["signatures"] = sign(TRAINING_RECEIPT_TYPE, original, trusted_key)["signatures"]
    path.write_text(json.dumps(envelope))
    assert "altered after it was signed" in check_receipt(path).failures()["signature"]

    # an unsigned receipt, and a receipt checked against another ledger
    path.write_text(json.dumps(original))
    unsigned = check_receipt(path).failures()
    assert "not signed" in unsigned["signature"] and "not signed" in unsigned["receipt key"]
    write(original)
    with open_ledger(f"sqlite:///{tmp_path / 'other.db'}") as other_ledger:
        failures = check_receipt(path, ledger=other_ledger).failures()
    assert "this ledger is" in failures["ledger identity"]
