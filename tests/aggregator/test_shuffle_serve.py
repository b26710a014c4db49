"""`fedldp shuffler serve`: the shuffler daemon over a real SQLite ledger (docs/shuffle.md).

* a step pulls every window of the shuffle-model policy from the ledger (read-only: the
  ledger file's bytes do not change) and releases each closed window's batch at its signed
  minimum, with a manifest carrying the ledger's count; a closed window below the minimum
  (signed, or raised by the config) is held, logged and counted, never released partially;
  an open window is pulled, not released; a held batch is released once more reports came;
* kill -9 of a real daemon process at each stage of a step (after the pull, the rename, the
  record, the manifest; after the permutation: test_shuffle_roles.py): the next step loses
  nothing, releases nothing twice and leaves one batch file with its manifest;
* SIGTERM and SIGINT stop a real `fedldp shuffler serve` process cleanly (exit 0, "stopped");
* a bad shuffler.toml is refused before anything starts, one line naming every problem;
* the same step over a real PostgreSQL ledger (started by the suite).
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fedldp.aggregator.shuffle_analyzer import generate_analyzer_key
from fedldp.aggregator.shuffle_manifest import manifest_path, read_manifest
from fedldp.aggregator.shuffler import ShuffleSpool, batch_path, read_batch
from fedldp.aggregator.shuffler_config import load
from fedldp.aggregator.shuffler_service import Shuffler, ShufflerMetrics
from fedldp.client.mechanisms.base import CategoryOutput, SealedOutput
from fedldp.client.sealed import key_id, seal_info, seal_output
from fedldp.collector.ledger import open_ledger

from fedldp.cli import main
from fedldp.cli_common import open_cli_ledger
from tests.aggregator.conftest import NOW, WINDOW, submit_outputs
from tests.aggregator.test_attack_shuffle import _shuffle_policy_dirs

FEDLDP = str(Path(sys.executable).with_name("fedldp"))
WORKER = Path(__file__).with_name("shuffle_serve_kill_worker.py")
TODAY = NOW - NOW % WINDOW
# Windows after the policies' valid_from (NOW - 60), so a step at STEP verifies them.
OLD = TODAY + WINDOW
MID = OLD + WINDOW
OPEN = MID + WINDOW  # still open at STEP
STEP = OPEN + 3600
PAST = TODAY - 2 * WINDOW  # closed in real time (the real daemon's clock)
MIN_BATCH = 5


@dataclass(frozen=True)
class Setup:
    """A ledger with sealed reports in three windows and a shuffler.toml over it."""

    base: Path
    config: Path
    ledger: Path
    policy: Any
    public: bytes

    def batch(self, window: int) -> str:
        return f"{self.policy.policy_id}.v{self.policy.version}.{window}"

    def seal(self, n: int) -> list[SealedOutput]:
        info = seal_info(self.policy.policy_id, self.policy.version, self.policy.digest)
        return [
            SealedOutput(
                seal_output(CategoryOutput(i % 4), self.public, info=info).ciphertext,
                key_id(self.public),
            )
            for i in range(n)
        ]

    def store(self, window: int, n: int, url: str | None = None) -> list[bytes]:
        """Store n sealed reports in `window` (of the SQLite ledger, or of `url`)."""
        sealed = self.seal(n)
        with open_ledger(url or f"sqlite:///{self.ledger}") as ledger:
            submit_outputs(ledger, self.policy, sealed, now=window + 10, subjects=n)
        return [s.ciphertext for s in sealed]


def _write_config(base: Path, trust: Path, policies: Path, **extra: object) -> Path:
    lines = [
        "[shuffler]",
        f'ledger_url = "sqlite:///{base / "ledger.db"}"',
        f'policy_dir = "{policies}"',
        f'trust_dir = "{trust}"',
        'spool = "shuffler/spool.db"',
        'out_dir = "batches"',
        "grace_seconds = 60",
        "interval_seconds = 0.2",
        *(f"{k} = {json.dumps(v)}" for k, v in extra.items()),
    ]
    (base / "shuffler").mkdir(exist_ok=True)
    path = base / "shuffler.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def setup(tmp_path: Path, authority: Any) -> Setup:
    _, public = generate_analyzer_key(tmp_path / "analyzer")
    trust, policies, verified = _shuffle_policy_dirs(tmp_path, authority, public, MIN_BATCH)
    open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}").close()
    made = Setup(tmp_path, _write_config(tmp_path, trust, policies), tmp_path / "ledger.db",
                 verified, public)  # fmt: skip
    return made


def _daemon(config: Path, **kwargs: Any) -> Shuffler:
    return Shuffler(load(config), lambda url: open_cli_ledger(url, "read", scope="whole"), **kwargs)


def test_a_step_releases_closed_windows_at_their_minimum(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    """Closed with 8: released with its manifest; closed with 3: held (log, metric); open: not
    released; the ledger file is not written; a second step changes nothing."""
    full = setup.store(OLD, 8)
    setup.store(MID, 3)
    setup.store(OPEN, 9)
    before = hashlib.sha256(setup.ledger.read_bytes()).hexdigest()
    metrics = ShufflerMetrics()
    daemon = _daemon(setup.config, metrics=metrics)
    with caplog.at_level(logging.INFO, logger="fedldp.shuffler"):
        report = daemon.step(STEP)
    assert report.released == [setup.batch(OLD)]
    assert report.held == [setup.batch(MID)] and report.open == [setup.batch(OPEN)]
    assert hashlib.sha256(setup.ledger.read_bytes()).hexdigest() == before
    path = batch_path(setup.base / "batches", setup.batch(OLD))
    assert sorted(read_batch(path)[1]) == sorted(full)
    manifest = read_manifest(path)
    assert manifest is not None and (manifest.count, manifest.collector_count) == (8, 8)
    assert (manifest.policy_id, manifest.window_start) == (setup.policy.policy_id, OLD)
    # counts and the file's identity only: no report id, subject or time reaches the analyzer
    assert set(json.loads(manifest_path(path).read_text())) == {
        "schema", "batch", "count", "sha256", "collector_count", "policy_id",
        "policy_version", "window_start",
    }  # fmt: skip
    assert sorted(p.name for p in (setup.base / "batches").iterdir()) == [
        path.name,
        manifest_path(path).name,
    ]
    held = f"batch {setup.batch(MID)}: window closed with 3 ciphertexts, fewer than"
    assert any(held in r.getMessage() for r in caplog.records), caplog.text
    assert metrics.registry.get_sample_value("fedldp_shuffler_batches_held") == 1
    assert metrics.registry.get_sample_value("fedldp_shuffler_batches_released_total") == 1
    again = daemon.step(STEP)
    assert again.released == [] and again.held == [setup.batch(MID)]
    assert read_batch(path)[1] == read_batch(path)[1] and len(list(path.parent.iterdir())) == 2


def test_a_held_batch_is_released_when_enough_reports_came(setup: Setup) -> None:
    """3 of 5 held; 2 more stored in that window: the next step releases all 5 at once."""
    first = setup.store(MID, 3)
    daemon = _daemon(setup.config)
    assert daemon.step(STEP).held == [setup.batch(MID)]
    more = setup.store(MID, 2)
    assert daemon.step(STEP).released == [setup.batch(MID)]
    path = batch_path(setup.base / "batches", setup.batch(MID))
    assert sorted(read_batch(path)[1]) == sorted(first + more)


def test_the_operator_may_only_raise_the_signed_minimum(setup: Setup) -> None:
    """min_batch 10 holds a batch of 8 (signed 5); min_batch 2 does not release 4 (< 5)."""
    setup.store(OLD, 8)
    setup.store(MID, 4)
    daemon = _daemon(setup.config)
    raised = Shuffler(replace(daemon.config, min_batch=10), daemon.open_ledger)
    assert raised.step(STEP).held == [setup.batch(OLD), setup.batch(MID)]
    lowered = Shuffler(replace(daemon.config, min_batch=2), daemon.open_ledger)
    step = lowered.step(STEP)
    assert step.released == [setup.batch(OLD)] and step.held == [setup.batch(MID)]


def test_grace_keeps_a_just_closed_window_open(setup: Setup) -> None:
    """Window end + grace (60 s) is the earliest release; one second before, it is open."""
    setup.store(MID, 6)
    daemon = _daemon(setup.config)
    assert daemon.step(OPEN + 59).open == [setup.batch(MID)]
    assert daemon.step(OPEN + 60).released == [setup.batch(MID)]


@pytest.mark.parametrize("stage", ["pulled", "written", "recorded", "manifest"])
def test_kill_9_at_any_stage_loses_nothing_and_releases_once(setup: Setup, stage: str) -> None:
    """SIGKILL a real daemon process at `stage`; the next step leaves every ciphertext in one
    batch file, once, with its manifest, and a further step changes nothing."""
    items = setup.store(MID, 7)
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(setup.config), stage, str(STEP)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().decode().strip() == stage
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    out = setup.base / "batches"
    written = batch_path(out, setup.batch(MID))
    before = written.read_bytes() if stage in ("written", "recorded", "manifest") else None
    daemon = _daemon(setup.config)
    step = daemon.step(STEP)
    done_before = stage in ("recorded", "manifest")  # the kill came after the record
    assert step.released == ([] if done_before else [setup.batch(MID)])
    assert sorted(read_batch(written)[1]) == sorted(items)
    assert before is None or written.read_bytes() == before  # not re-permuted
    manifest = read_manifest(written)
    assert manifest is not None and (manifest.count, manifest.collector_count) == (7, 7)
    assert sorted(p.name for p in out.iterdir()) == [written.name, manifest_path(written).name]
    assert daemon.step(STEP).released == []
    assert ShuffleSpool(setup.base / "shuffler" / "spool.db").pending(setup.batch(MID)) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_the_real_daemon_cleanly(setup: Setup, sig: int) -> None:
    """`fedldp shuffler serve` releases, then SIGTERM/SIGINT: exit 0 and "stopped" logged."""
    setup.store(PAST, 6)
    proc = subprocess.Popen(
        [FEDLDP, "shuffler", "serve", "--config", str(setup.config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # blocks until the release is logged (or the process ends)
        seen.append(line)
        if "released 6 shuffled ciphertexts" in line:
            break
    proc.send_signal(sig)
    rest = proc.stderr.read()
    assert proc.wait(timeout=30) == 0, "".join(seen) + rest
    assert "INFO fedldp.shuffler stopped" in rest
    assert read_manifest(batch_path(setup.base / "batches", setup.batch(PAST)))


def test_a_bad_config_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """Every problem named on one line; exit 1; no spool or out folder created."""
    (tmp_path / "s").mkdir()
    path = tmp_path / "shuffler.toml"
    path.write_text(
        "[shuffler]\n"
        'policy_dir = "nope"\ntrust_dir = "s"\nspool = "s/spool.db"\nout_dir = "out"\n'
        'interval_seconds = 0\ngrace_seconds = "5"\nmin_batch = -1\ncolour = 1\n',
        encoding="utf-8",
    )
    result = CliRunner().invoke(main, ["shuffler", "serve", "--config", str(path)])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: shuffler config: "), result.output
    for problem in (
        "unknown setting 'colour'",
        "grace_seconds must be a whole number",
        "ledger_url is required",
        "policy_dir",
        "interval_seconds is a number above 0",
        "min_batch is 0",
    ):
        assert problem in lines[0], lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "s" / "spool.db").exists()


def test_the_metrics_endpoint_serves_the_held_gauge(setup: Setup) -> None:
    """metrics_listen serves the daemon's registry over HTTP (Prometheus text format)."""
    import urllib.request

    from fedldp.aggregator.shuffler_service import serve_metrics

    setup.store(MID, 2)
    metrics = ShufflerMetrics()
    _daemon(setup.config, metrics=metrics).step(STEP)
    server = serve_metrics(metrics, "127.0.0.1:0")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
    assert "fedldp_shuffler_batches_held 1.0" in text
    assert "fedldp_shuffler_ciphertexts_pulled_total 2.0" in text


def test_plain_policies_are_never_pulled(setup: Setup, make_policy: Any) -> None:
    """A plain policy's reports in the same ledger and policy folder stay in the ledger: no
    batch, no spool row, no file for it (only shuffle-model policies are served)."""
    from fedldp.authoring import write_envelope

    plain = make_policy("plaincolor")
    write_envelope(plain.envelope, load(setup.config).policy_dir / "plain.policy")
    with open_ledger(f"sqlite:///{setup.ledger}") as ledger:
        submit_outputs(ledger, plain, [CategoryOutput(i % 4) for i in range(30)], now=OLD + 5)
    setup.store(OLD, 6)
    step = _daemon(setup.config).step(STEP)
    assert step.released == [setup.batch(OLD)] and step.unverified == step.held == []
    spool = ShuffleSpool(setup.base / "shuffler" / "spool.db")
    assert spool.unreleased() == [] and spool.pending("plaincolor.v1." + str(OLD)) == 0
    assert not list((setup.base / "batches").glob("plaincolor*"))


def test_a_batch_whose_policy_no_longer_verifies_is_held_and_reported(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    """Pulled while its policy verified; the policy file then removed: after the window
    closes the batch is not released and the step reports it (log line, `unverified`)."""
    setup.store(OPEN, 6)
    metrics = ShufflerMetrics()
    daemon = _daemon(setup.config, metrics=metrics)
    assert daemon.step(STEP).open == [setup.batch(OPEN)]
    for envelope in daemon.config.policy_dir.glob("*.policy"):
        envelope.unlink()
    with caplog.at_level(logging.WARNING, logger="fedldp.shuffler"):
        step = daemon.step(OPEN + WINDOW + 3600)
    assert step.released == [] and step.unverified == [setup.batch(OPEN)]
    assert "verifies neither now nor at its window's start" in caplog.text
    assert metrics.registry.get_sample_value("fedldp_shuffler_batches_unverified") == 1
    assert ShuffleSpool(setup.base / "shuffler" / "spool.db").pending(setup.batch(OPEN)) == 6
    assert not list((setup.base / "batches").iterdir())


def test_an_unchanged_window_is_not_read_again(setup: Setup) -> None:
    """The ciphertexts of an open window are read again only after its report count changed
    (a real ledger behind a wrapper that counts `sealed_ciphertexts` calls)."""
    reads: list[int] = []

    class Counting:
        def __init__(self, ledger: Any) -> None:
            self.ledger = ledger

        def __getattr__(self, name: str) -> Any:
            return getattr(self.ledger, name)

        def sealed_ciphertexts(self, policy_id: str, window: int) -> Any:
            reads.append(window)
            return self.ledger.sealed_ciphertexts(policy_id, window)

    setup.store(OPEN, 3)
    daemon = Shuffler(
        load(setup.config), lambda url: Counting(open_cli_ledger(url, "read", scope="whole"))
    )
    daemon.step(STEP)
    daemon.step(STEP)
    assert reads == [OPEN]
    setup.store(OPEN, 1)
    daemon.step(STEP)
    assert reads == [OPEN, OPEN]
    assert daemon.spool.pending(setup.batch(OPEN)) == 4


def test_the_deploy_example_lists_every_setting_and_loads(tmp_path: Path) -> None:
    """deploy/examples/shuffler.toml names every setting, and loads once its folders exist
    (its paths moved under tmp_path)."""
    import re
    from dataclasses import fields

    from fedldp.aggregator.shuffler_config import ShufflerConfig

    example = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "shuffler.toml"
    text = example.read_text(encoding="utf-8")
    keys = set(re.findall(r"^([a-z_]+) = ", text, flags=re.MULTILINE))
    assert keys == {f.name for f in fields(ShufflerConfig)}
    for folder in ("etc/fedldp/policies", "etc/fedldp/trust", "var/lib/fedldp-shuffler"):
        (tmp_path / folder).mkdir(parents=True)
    moved = text.replace('"/etc/', f'"{tmp_path}/etc/').replace('"/var/', f'"{tmp_path}/var/')
    (tmp_path / "shuffler.toml").write_text(moved, encoding="utf-8")
    config = load(tmp_path / "shuffler.toml")
    assert (config.interval_seconds, config.grace_seconds, config.min_batch) == (60.0, 300, 0)


def test_a_step_over_a_postgresql_ledger(setup: Setup, postgresql_url: str) -> None:
    """The same pull and release over a real PostgreSQL ledger (read-only access)."""
    open_ledger(postgresql_url).close()
    items = setup.store(OLD, 6, postgresql_url)
    config = replace(load(setup.config), ledger_url=postgresql_url)
    daemon = Shuffler(config, lambda url: open_cli_ledger(url, "read", scope="whole"))
    assert daemon.step(STEP).released == [setup.batch(OLD)]
    path = batch_path(setup.base / "batches", setup.batch(OLD))
    assert sorted(read_batch(path)[1]) == sorted(items)
    manifest = read_manifest(path)
    assert manifest is not None and manifest.collector_count == 6
