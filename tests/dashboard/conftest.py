"""Fixtures for the dashboard tests: real ledgers fed by simulated devices, a served dashboard.

* `demo_run`: the session's shared `fedldp demo` (`plain_demo`, tests/conftest.py: a
  real collector process, real SDK devices over gRPC, the demo's signed policy).
* `rich`: a ledger written by the collector's own `Ledger.submit` over six past
  daily windows (a real collector serves only the current window), with a
  categorical and a numeric policy, one window below the release gate, subjects at
  their cap, and central reservations (open, settled, cancelled).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from demo_testkit import DemoRun
from fedldp.aggregator.dashboard.app import DashboardServer
from fedldp.authoring import Authority, write_envelope, write_public_key
from fedldp.client.policy import VerifiedPolicy, verify_policy
from fedldp.collector.ledger import ACCEPTED, CheckedReport, open_ledger
from fedldp.collector.wire import content_digest

from fedldp.cli_dashboard import load_dashboard

NOW = int(time.time())
DAY = 86400
TODAY = NOW - NOW % DAY
#: Markers that every subject identifier in the fixtures carries (never on a page).
SUBJECT_MARKERS = ("device-", "analyst-alice", "analyst-bob")
COLOR_LABELS = ("red", "green", "blue", "cyan", "black", "white")
#: Reports per window of the categorical policy, oldest first (index 3: below the gate).
COLOR_COUNTS = (300, 320, 340, 40, 360, 380)
COLOR_MIN = 60


@dataclass(frozen=True)
class Setup:
    """A ledger, its policy and trust folders, and the ids used to fill it."""

    base: Path
    ledger_path: Path
    policy_dir: Path
    trust_dir: Path
    audience: str
    policy_ids: tuple[str, ...]

    @property
    def ledger_url(self) -> str:
        return f"sqlite:///{self.ledger_path}"


def _sign(authority: Authority, policy: object) -> VerifiedPolicy:
    env = authority.sign(policy)  # type: ignore[arg-type]
    return verify_policy(env, authority.trust_store(now=NOW), now=NOW)


def _submit(
    ledger: object,
    policy: VerifiedPolicy,
    values: list[object],
    *,
    at: int,
    subjects: int,
    rng: random.Random,
) -> None:
    batches: dict[str, list[CheckedReport]] = {}
    coarse = at - at % 3600
    for i, value in enumerate(values):
        out = policy.mechanism.perturb(value, rng=rng)
        digest = content_digest(
            policy_id=policy.policy_id,
            policy_version=policy.version,
            policy_digest=policy.digest,
            coarse_time=coarse,
            output=out,
        )
        batches.setdefault(f"device-{i % subjects:05d}", []).append(
            CheckedReport(rng.randbytes(16), policy, out, digest, coarse)
        )
    for subject, reports in batches.items():
        outcomes = ledger.submit(subject, reports, now=at)  # type: ignore[attr-defined]
        assert all(o == ACCEPTED for o in outcomes)


@pytest.fixture(scope="session")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    base = tmp_path_factory.mktemp("rich")
    authority = Authority.generate(now=NOW - 40 * DAY)
    common = {"window_seconds": DAY, "now": NOW - 20 * DAY, "lifetime_seconds": 60 * DAY}
    color = _sign(
        authority,
        authority.categorical_policy(
            policy_id="app.color",
            metric="app.color",
            labels=list(COLOR_LABELS),
            epsilon="1",
            epsilon_cap="2",
            min_reports=COLOR_MIN,
            **common,  # type: ignore[arg-type]
        ),
    )
    latency = _sign(
        authority,
        authority.numeric_policy(
            policy_id="app.latency",
            metric="app.latency",
            lo="0",
            hi="10",
            epsilon="1",
            epsilon_cap="1",
            min_reports=30,
            **common,  # type: ignore[arg-type]
        ),
    )
    trust_dir, policy_dir = base / "trust", base / "policies"
    (trust_dir / "pinned").mkdir(parents=True)
    policy_dir.mkdir()
    write_public_key(authority.root_public_keys[0], trust_dir / "pinned" / "root0.pem")
    write_envelope(authority.root_envelope, trust_dir / "1.root")
    write_envelope(color.envelope, policy_dir / "color.policy")
    write_envelope(latency.envelope, policy_dir / "latency.policy")
    ledger_path = base / "ledger.db"
    ledger = open_ledger(f"sqlite:///{ledger_path}", shard="collector-a")
    rng = random.Random(20261201)
    weights = [0.35, 0.25, 0.15, 0.1, 0.1, 0.05]
    try:
        for back, count in zip(range(5, -1, -1), COLOR_COUNTS, strict=True):
            at = TODAY - back * DAY + 3600
            values: list[object] = rng.choices(range(len(COLOR_LABELS)), weights, k=count)
            # Two reports per subject: each spends its whole cap (2 × ε = 1).
            _submit(ledger, color, values, at=at, subjects=count // 2, rng=rng)
            means: list[object] = [rng.uniform(2.0, 6.0) for _ in range(200)]
            _submit(ledger, latency, means, at=at, subjects=200, rng=rng)
        ledger.set_central_cap(
            "analyst-alice",
            "quarterly-kpis",
            epsilon_cap=Decimal("10"),
            delta_cap=Decimal("0.00001"),
            now=NOW,
        )
        ledger.set_central_cap(
            "analyst-bob",
            "quarterly-kpis",
            epsilon_cap=Decimal("10"),
            delta_cap=Decimal("0.00001"),
            now=NOW,
        )
        r1 = ledger.reserve(
            subject="analyst-alice",
            purpose="quarterly-kpis",
            epsilon=Decimal("1.5"),
            delta=Decimal("0"),
            idempotency_key="k1",
            now=NOW,
        )
        ledger.reserve(
            subject="analyst-bob",
            purpose="quarterly-kpis",
            epsilon=Decimal("0.25"),
            delta=Decimal("0"),
            idempotency_key="k2",
            now=NOW,
        )
        r3 = ledger.reserve(
            subject="analyst-alice",
            purpose="quarterly-kpis",
            epsilon=Decimal("0.5"),
            delta=Decimal("0"),
            idempotency_key="k3",
            now=NOW,
        )
        ledger.settle(r1.id, epsilon_spent=Decimal("1.25"), delta_spent=Decimal("0"), now=NOW)
        ledger.cancel(r3.id, now=NOW)
    finally:
        ledger.close()
    return Setup(base, ledger_path, policy_dir, trust_dir, "default", ("app.color", "app.latency"))


@pytest.fixture(scope="session")
def demo_run(plain_demo: DemoRun) -> Setup:
    """The session's shared `fedldp demo` (demo_testkit: 200 simulated devices, a real
    collector process, real SDK devices), read-only."""
    assert plain_demo.returncode == 0, plain_demo.stderr[-3000:]
    out = plain_demo.out
    return Setup(
        out, out / "ledger.db", out / "policies", out / "trust", "demo", ("demo.browser-homepage",)
    )


def serve(setup: Setup, token: str | None = None, host: str = "127.0.0.1") -> DashboardServer:
    """A started dashboard over `setup` (stop it when done)."""
    dash = load_dashboard(setup.ledger_url, setup.policy_dir, setup.trust_dir, setup.audience)
    return DashboardServer(dash, host=host, port=0, token=token).start()


@pytest.fixture(scope="session")
def rich_server(rich: Setup) -> Iterator[DashboardServer]:
    server = serve(rich)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def demo_server(demo_run: Setup) -> Iterator[DashboardServer]:
    server = serve(demo_run)
    yield server
    server.stop()
