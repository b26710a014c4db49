"""Independent attack on the shuffle model (docs/shuffle.md): sealing, shuffler, analyzer, bound.

Each finding is a test marked xfail(strict=True, reason="finding: ..."): it fails today and
becomes a regression test once the product is fixed. The tests without the mark are the
claims that held under attack (the amplification bound against an independent exact
brute-force in 60-digit decimals, its monotonicity and its lower bound).
"""

from __future__ import annotations

import itertools
import math
import random
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from fedldp.aggregator.shuffle_amplification import amplified_epsilon, hockey_stick_delta
from fedldp.aggregator.shuffle_analyzer import analyze_batch
from fedldp.aggregator.shuffler import (
    MAGIC,
    ShuffleSpool,
    batch_path,
    read_batch,
    release,
)
from fedldp.client.mechanisms.base import CategoryOutput
from fedldp.client.mechanisms.grr import GRR
from fedldp.client.policy import verify_policy
from fedldp.client.sealed import seal_info, seal_output

from fedldp.cli import main
from tests.aggregator.conftest import NOW, WINDOW
from tests.aggregator.test_reports import _folders

INFO = seal_info("atk", 1, b"\x07" * 32)


def _keypair() -> tuple[X25519PrivateKey, bytes]:
    """A fresh analyzer key and its raw public bytes."""
    from cryptography.hazmat.primitives import serialization

    key = X25519PrivateKey.generate()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return key, raw


# --- Confidentiality against the collector and the shuffler ---------------------------------


def test_ciphertext_length_does_not_depend_on_the_output() -> None:
    """Sealed GRR outputs 0, 1 and 200 (k = 256) must have one length: no padding today."""
    _, public = _keypair()
    lengths = {
        v: len(seal_output(CategoryOutput(v), public, info=INFO).ciphertext) for v in (0, 1, 200)
    }
    assert len(set(lengths.values())) == 1, lengths


# --- Analyzer input handling ------------------------------------------------------------------


def test_replayed_ciphertext_in_a_batch_is_counted_once(tmp_path: Path) -> None:
    """One report's ciphertext repeated 5 times in a batch of 20 moves the count by 5 today."""
    key, public = _keypair()
    grr = GRR(Decimal(2), 4)
    cts = [seal_output(CategoryOutput(i % 4), public, info=INFO).ciphertext for i in range(20)]
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add("w1", cts + [cts[0]] * 5)  # `add` (the shuffler's own API) does not deduplicate
    result = analyze_batch(release(spool, "w1", tmp_path, min_batch=2), grr, key, info=INFO)
    assert result.accepted == 20, (result.accepted, result.invalid)


def _batch_bytes(header: bytes, body: bytes) -> bytes:
    """A batch file's bytes: magic, a header line, records."""
    return MAGIC + header + b"\n" + body


@pytest.mark.parametrize(
    "data",
    [
        _batch_bytes(b'{"batch": "a", "count": 1}', b"\x00\x00"),  # length prefix cut short
        _batch_bytes(b"[1]", b""),  # header not an object
        _batch_bytes(b'{"batch": "a"}', b""),  # header without a count
    ],
    ids=["cut-length", "header-list", "header-no-count"],
)
def test_malformed_batch_file_is_a_value_error(tmp_path: Path, data: bytes) -> None:
    """Every malformed batch file gives ValueError (what analyze turns into a clean error)."""
    (tmp_path / "bad").write_bytes(data)
    with pytest.raises(ValueError):
        read_batch(tmp_path / "bad")


def test_garbage_and_out_of_domain_and_foreign_ciphertexts_are_dropped(tmp_path: Path) -> None:
    """Held: junk, an out-of-domain index, another policy's ciphertext, a plaintext of another
    payload kind: each is dropped and counted, none accumulated, nothing crashes."""
    from fedldp.client.mechanisms.base import BitVectorOutput

    key, public = _keypair()
    grr = GRR(Decimal(1), 4)
    other = seal_info("atk", 2, b"\x07" * 32)  # the next policy version
    good = [seal_output(CategoryOutput(1), public, info=INFO).ciphertext for _ in range(3)]
    bad = [
        b"\x00" * 60,
        seal_output(CategoryOutput(4), public, info=INFO).ciphertext,
        seal_output(CategoryOutput(1), public, info=other).ciphertext,
        seal_output(BitVectorOutput(b"\x01", 4), public, info=INFO).ciphertext,
    ]
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add("w1", good + bad)
    result = analyze_batch(release(spool, "w1", tmp_path, min_batch=2), grr, key, info=INFO)
    assert result.accepted == 3
    assert sum(result.invalid.values()) == 4, result.invalid
    assert list(result.statistic.counts) == [0, 3, 0, 0]


# --- Release: the signed minimum and releasing once --------------------------------------------


def _shuffle_policy_dirs(tmp_path: Path, authority: Any, public: bytes, min_batch: int) -> Any:
    """A signed GRR policy with a [shuffle] section; (trust dir, policies dir, verified)."""
    policy = authority.categorical_policy(
        labels=["a", "b", "c", "d"],
        policy_id="atk",
        metric="metric.atk",
        epsilon="1",
        epsilon_cap="3",
        window_seconds=WINDOW,
        now=NOW - 60,
        version=1,
        min_reports=1,
    )
    policy.shuffle.analyzer_public_key = public
    policy.shuffle.min_batch = min_batch
    verified = verify_policy(authority.sign(policy), authority.trust_store(now=NOW), now=NOW)
    return (*_folders(authority, verified, tmp_path), verified)


def _analyze(tmp_path: Path, authority: Any, min_batch: int, n: int) -> Any:
    """`fedldp shuffler analyze`, in-process, of a released batch of n sealed reports."""
    trust, policies, batch = _sealed_batch(tmp_path, authority, min_batch, n)
    args = ["shuffler", "analyze", str(batch), "--analyzer-key", str(tmp_path / "analyzer.key")]
    args += ["--policy", "atk", "--policies", str(policies), "--trust", str(trust)]
    return CliRunner().invoke(main, args)


def _sealed_batch(tmp_path: Path, authority: Any, min_batch: int, n: int) -> Any:
    """Keys, a shuffle policy (min_batch) and a released batch of n valid sealed reports."""
    from fedldp.aggregator.shuffle_analyzer import generate_analyzer_key

    _, public = generate_analyzer_key(tmp_path)
    trust, policies, verified = _shuffle_policy_dirs(tmp_path, authority, public, min_batch)
    info = seal_info(verified.policy_id, verified.version, verified.digest)
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add(
        "b", [seal_output(CategoryOutput(i % 4), public, info=info).ciphertext for i in range(n)]
    )
    (tmp_path / "out").mkdir()
    # the operator's --min-batch is all `release` knows: the policy's minimum is not consulted
    path = release(spool, "b", tmp_path / "out", min_batch=1)
    return trust, policies, path


def test_batch_below_the_policys_min_batch_is_refused(tmp_path: Path, authority: Any) -> None:
    """A batch of 5 under a policy whose signed min_batch is 100 must not be estimated."""
    result = _analyze(tmp_path, authority, min_batch=100, n=5)
    assert result.exit_code != 0, result.output


def test_guarantee_accounts_for_several_reports_per_device(tmp_path: Path, authority: Any) -> None:
    """With a per-window cap of 3 reports per device the printed guarantee must say per device."""
    result = _analyze(tmp_path, authority, min_batch=2, n=40)
    assert result.exit_code == 0, result.output
    assert "per device" in result.output, result.output


def test_restart_with_another_out_dir_does_not_release_twice(tmp_path: Path) -> None:
    """Crash after "written" (the file is the release), restart into another folder."""
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    spool.add("w1", [bytes([i]) * 60 for i in range(10)])

    def crash(stage: str) -> None:
        if stage == "written":
            raise KeyboardInterrupt  # stands in for kill -9 (the roles test kills a process)

    (tmp_path / "a").mkdir()
    with pytest.raises(KeyboardInterrupt):
        release(spool, "w1", tmp_path / "a", min_batch=2, on_stage=crash)
    (tmp_path / "b").mkdir()
    release(spool, "w1", tmp_path / "b", min_batch=2)
    assert not batch_path(tmp_path / "b", "w1").exists()


# --- The amplification bound against an independent exact computation -------------------------


def _exact_fmt_delta(n: int, eps0: Decimal, eps: Decimal) -> Decimal:
    """max(D_{e^ε}(P‖Q), D_{e^ε}(Q‖P)) for FMT21 Theorem 3.2's P, Q, enumerated in decimals.

    C ~ Bin(n − 1, e^−ε0), A ~ Bin(C, 1/2), Δ ~ Bern(e^ε0/(e^ε0 + 1));
    P = (A + Δ, C − A + 1 − Δ), Q = (A + 1 − Δ, C − A + Δ). Written from the paper, not the code.
    """
    p_clone = (-eps0).exp()
    alpha = eps0.exp() / (eps0.exp() + 1)
    dist_p: dict[tuple[int, int], Decimal] = {}
    dist_q: dict[tuple[int, int], Decimal] = {}
    for c in range(n):
        pc = math.comb(n - 1, c) * p_clone**c * (1 - p_clone) ** (n - 1 - c)
        for a in range(c + 1):
            pa = pc * math.comb(c, a) / Decimal(2) ** c
            for d, pd in ((1, alpha), (0, 1 - alpha)):
                pk, qk = (a + d, c - a + 1 - d), (a + 1 - d, c - a + d)
                dist_p[pk] = dist_p.get(pk, Decimal(0)) + pa * pd
                dist_q[qk] = dist_q.get(qk, Decimal(0)) + pa * pd
    e = eps.exp()
    keys = set(dist_p) | set(dist_q)
    zero = Decimal(0)
    fwd = sum((max(dist_p.get(k, zero) - e * dist_q.get(k, zero), zero) for k in keys), zero)
    bwd = sum((max(dist_q.get(k, zero) - e * dist_p.get(k, zero), zero) for k in keys), zero)
    return max(fwd, bwd)


def _exact_rr_delta(n: int, eps0: Decimal, eps: Decimal) -> Decimal:
    """Exact δ(ε) of binary randomized response (Warner 1965) shuffled over n users."""
    q = 1 / (eps0.exp() + 1)
    others = [math.comb(n - 1, k) * q**k * (1 - q) ** (n - 1 - k) for k in range(n)] + [Decimal(0)]
    e, zero = eps.exp(), Decimal(0)
    fwd = bwd = zero
    for k in range(n + 1):
        shift = others[k - 1] if k else zero
        x0, x1 = (1 - q) * others[k] + q * shift, q * others[k] + (1 - q) * shift
        fwd += max(x1 - e * x0, zero)
        bwd += max(x0 - e * x1, zero)
    return max(fwd, bwd)


CASES = [
    (1, 2.0, 1e-3),
    (2, 1.0, 1e-3),
    (150, 2.0, 1e-6),
    (8, 2.0, 1e-3),
    (20, 1.0, 1e-6),
    (30, 3.0, 1e-4),
    (40, 0.5, 1e-6),
]


@pytest.mark.parametrize(("n", "eps0", "delta"), CASES)
def test_amplified_epsilon_is_certified_and_tight_by_exact_enumeration(
    n: int, eps0: float, delta: float
) -> None:
    """Held: the per-c divergence equals the enumeration; at the returned ε the exact divergence
    is ≤ δ, 10⁻³ below it it is > δ; ε is never below shuffled binary RR's exact ε."""
    with localcontext() as ctx:
        ctx.prec = 60
        e0 = Decimal(eps0)
        for eps in (0.0, eps0 / 7, eps0 / 2):
            exact = _exact_fmt_delta(n, e0, Decimal(eps))
            assert abs(Decimal(hockey_stick_delta(n, eps0, eps)) - exact) <= Decimal("1e-12")
        got = amplified_epsilon(n, eps0, delta).epsilon
        assert _exact_fmt_delta(n, e0, Decimal(got)) <= Decimal(delta)
        if got > 1e-3:
            assert _exact_fmt_delta(n, e0, Decimal(got - 1e-3)) > Decimal(delta)
            assert _exact_rr_delta(n, e0, Decimal(got)) <= Decimal(delta)


def test_amplified_epsilon_is_monotone() -> None:
    """Held: ε falls with n, rises with ε0, falls as δ grows (a fixed grid)."""
    rng = random.Random(7)
    for _ in range(4):
        eps0 = rng.choice([0.5, 1.0, 2.0, 4.0])
        delta = rng.choice([1e-4, 1e-6, 1e-8])
        by_n = [amplified_epsilon(n, eps0, delta).epsilon for n in (10, 100, 1000, 5000)]
        assert all(a >= b for a, b in itertools.pairwise(by_n)), by_n
    by_e0 = [amplified_epsilon(1000, e0, 1e-6).epsilon for e0 in (0.5, 1, 2, 4, 6)]
    assert all(a <= b for a, b in itertools.pairwise(by_e0)), by_e0
    by_d = [amplified_epsilon(1000, 2.0, d).epsilon for d in (1e-10, 1e-7, 1e-4)]
    assert all(a >= b for a, b in itertools.pairwise(by_d)), by_d
    assert np.all(np.isfinite(by_n + by_e0 + by_d))


# --- The ledger: sealed reports charged like plain ones, on SQLite and PostgreSQL ---------------


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh ledger database: a SQLite file, or a database on the suite's PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgresql_url"))


def test_sealed_reports_are_charged_capped_and_idempotent(
    tmp_path: Path, authority: Any, ledger_url: str
) -> None:
    """Held: ε0 = 1 charged per sealed report under cap 3, the 4th refused, a resend a duplicate,
    a reseal under the same id a conflict; the pull gets the 3 ciphertexts sorted, no statistic."""
    from fedldp.client.mechanisms.base import SealedOutput
    from fedldp.client.sealed import key_id
    from fedldp.collector.ledger import open_ledger
    from fedldp.collector.ledger.store import CheckedReport
    from fedldp.collector.wire import content_digest
    from fedldp.v1 import collector_pb2 as pb

    _, public = _keypair()
    _, _, policy = _shuffle_policy_dirs(tmp_path, authority, public, min_batch=2)
    info = seal_info(policy.policy_id, policy.version, policy.digest)
    coarse = NOW - NOW % 3600

    def checked(rid: bytes, index: int) -> CheckedReport:
        ct = seal_output(CategoryOutput(index), public, info=info).ciphertext
        out = SealedOutput(ct, key_id(public))
        digest = content_digest(
            policy_id=policy.policy_id,
            policy_version=policy.version,
            policy_digest=policy.digest,
            coarse_time=coarse,
            output=out,
        )
        return CheckedReport(rid, policy, out, digest, coarse)

    reports = [checked(bytes([i]) * 16, i % 4) for i in range(4)]
    ledger = open_ledger(ledger_url)
    try:
        got = ledger.submit("dana", reports, now=NOW)
        assert got == [pb.OUTCOME_ACCEPTED] * 3 + [pb.OUTCOME_BUDGET_EXHAUSTED]
        again = ledger.submit("dana", [reports[0], checked(reports[1].report_id, 1)], now=NOW)
        assert again[0] == pb.OUTCOME_DUPLICATE and again[1] != pb.OUTCOME_ACCEPTED
        assert [str(r.epsilon_spent) for r in ledger.subject_spend("dana")] == ["3"]
        window = policy.window_start(NOW)
        pulled = ledger.sealed_ciphertexts(policy.policy_id, window)
        expected = sorted(
            r.output.ciphertext for r in reports[:3] if type(r.output) is SealedOutput
        )
        assert pulled == {policy.version: expected}
        assert ledger.statistics(policy.policy_id, policy.version, window) == []
    finally:
        ledger.close()


def test_printed_central_epsilon_is_never_below_the_certified_one() -> None:
    """The printed ε must be rounded up: docs/shuffle.md says the printed ε is certified."""
    import re

    from fedldp.aggregator.shuffle_amplification import AmplifiedGuarantee
    from fedldp.aggregator.shuffle_analyzer import ShuffledRelease

    central = AmplifiedGuarantee(1000, 2.0, 0.12344, 1e-8, 1e-6)
    line = ShuffledRelease("b", None, 1000, 2.0, central).guarantee_line()
    printed = re.search(r"\(ε, δ\) = \(([0-9.]+),", line)
    assert printed is not None, line
    assert float(printed.group(1)) >= central.epsilon, line


def test_documented_central_epsilons_are_not_below_the_certified_ones() -> None:
    """Each ε of the n = 10⁶ row of docs/shuffle.md's table is at least amplified_epsilon's."""
    doc = (Path(__file__).parents[2] / "docs" / "shuffle.md").read_text(encoding="utf-8")
    row = next(line for line in doc.splitlines() if line.startswith("| 10⁶ |"))
    cells = [c.strip() for c in row.strip("|").split("|")][1:5]
    for eps0, cell in zip((1.0, 2.0, 4.0, 8.0), cells, strict=True):
        certified = amplified_epsilon(10**6, eps0, 1e-8).epsilon
        assert float(cell.split()[0]) >= certified, (eps0, cell, certified)


@pytest.mark.parametrize("extra", ["policy_version", "policy_digest", "unknown_field"])
def test_plaintext_with_any_extra_field_is_refused(extra: str) -> None:
    """A sealed Report holding a payload plus anything else is MALFORMED_SEALED."""
    from fedldp.client.mechanisms.base import OutputDomainError
    from fedldp.client.sealed import _suite, open_sealed
    from fedldp.v1 import collector_pb2

    key, _ = _keypair()
    inner = collector_pb2.Report()
    inner.category.index = 1
    if extra == "policy_version":
        inner.policy_version = 7
    elif extra == "policy_digest":
        inner.policy_digest = b"\x01" * 32
    plaintext = inner.SerializeToString()
    if extra == "unknown_field":
        plaintext += b"\xa8\x06\x2a"  # field 101, varint 42: a device could smuggle an id here
    ciphertext = _suite().encrypt(plaintext, key.public_key(), info=INFO)
    with pytest.raises(OutputDomainError):
        open_sealed(ciphertext, key, info=INFO)


def test_a_foreign_batch_file_in_out_is_not_taken_for_the_release(tmp_path: Path) -> None:
    """A stale file of the same batch key from another spool must not swallow this batch."""
    other = ShuffleSpool(tmp_path / "other.sqlite")
    other.add("w1", [b"\x01" * 60, b"\x02" * 60])
    (tmp_path / "out").mkdir()
    release(other, "w1", tmp_path / "out", min_batch=2)
    spool = ShuffleSpool(tmp_path / "spool.sqlite")
    ours = [bytes([i]) * 60 for i in range(10, 20)]
    spool.add("w1", ours)
    path = release(spool, "w1", tmp_path / "out", min_batch=2)
    assert sorted(read_batch(path)[1]) == sorted(ours)
