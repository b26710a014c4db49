"""The ledger binds each reservation to the one key that may sign its receipt.

`fedldp release --receipt --signing-key` records the key id with the reservation
(`Ledger.reserve(receipt_key_id=...)`), and `fedldp verify release` refuses the
same receipt re-signed by another key, even one the verifier was told to trust
(the broken variant, trusting any --trusted-key, accepts it). A reservation whose
run recorded that it signs no receipt refuses every receipt; one made before the
ledger recorded keys (NULL, migration 0007) is reported as not bound (SKIP) and
still needs a trusted signer. SQLite files and the suite's PostgreSQL.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from fedldp.aggregator.central.receipts import verify_release_receipt
from fedldp.aggregator.central.signing import (
    RELEASE_RECEIPT_TYPE,
    payload_of,
    sign,
    trusted_keys,
)
from fedldp.authoring import load_private_key
from fedldp.client.policy import key_id_of, load_public_key
from fedldp.collector.ledger import open_ledger
from fedldp.collector.ledger.schema import central_reservations

from fedldp.cli import main

SUBJECT, PURPOSE = "team", "weekly"


@pytest.fixture
def url(url: str) -> str:
    """The store's ledger URL (conftest.py), with the purpose's cap set."""
    led = open_ledger(url)
    led.set_central_cap(SUBJECT, PURPOSE, epsilon_cap=Decimal(10), delta_cap=Decimal("1e-4"))
    led.close()
    return url


def _keys(tmp_path: Path, name: str) -> tuple[Path, Path]:
    out = CliRunner().invoke(main, ["keys", "generate", "--out", str(tmp_path), "--name", name])
    assert out.exit_code == 0, out.output
    return tmp_path / f"{name}.key", tmp_path / f"{name}.pub"


def _release(url: str, tmp_path: Path, key: Path) -> Path:
    data = tmp_path / "data.txt"
    data.write_text("\n".join(str(v) for v in range(1, 41)) + "\n")
    receipt = tmp_path / "count.receipt.json"
    out = CliRunner().invoke(
        main,
        [
            "release", "count", "--ledger", url, "--subject", SUBJECT, "--purpose", PURPOSE,
            "--epsilon", "1", "--key", "k-count", "--data", str(data),
            "--receipt", str(receipt), "--signing-key", str(key),
        ],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    return receipt


def _verify(url: str, receipt: Path, *trusted: Path) -> Any:
    args = ["verify", "release", str(receipt), "--ledger", url]
    for pub in trusted:
        args += ["--trusted-key", str(pub)]
    return CliRunner().invoke(main, args)


def _set_bound(url: str, value: str | None) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.update(central_reservations).values(receipt_key_id=value))
    engine.dispose()


def test_a_receipt_re_signed_by_another_trusted_key_is_refused(url: str, tmp_path: Path) -> None:
    service_key, service_pub = _keys(tmp_path, "service")
    other_key, other_pub = _keys(tmp_path, "other")
    receipt = _release(url, tmp_path, service_key)
    led = open_ledger(url)
    try:
        (res,) = led.reservations(SUBJECT, PURPOSE)
        assert res.receipt_key_id == key_id_of(load_public_key(service_pub))
    finally:
        led.close()
    ok = _verify(url, receipt, service_pub, other_pub)
    assert ok.exit_code == 0, ok.output
    assert "ok   receipt key: signed by" in ok.output
    # The same payload, re-signed by a key the verifier also trusts.
    payload = payload_of(json.loads(receipt.read_text()))
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(sign(RELEASE_RECEIPT_TYPE, payload, load_private_key(other_key))))
    refused = _verify(url, forged, service_pub, other_pub)
    assert refused.exit_code == 1, refused.output
    assert "ok   signature" in refused.output  # the broken variant stops here: accepted
    assert "FAIL receipt key: not signed by key" in refused.output
    # The bound key not among the trusted ones: refused too (a trusted forger is not enough).
    alone = _verify(url, forged, other_pub)
    assert alone.exit_code == 1 and "FAIL receipt key" in alone.output


def test_unbound_and_unsigned_reservations(url: str, tmp_path: Path) -> None:
    service_key, service_pub = _keys(tmp_path, "service")
    other_key, other_pub = _keys(tmp_path, "other")
    receipt = _release(url, tmp_path, service_key)
    payload = payload_of(json.loads(receipt.read_text()))
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(sign(RELEASE_RECEIPT_TYPE, payload, load_private_key(other_key))))
    led = open_ledger(url)
    try:
        _set_bound(url, "")  # the run recorded that it signs no receipt
        out = verify_release_receipt(
            receipt, trusted=trusted_keys([load_public_key(service_pub)]), ledger=led
        )
        assert "signs no receipt" in out.failures()["receipt key"]
        _set_bound(url, None)  # a reservation made before migration 0007
        old = verify_release_receipt(
            forged, trusted=trusted_keys([load_public_key(other_pub)]), ledger=led
        )
        (check,) = [c for c in old.checks if c.name == "receipt key"]
        assert check.skipped and "predates receipt-key binding" in check.detail
        assert old.ok  # only the trusted-key check applies to such a reservation
        untrusted = verify_release_receipt(
            forged, trusted=trusted_keys([load_public_key(service_pub)]), ledger=led
        )
        assert "signature" in untrusted.failures()
    finally:
        led.close()
    skipped = _verify(url, receipt, service_pub)
    assert skipped.exit_code == 0 and "SKIP receipt key: not bound" in skipped.output
