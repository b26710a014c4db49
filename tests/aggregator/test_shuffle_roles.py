"""The shuffle model's roles: device sealing, shuffler, analyzer (docs/shuffle.md).

* sealing (fedldp.client.sealed): round trip for several payload kinds; a ciphertext does not
  open with another key or for another policy; sealing twice gives unrelated ciphertexts;
* analyzer (fedldp.aggregator.shuffle_analyzer): estimates from a shuffled batch equal, value for
  value and variance for variance, those from the same reports unshuffled; garbage, payloads
  sealed for another policy and out-of-domain outputs are dropped and counted by reason;
* shuffler (fedldp.aggregator.shuffler): refuses a batch below the minimum and changes nothing;
  releases once; refuses late ciphertexts; the order is a uniform permutation: the arrival
  position of the first of 4 items is uniform over 4000 permutations from the OS CSPRNG (χ² with
  3 df, α = 1e-6, critical value 30.66), an identity "shuffle" (broken variant, kept here) fails
  that test, and a release orders its batch by exactly that permutation;
* kill -9 of a real shuffler process after the permutation and after the rename: a restart
  loses nothing and releases nothing twice.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from fedldp.aggregator.shuffle_analyzer import analyze_batch, generate_analyzer_key
from fedldp.aggregator.shuffler import (
    BatchReleasedError,
    BatchTooSmallError,
    ShuffleSpool,
    permute,
    read_batch,
    release,
)
from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    NumericOutput,
    Output,
    OutputDomainError,
)
from fedldp.client.mechanisms.grr import GRR
from fedldp.client.sealed import key_id, open_sealed, seal_info, seal_output, seal_report

INFO = seal_info("shuffled-metric", 3, b"\x01" * 32)
OTHER_INFO = seal_info("another-metric", 3, b"\x01" * 32)
WORKER = Path(__file__).with_name("shuffle_kill_worker.py")
CHI2_3DF_ALPHA_1E6 = 30.66


def _keypair() -> tuple[X25519PrivateKey, bytes]:
    key = X25519PrivateKey.generate()
    return key, key.public_key().public_bytes_raw()


@pytest.mark.parametrize(
    "output",
    [CategoryOutput(5), BitVectorOutput(b"\x0f\x01", 9), NumericOutput(-0.25)],
)
def test_seal_round_trip(output: Output) -> None:
    """The analyzer opens exactly the output the device sealed."""
    key, public = _keypair()
    sealed = seal_output(output, public, info=INFO)
    assert sealed.key_id == key_id(public)
    assert open_sealed(sealed.ciphertext, key, info=INFO) == output


def test_sealed_payload_opens_only_with_its_key_and_policy() -> None:
    """Another key, another policy's info, or a flipped byte: MALFORMED_SEALED."""
    key, public = _keypair()
    other_key, _ = _keypair()
    ciphertext = seal_output(CategoryOutput(1), public, info=INFO).ciphertext
    flipped = ciphertext[:-1] + bytes([ciphertext[-1] ^ 1])
    for bad_key, bad_info, bad_ct in (
        (other_key, INFO, ciphertext),
        (key, OTHER_INFO, ciphertext),
        (key, INFO, flipped),
        (key, INFO, b""),
    ):
        with pytest.raises(OutputDomainError) as err:
            open_sealed(bad_ct, bad_key, info=bad_info)
        assert err.value.reason == "MALFORMED_SEALED"


def test_sealing_is_randomized() -> None:
    """Two seals of the same output share no ciphertext (fresh ephemeral key each time)."""
    _, public = _keypair()
    a = seal_output(CategoryOutput(2), public, info=INFO).ciphertext
    b = seal_output(CategoryOutput(2), public, info=INFO).ciphertext
    assert a != b and a[:32] != b[:32]


def _grr_reports(n: int, seed: int) -> tuple[GRR, list[CategoryOutput]]:
    grr = GRR(Decimal("2"), 8)
    rng = np.random.default_rng(seed)
    values = rng.choice(8, size=n, p=np.arange(8, 0, -1) / 36)
    return grr, [CategoryOutput(int(i)) for i in grr.perturb_batch(values, rng)]


def test_shuffled_estimate_equals_unshuffled_and_invalid_are_counted(tmp_path: Path) -> None:
    """Same estimate and variances as the plain reports; bad payloads dropped and counted."""
    key_path, public = generate_analyzer_key(tmp_path / "keys")
    key = X25519PrivateKey.from_private_bytes(_raw_private(key_path))
    grr, outputs = _grr_reports(600, seed=11)
    plain = grr.new_statistic()
    for o in outputs:
        grr.accumulate(plain, o)
    sealed = [seal_output(o, public, info=INFO).ciphertext for o in outputs]
    sealed += [b"garbage" * 10, seal_output(CategoryOutput(3), public, info=OTHER_INFO).ciphertext]
    sealed += [seal_output(CategoryOutput(99), public, info=INFO).ciphertext]
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add("w1", sealed)
    path = release(spool, "w1", tmp_path, min_batch=100)
    header = json.loads(path.read_bytes().split(b"\n")[1])
    assert header == {"batch": "w1", "count": 603}  # no subject, no time: ciphertexts only
    assert sorted(read_batch(path)[1]) == sorted(sealed)
    result = analyze_batch(path, grr, key, info=INFO)
    assert result.accepted == 600
    assert result.invalid == {"MALFORMED_SEALED": 2, "OUT_OF_DOMAIN": 1}
    shuffled, unshuffled = grr.estimate(result.statistic), grr.estimate(plain)
    assert np.array_equal(shuffled.values, unshuffled.values)
    assert np.array_equal(shuffled.variances, unshuffled.variances)
    assert result.central is not None and result.central.epsilon < 2.0
    assert "local ε0 = 2" in result.guarantee_line()


def _raw_private(path: Path) -> bytes:
    from fedldp.aggregator.shuffle_analyzer import load_analyzer_key

    return bytes(load_analyzer_key(path).private_bytes_raw())


def test_small_batch_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    """Below the minimum: BatchTooSmallError, no file, rows kept, still open for more."""
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add("w1", [bytes([i]) * 40 for i in range(9)])
    with pytest.raises(BatchTooSmallError, match="fewer than the minimum 10"):
        release(spool, "w1", tmp_path, min_batch=10)
    assert spool.pending("w1") == 9 and spool.released("w1") is None
    assert not list(tmp_path.glob("*.shuffled*"))
    spool.add("w1", [b"b" * 40])
    assert read_batch(release(spool, "w1", tmp_path, min_batch=10))[1].count(b"b" * 40) == 1


def test_released_once_and_late_ciphertexts_refused(tmp_path: Path) -> None:
    """A second release returns the same file unchanged; `add` to a released batch fails."""
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add("w1", [bytes([i]) * 40 for i in range(20)])
    path = release(spool, "w1", tmp_path, min_batch=5)
    first = path.read_bytes()
    assert release(spool, "w1", tmp_path, min_batch=5).read_bytes() == first
    with pytest.raises(BatchReleasedError):
        spool.add("w1", [b"late" * 10])
    assert spool.pending("w1") == 0


class _Identity(random.Random):
    """Broken variant: a "shuffle" that keeps arrival order."""

    def shuffle(self, x: Any) -> None:  # type: ignore[override]
        return None


def _first_position_chi2(rng: random.Random | None) -> float:
    """χ² of where the first-arrived of 4 items lands, over 4000 permutations."""
    positions: Counter[int] = Counter()
    items = [bytes([i]) for i in range(4)]
    for _ in range(4000):
        batch = list(items)
        permute(batch, rng)
        positions[batch.index(items[0])] += 1
    return sum((positions[i] - 1000) ** 2 / 1000 for i in range(4))


def test_order_is_independent_of_arrival() -> None:
    """The OS-CSPRNG permutation passes; the identity variant fails (α = 1e-6)."""
    assert _first_position_chi2(None) < CHI2_3DF_ALPHA_1E6
    assert _first_position_chi2(_Identity()) > CHI2_3DF_ALPHA_1E6


def test_release_orders_by_the_permutation(tmp_path: Path) -> None:
    """The released order is exactly `permute`'s (same seeded generator), not arrival order."""
    items = [bytes([i]) * 8 for i in range(30)]
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add("w1", items)
    expected = list(items)
    permute(expected, random.Random(7))
    _, out = read_batch(release(spool, "w1", tmp_path, min_batch=1, rng=random.Random(7)))
    assert out == expected != items


@pytest.mark.parametrize("stage", ["permuted", "written"])
def test_kill_9_loses_nothing_and_releases_once(tmp_path: Path, stage: str) -> None:
    """SIGKILL a real shuffler at `stage`; the restarted release holds every ciphertext once."""
    (tmp_path / "out").mkdir()
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    items = [i.to_bytes(4, "big") * 10 for i in range(50)]
    spool.add("w1", items)
    args = [str(tmp_path / "spool.sqlite"), "w1", str(tmp_path / "out"), stage]
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().decode().strip() == stage
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == (["w1.shuffled"] if stage == "written" else [])
    before = (tmp_path / "out" / "w1.shuffled").read_bytes() if stage == "written" else None
    with pytest.raises(BatchReleasedError):
        spool.add("w1", [b"late" * 10])  # claimed before the kill: closed for good
    path = release(spool, "w1", tmp_path / "out", min_batch=1)
    _, out = read_batch(path)
    assert sorted(out) == sorted(items)
    assert before is None or path.read_bytes() == before  # not re-permuted: released once
    record = spool.released("w1")
    assert spool.pending("w1") == 0 and record is not None and record[0] == 50
    assert release(spool, "w1", tmp_path / "out", min_batch=1).read_bytes() == path.read_bytes()


def test_bad_spool_input_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """Empty or oversized ciphertexts, or a batch key that is a path: ValueError, nothing added."""
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    with pytest.raises(ValueError, match="ciphertext must be"):
        spool.add("w1", [b"ok" * 20, b""])
    with pytest.raises(ValueError, match="ciphertext must be"):
        spool.add("w1", [b"x" * (64 * 1024 + 1)])
    for key in ("../escape", "a/b", "", "x" * 201):
        with pytest.raises(ValueError, match="batch key"):
            spool.add(key, [b"ok" * 20])
    assert spool.pending("w1") == 0
    with pytest.raises(ValueError, match="min_batch"):
        release(spool, "w1", tmp_path, min_batch=0)


def test_truncated_or_foreign_batch_file_is_refused(tmp_path: Path) -> None:
    """read_batch refuses a file that is not a batch, or is cut short."""
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add("w1", [bytes([i]) * 40 for i in range(5)])
    data = release(spool, "w1", tmp_path, min_batch=1).read_bytes()
    (tmp_path / "cut").write_bytes(data[:-3])
    (tmp_path / "foreign").write_bytes(b"hello\n" + data)
    with pytest.raises(ValueError, match="truncated"):
        read_batch(tmp_path / "cut")
    with pytest.raises(ValueError, match="not a fedldp shuffled batch"):
        read_batch(tmp_path / "foreign")


def test_plaintext_with_more_than_a_payload_is_refused() -> None:
    """A sealed Report that also names a report id (linkable) is MALFORMED_SEALED."""
    from fedldp.client.sealed import _suite
    from fedldp.v1 import collector_pb2

    key, public = _keypair()
    inner = collector_pb2.Report(report_id=b"\x01" * 16)
    inner.category.index = 1
    ciphertext = _suite().encrypt(inner.SerializeToString(), key.public_key(), info=INFO)
    with pytest.raises(OutputDomainError) as err:
        open_sealed(ciphertext, key, info=INFO)
    assert err.value.reason == "MALFORMED_SEALED"
    assert len(public) == 32


def test_batch_of_only_invalid_payloads_has_no_central_guarantee(tmp_path: Path) -> None:
    """No valid report: accepted 0, central None, and the line says so."""
    key, _ = _keypair()
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add("w1", [bytes([i]) * 48 for i in range(3)])
    result = analyze_batch(
        release(spool, "w1", tmp_path, min_batch=1), GRR(Decimal(1), 4), key, info=INFO
    )
    assert (result.accepted, result.central, result.invalid) == (0, None, {"MALFORMED_SEALED": 3})
    assert "no central guarantee" in result.guarantee_line()


def test_collector_count_caps_n(tmp_path: Path) -> None:
    """n for the central ε is min(valid reports, the collector's accepted count)."""
    key, public = _keypair()
    grr, outputs = _grr_reports(300, seed=3)
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add("w1", [seal_output(o, public, info=INFO).ciphertext for o in outputs])
    path = release(spool, "w1", tmp_path, min_batch=1)
    capped = analyze_batch(path, grr, key, info=INFO, collector_count=200)
    full = analyze_batch(path, grr, key, info=INFO)
    assert capped.central is not None and full.central is not None
    assert (capped.central.n, full.central.n) == (200, 300)
    assert capped.central.epsilon > full.central.epsilon


def test_seal_report_leaves_no_plain_payload() -> None:
    """A built report sealed in place: only `sealed` is set, and it opens to the same output."""
    from fedldp.v1 import collector_pb2

    key, public = _keypair()
    report = collector_pb2.Report(
        report_id=b"\x07" * 16,
        policy_id="shuffled-metric",
        policy_version=3,
        policy_digest=b"\x01" * 32,
        coarse_time=3600,
    )
    report.numeric.value = 0.625
    seal_report(report, public)
    assert report.WhichOneof("payload") == "sealed" and not report.HasField("numeric")
    assert open_sealed(report.sealed.ciphertext, key, info=INFO) == NumericOutput(0.625)


@pytest.mark.parametrize("extra", ["policy_version", "unknown_field", "bad_padding", "long_pad"])
def test_padded_plaintext_with_more_than_a_payload_is_refused(extra: str) -> None:
    """Correctly padded and sealed, yet carrying an extra field, an unknown field, non-zero
    padding or a whole spare block of padding: MALFORMED_SEALED. The untampered plaintext
    (the control, built the same way) opens."""
    from fedldp.client.sealed import PAD_BUCKET, _pad, _suite
    from fedldp.v1 import collector_pb2

    key = X25519PrivateKey.generate()
    inner = collector_pb2.Report()
    inner.category.index = 1
    control = _pad(inner.SerializeToString())
    if extra == "policy_version":
        inner.policy_version = 7
    encoded = inner.SerializeToString()
    if extra == "unknown_field":
        encoded += b"\xa8\x06\x2a"  # field 101, varint 42
    plaintext = _pad(encoded)
    if extra == "bad_padding":
        plaintext = plaintext[:-1] + b"\x01"
    elif extra == "long_pad":
        plaintext += bytes(PAD_BUCKET)
    assert open_sealed(_suite().encrypt(control, key.public_key(), info=INFO), key, info=INFO)
    with pytest.raises(OutputDomainError) as caught:
        open_sealed(_suite().encrypt(plaintext, key.public_key(), info=INFO), key, info=INFO)
    assert caught.value.reason == "MALFORMED_SEALED"


def test_per_device_guarantee_is_group_privacy() -> None:
    """m = 1 is the per-report guarantee; m = 3 is (3ε, δ(1 + e^ε + e^2ε)) (Dwork & Roth,
    Theorem 2.2), never below it; a huge m gives a vacuous δ of 1, not an overflow."""
    import math

    from fedldp.aggregator.shuffle_analyzer import _round_up_sig, per_device

    assert per_device(0.2, 1e-8, 1) == (0.2, 1e-8)
    eps, delta = per_device(0.2, 1e-8, 3)
    exact = 1e-8 * (1 + math.exp(0.2) + math.exp(0.4))
    assert eps == pytest.approx(0.6) and exact <= delta <= exact * (1 + 1e-9)
    assert per_device(0.2, 1e-8, 10**9) == (0.2 * 10**9, 1.0)
    assert float(_round_up_sig(exact)) >= exact and _round_up_sig(3.3e-8) == "3.30e-8"


def test_release_with_policies_enforces_the_signed_min_batch(
    tmp_path: Path, authority: Any
) -> None:
    """`release --policies --trust` refuses a window batch below the policy's signed min_batch
    even with --min-batch 1 (nothing changes); at the signed minimum it releases."""
    from click.testing import CliRunner

    from fedldp.cli import main
    from tests.aggregator.test_attack_shuffle import _shuffle_policy_dirs

    _, public = _keypair()
    trust, policies, verified = _shuffle_policy_dirs(tmp_path, authority, public, min_batch=6)
    info = seal_info(verified.policy_id, verified.version, verified.digest)
    batch = f"{verified.policy_id}.v{verified.version}.1000"
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add(
        batch, [seal_output(CategoryOutput(1), public, info=info).ciphertext for _ in "12345"]
    )
    args = ["shuffler", "release", "--spool", str(tmp_path / "spool.sqlite"), "--batch", batch]
    args += ["--out", str(tmp_path / "out"), "--min-batch", "1"]
    args += ["--policies", str(policies), "--trust", str(trust)]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 1 and "fewer than the minimum 6" in refused.output, refused.output
    assert spool.pending(batch) == 5 and spool.released(batch) is None
    spool.add(batch, [seal_output(CategoryOutput(2), public, info=info).ciphertext])
    assert CliRunner().invoke(main, args).exit_code == 0
    assert spool.released(batch) is not None
