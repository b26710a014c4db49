"""The whole pipeline, real at every step: signed policy → SDK → gRPC → ledger → estimates.

The estimates must cover the truth. The intervals are Bonferroni-simultaneous
over the k labels at level 1 - ALPHA, so under a correct pipeline the test fails
with probability at most ALPHA = 1e-6 whatever the seed; the seed is fixed too,
so a run is reproducible. A pipeline that loses, duplicates or mis-debiases
reports moves the estimates by many standard errors and fails.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import IO

import pytest
from collector_testkit import memory_folder
from demo_testkit import PLAIN_DEMO_DEVICES, DemoRun, port_is_closed
from fedldp.aggregator.estimation import FrequencyReport
from fedldp.aggregator.reports import report_from_ledgers
from fedldp.authoring import Authority
from fedldp.client.sdk import BudgetGuardError, Client, TrustRoot
from fedldp.client.transport import Credentials
from fedldp.collector.auth import TokenAuthority
from fedldp.collector.config import CollectorConfig
from fedldp.collector.policies import PolicyRegistry
from fedldp.collector.server import RunningCollector, start_collector

ALPHA = 1e-6
LABELS = ("news", "mail", "shop", "video", "maps")
TRUE_WEIGHTS = (0.45, 0.25, 0.15, 0.10, 0.05)
DEVICES = 400
AUDIENCE = "pipeline-test"


class Pipeline:
    """An authority, a signed GRR policy and a collector on an OS-chosen port."""

    def __init__(self, tmp: Path) -> None:
        self.now = int(time.time())
        self.authority = Authority.generate(now=self.now - 60)
        policy = self.authority.categorical_policy(
            policy_id="homepage",
            metric="browser.homepage",
            labels=list(LABELS),
            epsilon="2",
            epsilon_cap="2",
            window_seconds=86_400,
            now=self.now - 60,
            min_reports=DEVICES // 2,
            audience=(AUDIENCE,),
        )
        self.envelope = self.authority.sign(policy)
        self.secret = secrets.token_bytes(32)
        registry = PolicyRegistry.from_envelopes(
            [self.envelope],
            self.authority.trust_store(now=self.now),
            now=self.now,
            audience=AUDIENCE,
        )
        config = CollectorConfig(
            listen="127.0.0.1:0",
            ledger_url=f"sqlite:///{tmp / 'ledger.db'}",
            token_secret=self.secret.hex(),
            audience=AUDIENCE,
            log_level="WARNING",
        )
        self.collector: RunningCollector = start_collector(config, registry=registry)
        self.tokens = TokenAuthority(self.secret)

    def client(self, state_dir: Path, subject: str, rng: random.Random) -> Client:
        return Client(
            self.collector.address,
            trust_root=TrustRoot(self.authority.root_envelope, self.authority.root_public_keys),
            state_dir=state_dir,
            credentials=Credentials.insecure_bearer(
                self.tokens.mint(subject, expires_at=self.now + 3600)
            ),
            audience=AUDIENCE,
            rng=rng,
        )


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """A folder for the ledger and the devices' state: on tmpfs when there is one (as the
    demo keeps its devices' state), where SQLite's fsyncs cost nothing; durability is not
    what this module tests (tests/collector/test_faults.py, tests/integration/test_sdk_crash.py)."""
    shm = memory_folder()
    if shm is None:
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="fedldp-pipeline-", dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pipeline(state: Path) -> Iterator[Pipeline]:
    running = Pipeline(state)
    try:
        yield running
    finally:
        running.collector.stop(grace=1.0)


def test_estimates_cover_the_truth_over_real_grpc(pipeline: Pipeline, state: Path) -> None:
    population = random.Random(20261130)
    values = population.choices(range(len(LABELS)), weights=TRUE_WEIGHTS, k=DEVICES)
    for device, value in enumerate(values):
        with pipeline.client(
            state / f"device-{device}", f"device-{device}", random.Random(device)
        ) as client:
            client.record("browser.homepage", LABELS[value])
            # The cap is one report per window: the device's own guard refuses a second.
            with pytest.raises(BudgetGuardError):
                client.record("browser.homepage", LABELS[value])
            result = client.flush(timeout=30)
            assert (result.acknowledged, result.refused, result.pending) == (1, 0, 0)

    policy = next(iter(pipeline.collector.registry.policies.values()))
    report = report_from_ledgers(
        [("collector", pipeline.collector.ledger)],
        policy,
        window_start=policy.window_start(int(time.time())),
        confidence=1 - ALPHA,
        simultaneous=True,
    )
    assert isinstance(report, FrequencyReport) and report.n == DEVICES
    counts = Counter(values)
    for index, label in enumerate(LABELS):
        row = report.by_label(label)
        truth = counts[index] / DEVICES
        assert row.ci_low <= truth <= row.ci_high, (label, truth, row)
    # The intervals are informative, not vacuous: the head is clearly above zero.
    assert report.by_label("news").ci_low > 0.2


def test_a_wiped_device_is_refused_by_the_collector_ledger(pipeline: Pipeline, state: Path) -> None:
    with pipeline.client(state / "first", "device-x", random.Random(1)) as client:
        client.record("browser.homepage", "news")
        assert client.flush(timeout=30).acknowledged == 1
    # Same subject, fresh state: the device guard has forgotten; the ledger has not.
    with pipeline.client(state / "reinstalled", "device-x", random.Random(2)) as client:
        client.record("browser.homepage", "mail")
        result = client.flush(timeout=30)
        assert (result.acknowledged, result.refused) == (0, 1)
        assert client.counters()["refused_outcome_budget_exhausted"] == 1
    ledger = pipeline.collector.ledger
    policy = next(iter(pipeline.collector.registry.policies.values()))
    spent = ledger.spent("device-x", "homepage", policy.window_start(int(time.time())))
    assert spent == Decimal("2")


def test_demo_command_runs_and_stops_its_collector(plain_demo: DemoRun) -> None:
    """The session's shared `fedldp demo` (demo_testkit: 200 devices, seed 7)."""
    assert plain_demo.returncode == 0, plain_demo.stderr[-3000:]
    devices = PLAIN_DEMO_DEVICES
    assert f"reports accepted:                    {devices}" in plain_demo.stdout
    # round(2%) of the devices reinstall; every tenth tries a second report on device.
    assert f"refused by the collector for budget: {round(devices * 0.02)}" in plain_demo.stdout
    assert f"refused on device by budget guard:   {devices // 10}" in plain_demo.stdout
    html = (plain_demo.out / "report.html").read_text(encoding="utf-8")
    assert "<svg" in html and "Privacy budget" in html and "window (UTC)" in html
    assert plain_demo.port_closed_at_exit


def _progress(stream: IO[bytes], pattern: re.Pattern[bytes], deadline: float) -> bool:
    """Read `stream` (unbuffered) until `pattern` matches what was read; False at its end
    or past `deadline` (time.monotonic())."""
    seen = b""
    while time.monotonic() < deadline:
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:
            return False
        seen = seen[-4096:] + chunk
        if pattern.search(seen):
            return True
    return False


def test_demo_stops_its_collector_on_ctrl_c(tmp_path: Path) -> None:
    """Ctrl-C while devices are being simulated: the demo exits non-zero, and its collector
    (a supervisor and its processes, one per core by default) is stopped: the port, which
    every collector process binds, accepts nothing afterwards."""
    out = tmp_path / "demo"
    process = subprocess.Popen(
        [sys.executable, "-m", "fedldp.cli", "demo", "--devices", "100000",
         "--processes", "1", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stderr is not None
        for line in process.stdout:
            if line.startswith(b"collector listening"):
                break
        port = int((out / "collector.port").read_text())
        assert not port_is_closed(port)
        # Devices are being simulated: the progress bar has counted a finished chunk.
        finished = re.compile(rb"[1-9][0-9]*/100000")
        assert _progress(process.stderr, finished, time.monotonic() + 120)
        process.send_signal(signal.SIGINT)  # as Ctrl-C
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0
    assert port_is_closed(port)


def test_devices_sharing_a_channel_keep_their_own_identity(pipeline: Pipeline, state: Path) -> None:
    """A fleet simulation shares one connection; subjects, state and budgets stay apart."""
    import grpc

    channel = grpc.insecure_channel(pipeline.collector.address)
    try:
        for subject in ("device-a", "device-b"):
            client = Client(
                "unused:0",
                trust_root=TrustRoot(
                    pipeline.authority.root_envelope, pipeline.authority.root_public_keys
                ),
                state_dir=state / subject,
                credentials=Credentials.insecure_bearer(
                    pipeline.tokens.mint(subject, expires_at=pipeline.now + 3600)
                ),
                audience=AUDIENCE,
                channel=channel,
            )
            with client:
                client.record("browser.homepage", "news")
                assert client.flush(timeout=30).acknowledged == 1
        # Closing the clients left the shared channel open.
        grpc.channel_ready_future(channel).result(timeout=5)
    finally:
        channel.close()
    policy = next(iter(pipeline.collector.registry.policies.values()))
    window = policy.window_start(int(time.time()))
    for subject in ("device-a", "device-b"):
        assert pipeline.collector.ledger.spent(subject, "homepage", window) == Decimal("2")
