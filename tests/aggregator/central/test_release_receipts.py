"""Signed central-release receipts: written by `fedldp release`, checked by `fedldp verify
release` against the ledger; each tamper fails on its own check (SQLite and PostgreSQL)."""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fedldp.aggregator.central.datakey import generate_data_key, load_data_key
from fedldp.aggregator.central.receipts import release_receipt, verify_release_receipt
from fedldp.aggregator.central.releases import private_count
from fedldp.aggregator.central.signing import (
    RELEASE_RECEIPT_TYPE,
    payload_of,
    sign,
    trusted_keys,
)
from fedldp.authoring import generate_key, load_private_key
from fedldp.client.policy import key_id_of, load_public_key
from fedldp.collector.ledger import Ledger, open_ledger

from fedldp.cli import main

SUBJECT, PURPOSE = "team", "weekly"


@pytest.fixture
def ledger(url: str) -> Any:
    led = open_ledger(url)
    led.set_central_cap(SUBJECT, PURPOSE, epsilon_cap=Decimal(10), delta_cap=Decimal("1e-4"))
    yield led
    led.close()


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(receipt signing key, its public key, the secret data-digest key)."""
    out = CliRunner().invoke(main, ["keys", "generate", "--out", str(tmp_path), "--name", "rcpt"])
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(main, ["keys", "data-key", "--out", str(tmp_path / "data.hkey")])
    assert out.exit_code == 0, out.output
    return tmp_path / "rcpt.key", tmp_path / "rcpt.pub", tmp_path / "data.hkey"


def _release(
    url: str, tmp_path: Path, keys: tuple[Path, Path, Path], kind: str, *extra: str
) -> Path:
    data = tmp_path / "data.txt"
    data.write_text("\n".join(str(v) for v in range(1, 41)) + "\n")
    receipt = tmp_path / f"{kind}.receipt.json"
    out = CliRunner().invoke(
        main,
        [
            "release", kind, "--ledger", url, "--subject", SUBJECT, "--purpose", PURPOSE,
            "--epsilon", "1", "--key", f"k-{kind}", "--data", str(data),
            "--receipt", str(receipt), "--signing-key", str(keys[0]),
            "--data-key", str(keys[2]), *extra,
        ],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    return receipt


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("count", ()),
        ("sum", ("--lower", "0", "--upper", "50")),
        (
            "mean",
            ("--lower", "0", "--upper", "50", "--mechanism", "gaussian", "--delta", "0.000001"),
        ),
        ("choice", ("--candidates", "1,2,3")),
    ],
)
def test_every_release_kind_verifies(
    ledger: Ledger, url: str, tmp_path: Path, keys: tuple[Path, Path, Path], kind: str, extra: Any
) -> None:
    receipt = _release(url, tmp_path, keys, kind, *extra)
    out = CliRunner().invoke(
        main,
        [
            "verify", "release", str(receipt), "--ledger", url,
            "--trusted-key", str(keys[1]), "--data", str(tmp_path / "data.txt"),
            "--data-key", str(keys[2]),
        ],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "release receipt verified" in out.output and "SKIP" not in out.output


def test_each_tamper_fails_on_its_own_check(
    ledger: Ledger, url: str, tmp_path: Path, keys: tuple[Path, Path, Path]
) -> None:
    path = _release(url, tmp_path, keys, "sum", "--lower", "0", "--upper", "50")
    original = payload_of(json.loads(path.read_text()))
    key = load_private_key(keys[0])
    trusted = trusted_keys([load_public_key(keys[1])])

    def failures(receipt: dict[str, Any], signer: Any = key, **kw: Any) -> dict[str, str]:
        path.write_text(json.dumps(sign(RELEASE_RECEIPT_TYPE, receipt, signer)))
        return verify_release_receipt(path, trusted=trusted, ledger=ledger, **kw).failures()

    data_key = load_data_key(keys[2])
    assert failures(original, data_path=tmp_path / "data.txt", data_key=data_key) == {}

    def edit(fn: Any) -> dict[str, Any]:
        forged = copy.deepcopy(original)
        fn(forged)
        return forged

    value = edit(lambda r: r.update(value=str(Decimal(r["value"]) + 1)))
    assert set(failures(value)) == {"value"}
    output = edit(lambda r: r["events"][0].update(output="0"))
    assert set(failures(output)) == {"events", "value"}
    spent = edit(lambda r: r["ledger"].update(epsilon_spent="0.5"))
    assert "receipt epsilon_spent 0.5 != ledger's 1" in failures(spent)["reservation"]
    moved = edit(lambda r: r["ledger"].update(reservation_id="f" * 32))
    assert "no reservation" in failures(moved)["reservation"]
    weaker = edit(lambda r: r["events"][0].update(scale="1/100"))  # noise shrunk 1000x
    got = failures(weaker)
    assert "noise gives more than its epsilon" in got["accountant replay"] and "events" in got
    assert "untrusted key" in failures(original, generate_key())["signature"]
    other_key = generate_data_key(tmp_path / "other.hkey")
    wrong = failures(original, data_path=tmp_path / "data.txt", data_key=other_key)["data"]
    assert f"not {other_key.key_id}" in wrong
    (tmp_path / "data.txt").write_text("1\n")
    changed = failures(original, data_path=tmp_path / "data.txt", data_key=data_key)
    assert "does not match the receipt's keyed digest" in changed["data"]


def test_a_seeded_release_is_not_for_release(ledger: Ledger, tmp_path: Path) -> None:
    import random

    key = generate_key()
    rel = private_count(
        ledger,
        subject=SUBJECT,
        purpose=PURPOSE,
        epsilon=Decimal(1),
        idempotency_key="seeded",
        now=1,
        load=lambda: ["a", "b"],
        rng=random.Random(4),
        receipt_key_id=key_id_of(key.public_key()),  # the key bound in the ledger
    )
    receipt = release_receipt(ledger, rel.reservation_id, value=str(rel.value), randomness="seeded")
    path = tmp_path / "seeded.json"
    path.write_text(json.dumps(sign(RELEASE_RECEIPT_TYPE, receipt, key)))
    trusted = trusted_keys([key.public_key()])
    refused = verify_release_receipt(path, trusted=trusted, ledger=ledger).failures()
    assert set(refused) == {"randomness"} and "not for release" in refused["randomness"]
    assert verify_release_receipt(path, trusted=trusted, ledger=ledger, accept_seeded=True).ok


def _every_string(document: Any) -> set[str]:
    """Every string (keys and values) anywhere in a JSON document."""
    if isinstance(document, dict):
        return {str(k) for k in document} | set().union(*map(_every_string, document.values()))
    if isinstance(document, list):
        return set().union(set(), *map(_every_string, document))
    return {str(document)}


def test_no_plain_digest_of_the_data_is_published(
    ledger: Ledger, url: str, tmp_path: Path, keys: tuple[Path, Path, Path]
) -> None:
    """Finding 02: an adversary who knows every row but one hashes each completion of the
    file; neither the receipt nor the ledger's events may hold a plain digest to match."""
    import hashlib

    known = ["1", "0", "1", "1", "0"] * 20
    data = tmp_path / "data.txt"
    data.write_text("\n".join([*known, "1"]) + "\n")
    receipt = tmp_path / "r.json"
    out = CliRunner().invoke(
        main,
        [
            "release", "sum", "--ledger", url, "--subject", SUBJECT, "--purpose", PURPOSE,
            "--epsilon", "0.1", "--key", "q1", "--data", str(data), "--lower", "0",
            "--upper", "1", "--receipt", str(receipt), "--signing-key", str(keys[0]),
            "--data-key", str(keys[2]),
        ],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    published = _every_string(payload_of(json.loads(receipt.read_text())))
    published |= set().union(
        *(_every_string(dict(e.event)) for e in ledger.central_events(SUBJECT, PURPOSE))
    )
    for guess in ("0", "1"):
        candidate = ("\n".join([*known, guess]) + "\n").encode()
        for digest in (hashlib.sha256(candidate).hexdigest(), hashlib.sha1(candidate).hexdigest()):
            assert not any(digest in s for s in published)
    assert payload_of(json.loads(receipt.read_text()))["data"]["hmac_sha256"] is not None
    # without the key, verify says the data binding was not checked (never "verified data")
    out = CliRunner().invoke(
        main,
        [
            "verify", "release", str(receipt), "--ledger", url,
            "--trusted-key", str(keys[1]), "--data", str(data),
        ],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "SKIP data: data binding not checked (needs --data-key KEY)" in out.output


def test_without_a_data_key_no_data_digest_is_recorded(
    ledger: Ledger, url: str, tmp_path: Path, keys: tuple[Path, Path, Path]
) -> None:
    data = tmp_path / "data.txt"
    data.write_text("1\n2\n")
    receipt = tmp_path / "r.json"
    out = CliRunner().invoke(
        main,
        [
            "release", "count", "--ledger", url, "--subject", SUBJECT, "--purpose", PURPOSE,
            "--epsilon", "1", "--key", "nokey", "--data", str(data),
            "--receipt", str(receipt), "--signing-key", str(keys[0]),
        ],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert payload_of(json.loads(receipt.read_text()))["data"]["hmac_sha256"] is None
    (event,) = ledger.central_events(SUBJECT, PURPOSE)
    assert not any("data" in k for k in event.event)
    got = verify_release_receipt(
        receipt,
        trusted=trusted_keys([load_public_key(keys[1])]),
        ledger=ledger,
        data_path=data,
        data_key=load_data_key(keys[2]),
    ).failures()
    assert "records no data binding" in got["data"]


def test_a_plain_hash_is_refused_as_data_digest(ledger: Ledger) -> None:
    """The API refuses a data_digest that is not keyed (charged: it ran after the read)."""
    with pytest.raises(TypeError, match="plain hash of protected data is never published"):
        private_count(
            ledger,
            subject=SUBJECT,
            purpose=PURPOSE,
            epsilon=Decimal(1),
            idempotency_key="plain",
            now=1,
            load=lambda: ["a"],
            data_digest=lambda: "ab" * 32,  # type: ignore[arg-type,return-value]
        )
    assert ledger.central_events(SUBJECT, PURPOSE) == [] or all(
        "data_hmac_sha256" not in e.event for e in ledger.central_events(SUBJECT, PURPOSE)
    )


def test_a_seeded_release_is_marked_from_the_ledger(ledger: Ledger, tmp_path: Path) -> None:
    """Finding 06: a seeded release (rng passed) must not get a for-release receipt even when
    its builder does not say so: the ledger's events record the randomness source."""
    import random

    key = generate_key()
    rel = private_count(
        ledger,
        subject=SUBJECT,
        purpose=PURPOSE,
        epsilon=Decimal("0.5"),
        idempotency_key="seeded-quiet",
        now=1,
        load=lambda: ["1"] * 37,
        rng=random.Random(1234),
        receipt_key_id=key_id_of(key.public_key()),  # the key bound in the ledger
    )
    (event,) = [e.event for e in ledger.central_events(SUBJECT, PURPOSE)]
    assert event["randomness"] == "seeded"
    receipt = release_receipt(ledger, rel.reservation_id, value=str(rel.value))
    assert receipt["randomness"] == {"source": "seeded"} and receipt["for_release"] is False
    trusted = trusted_keys([key.public_key()])
    path = tmp_path / "seeded.json"
    path.write_text(json.dumps(sign(RELEASE_RECEIPT_TYPE, receipt, key)))
    refused = verify_release_receipt(path, trusted=trusted, ledger=ledger).failures()
    assert set(refused) == {"randomness"}
    # a forger who re-signs it as "os-csprng" is caught by the ledger's record
    forged = copy.deepcopy(receipt)
    forged.update(randomness={"source": "os-csprng"}, for_release=True)
    path.write_text(json.dumps(sign(RELEASE_RECEIPT_TYPE, forged, key)))
    got = verify_release_receipt(path, trusted=trusted, ledger=ledger, accept_seeded=True)
    assert "the ledger's events record 'seeded'" in got.failures()["randomness"]
    # and one who also rewrites the events fails on the events check
    forged["events"][0]["randomness"] = "os-csprng"
    path.write_text(json.dumps(sign(RELEASE_RECEIPT_TYPE, forged, key)))
    assert "events" in verify_release_receipt(path, trusted=trusted, ledger=ledger).failures()


def test_an_os_csprng_release_records_its_source(ledger: Ledger) -> None:
    rel = private_count(
        ledger,
        subject=SUBJECT,
        purpose=PURPOSE,
        epsilon=Decimal("0.5"),
        idempotency_key="csprng",
        now=1,
        load=lambda: ["1"] * 3,
    )
    receipt = release_receipt(ledger, rel.reservation_id, value=str(rel.value))
    assert receipt["events"][0]["randomness"] == "os-csprng" and receipt["for_release"] is True


class _NoSubjectScan:
    """The ledger, except that reading every event of a subject fails: a receipt or a
    replay of one release must read only that release's row (`release_events`)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def central_events(self, subject: str, purpose: str) -> Any:
        raise AssertionError("read every event of the subject")


def test_a_receipt_reads_its_own_release_only(ledger: Ledger) -> None:
    """Built from `release_events`, the receipt is the same as from the subject's whole
    history (the older path, still used by ledgers without it), whatever came before."""
    rels = [
        private_count(
            ledger,
            subject=SUBJECT,
            purpose=PURPOSE,
            epsilon=Decimal("0.5"),
            idempotency_key=f"h{i}",
            now=1 + i,
            load=lambda: ["1"] * 3,
        )
        for i in range(4)
    ]
    again = private_count(
        _NoSubjectScan(ledger),
        subject=SUBJECT,
        purpose=PURPOSE,
        epsilon=Decimal("0.5"),
        idempotency_key="h2",
        now=9,
        load=lambda: pytest.fail("a replay reads no data"),
    )
    assert again == rels[2]  # the replay read the row of its own reservation

    class _Older:  # what release_receipt falls back to: reservation + central_events
        def ledger_id(self) -> str:
            return ledger.ledger_id()

        def reservation(self, rid: str) -> Any:
            return ledger.reservation(rid)

        def central_events(self, subject: str, purpose: str) -> Any:
            return ledger.central_events(subject, purpose)

    for rel in rels:
        fast = release_receipt(_NoSubjectScan(ledger), rel.reservation_id, value=str(rel.value))
        slow = release_receipt(_Older(), rel.reservation_id, value=str(rel.value))
        assert fast == slow and len(fast["events"]) == 1
        assert fast["ledger"]["reservation_id"] == rel.reservation_id
