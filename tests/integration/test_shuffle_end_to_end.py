"""The shuffle model end to end, over real gRPC: SDK devices -> collector -> shuffler -> analyzer.

Devices record under a shuffle-model policy (the SDK seals each payload to the analyzer's key on
its own), a real collector (SQLite ledger) charges and stores the ciphertexts, `fedldp shuffler
pull` copies the window's ciphertexts into the spool (twice: the second adds nothing), `release`
shuffles them, and the analyzer opens, checks and estimates.

What is checked: the estimate equals the one computed from the same randomized outputs
unshuffled (read, in submission order, from the devices' own outboxes with the analyzer's key);
the released batch file holds no subject, report id or coarse time (its header only the batch
key, which names the window, and the count); and its order is independent of the submission
order: the Spearman rank correlation between a ciphertext's position and its submission rank
is not significant at α = 1e-6 (a false alarm has probability 1e-6). The broken variant, a
pull in the ledger's row order released without a permutation, fails that test.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from fedldp.aggregator.shuffle_analyzer import analyze_batch
from fedldp.aggregator.shuffler import ShuffleSpool, read_batch, release, window_batch
from fedldp.client.outbox import Outbox
from fedldp.client.policy import verify_policy
from fedldp.client.sealed import open_sealed, seal_info
from fedldp.collector.server import RunningCollector
from fedldp.v1 import collector_pb2
from sdk_testkit import LABELS, Deployment, ledger_rows, running_deployment

from fedldp.cli import main

DEVICES = 16
ALPHA = 1e-6


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def _spearman_p(order: list[int]) -> float:
    """Two-sided p-value of Spearman's rank correlation of positions with `order`."""
    from scipy.stats import spearmanr

    return float(spearmanr(range(len(order)), order).pvalue)


def _record_all(deployment: Deployment, collector: RunningCollector, tmp_path: Path) -> list[bytes]:
    """Each device records one value and flushes, in turn; the sealed reports in
    submission order (as each device's outbox held them)."""
    sent: list[bytes] = []
    rng = random.Random(7)
    for d in range(DEVICES):
        with deployment.client(
            collector.address, tmp_path / f"dev{d}", subject=f"device-{d}"
        ) as client:
            client.record("browser.homepage", rng.choice(LABELS))
            (entry,) = Outbox(client._store).entries()
            sent.append(entry.report)
            assert client.flush(timeout=10).acknowledged == 1
    return sent


def test_devices_collector_shuffler_analyzer(deployment: Deployment, tmp_path: Path) -> None:
    """Estimates equal the unshuffled ones; no identifier reaches the analyzer; the order is
    independent of arrival, and an unshuffled release is caught by the same test."""
    private = X25519PrivateKey.generate()
    envelope = deployment.categorical(
        epsilon="1", analyzer_key=private.public_key().public_bytes_raw()
    )
    collector = deployment.start()
    sent = [
        collector_pb2.Report.FromString(b) for b in _record_all(deployment, collector, tmp_path)
    ]
    assert all(r.WhichOneof("payload") == "sealed" for r in sent)  # sealed by the SDK itself
    policy = verify_policy(
        envelope, deployment.authority.trust_store(now=deployment.now), now=deployment.now
    )
    info = seal_info(policy.policy_id, policy.version, policy.digest)
    window = policy.window_start(sent[0].coarse_time)
    assert collector.config is not None
    url = collector.config.ledger_url
    spool = tmp_path / "spool.db"
    args = ["shuffler", "pull", "--ledger", url, "--policy", "homepage"]
    args += ["--window", str(window), "--spool", str(spool)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert f"{DEVICES} added, {DEVICES} waiting" in first.output
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0, again.output
    assert f"0 added, {DEVICES} waiting" in again.output
    batch = window_batch("homepage", 1, window)
    (tmp_path / "out").mkdir()
    path = release(ShuffleSpool(spool), batch, tmp_path / "out", min_batch=2)

    # Estimates: the same as from the devices' outputs in submission order.
    result = analyze_batch(path, policy.mechanism, private, info=info)
    mech = policy.mechanism
    unshuffled = mech.new_statistic()
    for report in sent:
        mech.accumulate(unshuffled, open_sealed(report.sealed.ciphertext, private, info=info))
    assert result.accepted == DEVICES and result.invalid == {}
    shuffled_est, plain_est = mech.estimate(result.statistic), mech.estimate(unshuffled)
    assert shuffled_est.n == plain_est.n == DEVICES
    assert shuffled_est.values.tolist() == plain_est.values.tolist()  # exactly
    assert shuffled_est.variances.tolist() == plain_est.variances.tolist()

    # Nothing that names a device, a report or a time finer than the window.
    raw = path.read_bytes()
    for report in sent:
        assert report.report_id not in raw
    for rid, subject, _ in ledger_rows(collector):
        assert rid not in raw and subject.encode() not in raw
    got_batch, released = read_batch(path)
    assert got_batch == batch  # names the window only
    header = raw.split(b"\n")[1]
    assert json.loads(header) == {"batch": batch, "count": DEVICES}

    # Order: independent of submission (not significant at ALPHA).
    rank = {r.sealed.ciphertext: i for i, r in enumerate(sent)}
    assert sorted(rank[c] for c in released) == list(range(DEVICES))
    assert _spearman_p([rank[c] for c in released]) > ALPHA

    # The broken variant: a pull in the ledger's row (arrival) order, released unpermuted.
    broken = ShuffleSpool(tmp_path / "broken.db")
    broken.add_once(batch, _arrival_order(collector))
    (tmp_path / "broken").mkdir()
    unpermuted = release(broken, batch, tmp_path / "broken", min_batch=2, rng=_Identity())
    _, kept = read_batch(unpermuted)
    assert _spearman_p([rank[c] for c in kept]) <= ALPHA


class _Identity(random.Random):
    """A broken shuffler's generator: its shuffle leaves the order as it is."""

    def shuffle(self, x: list[object]) -> None:  # type: ignore[override]
        """Do nothing."""


def _arrival_order(collector: RunningCollector) -> list[bytes]:
    """The stored ciphertexts in the ledger's insertion (rowid) order."""
    import sqlalchemy as sa
    from fedldp.collector.wire import output_from_json

    def tx(conn: sa.Connection) -> list[bytes]:
        rows = conn.execute(sa.text("SELECT payload FROM reports ORDER BY rowid"))
        return [output_from_json(text).ciphertext for (text,) in rows]  # type: ignore[union-attr]

    return collector.ledger.transaction(tx, write=False)
