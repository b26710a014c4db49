"""Fixtures for the aggregator tests: signed policies and real SQLite ledger files."""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fedldp.authoring import Authority
from fedldp.client.mechanisms.base import Output
from fedldp.client.policy import VerifiedPolicy, verify_policy
from fedldp.collector.ledger import Ledger, open_ledger
from fedldp.collector.ledger.store import CheckedReport
from fedldp.collector.wire import content_digest
from fedldp.v1 import collector_pb2

NOW = int(time.time())
WINDOW = 86400


@pytest.fixture(scope="session")
def authority() -> Authority:
    return Authority.generate(now=NOW - 3600)


PolicyFactory = Callable[..., VerifiedPolicy]


@pytest.fixture(scope="session")
def make_policy(authority: Authority) -> PolicyFactory:
    """Sign and verify a categorical (labels=...) or numeric (lo=..., hi=...) policy."""

    def make(
        policy_id: str = "color",
        *,
        labels: Sequence[str] | None = ("red", "green", "blue", "other"),
        epsilon: str = "1",
        epsilon_cap: str = "1000000",
        mechanism: str = "grr",
        min_reports: int = 1,
        version: int = 1,
        lo: str | None = None,
        hi: str | None = None,
        params: dict[str, str] | None = None,
    ) -> VerifiedPolicy:
        common: dict[str, Any] = {
            "policy_id": policy_id,
            "metric": f"metric.{policy_id}",
            "epsilon": epsilon,
            "epsilon_cap": epsilon_cap,
            "window_seconds": WINDOW,
            "now": NOW - 60,
            "mechanism": mechanism,
            "version": version,
            "min_reports": min_reports,
        }
        if lo is not None and hi is not None:
            policy = authority.numeric_policy(lo=lo, hi=hi, **common)
        else:
            assert labels is not None
            policy = authority.categorical_policy(labels=list(labels), params=params, **common)
        return verify_policy(authority.sign(policy), authority.trust_store(now=NOW), now=NOW)

    return make


@pytest.fixture
def ledger_factory(tmp_path: Path) -> Iterator[Callable[..., Ledger]]:
    """Open real SQLite ledger files under tmp_path (closed at teardown)."""
    opened: list[Ledger] = []

    def make(name: str = "ledger", *, shard: str | None = None) -> Ledger:
        ledger = open_ledger(f"sqlite:///{tmp_path / (name + '.db')}", shard=shard)
        opened.append(ledger)
        return ledger

    yield make
    for ledger in opened:
        ledger.close()


@pytest.fixture(scope="session")
def now() -> int:
    """The tests' clock: policies are valid from an hour before it."""
    return NOW


@pytest.fixture(scope="session")
def submit() -> Callable[..., None]:
    """`submit(ledger, policy, outputs, *, now=NOW, subjects=50)`: store accepted reports."""
    return submit_outputs


def submit_outputs(
    ledger: Ledger,
    policy: VerifiedPolicy,
    outputs: Sequence[Output],
    *,
    now: int = NOW,
    subjects: int = 50,
    rng: random.Random | None = None,
) -> None:
    """Store `outputs` as accepted reports from `subjects` distinct users."""
    r = rng or random.Random(0)
    batches: dict[str, list[CheckedReport]] = {}
    coarse = now - now % 3600
    for i, out in enumerate(outputs):
        digest = content_digest(
            policy_id=policy.policy_id,
            policy_version=policy.version,
            policy_digest=policy.digest,
            coarse_time=coarse,
            output=out,
        )
        rid = r.randbytes(16) if rng is not None else secrets.token_bytes(16)
        batches.setdefault(f"user{i % subjects}", []).append(
            CheckedReport(rid, policy, out, digest, coarse)
        )
    for subject, reports in batches.items():
        outcomes = ledger.submit(subject, reports, now=now)
        assert all(o == collector_pb2.OUTCOME_ACCEPTED for o in outcomes)
