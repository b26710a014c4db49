"""`fedldp shuffler serve`: the shuffler as a long-running process (docs/shuffle.md).

Each step (every `interval_seconds`), for every shuffle-model policy of the trusted policy
folder (and every batch the spool still holds unreleased):

1. it reads the collector's ledger **read-only** (`report_windows`, `report_count`,
   `sealed_ciphertexts`) and pulls every window's new ciphertexts into its own spool
   (`pull_window`: ciphertexts only, idempotent, the ledger's count recorded in the same
   transaction; a window whose count did not change since the last pull is not re-read);
2. for each batch whose window has closed (window end + `grace_seconds` ≤ now) it releases
   the batch (`release`: claim, CSPRNG permutation, durable write, record; crash-safe and
   idempotent) when it holds at least the minimum: the policy's signed `min_batch`, raised
   (never lowered) by the config's `min_batch`; then writes the manifest beside the batch
   file (`write_manifest`, the collector's count for the analyzer).

A batch below its minimum after its window closed is never released partially: it stays in
the spool, is logged once per count ("held"), and counted in the metric
`fedldp_shuffler_batches_held`. A stop request (SIGTERM, SIGINT: `request_stop`) takes effect
between two batches, never inside a release; a kill -9 anywhere loses nothing and releases
nothing twice, because every step is one of the crash-safe primitives above, each safe to
redo. Log lines and metrics carry batch keys and counts only: no ciphertext, subject or time
of a report.

Time and the stage hook are arguments (`now`, `on_stage`), so tests drive a step at a chosen
clock and crash tests stop the process at a chosen stage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fedldp.aggregator.shuffle_manifest import manifest_path, parse_window_batch, write_manifest
from fedldp.aggregator.shuffler import (
    BatchTooSmallError,
    ShuffleSpool,
    batch_path,
    pull_window,
    release,
)
from fedldp.aggregator.shuffler_config import ShufflerConfig

LOG = logging.getLogger("fedldp.shuffler")

#: Opens the collector's ledger read-only (production: fedldp.cli_common.open_cli_ledger).
LedgerOpener = Callable[[str], Any]


class ShufflerMetrics:
    """The daemon's Prometheus metrics (its own registry; labels: none but the outcome)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        r = self.registry
        self.released = Counter(
            "fedldp_shuffler_batches_released", "Batches released to out_dir", registry=r
        )
        self.pulled = Counter(
            "fedldp_shuffler_ciphertexts_pulled",
            "Ciphertexts added to the spool from the ledger",
            registry=r,
        )
        self.held = Gauge(
            "fedldp_shuffler_batches_held",
            "Batches whose window closed with fewer ciphertexts than their minimum (not released)",
            registry=r,
        )
        self.unverified = Gauge(
            "fedldp_shuffler_batches_unverified",
            "Batches whose policy version verifies neither now nor at its window's start "
            "(not released)",
            registry=r,
        )
        self.errors = Counter(
            "fedldp_shuffler_step_errors", "Steps that failed (ledger or policy folder)", registry=r
        )
        self.last_step = Gauge(
            "fedldp_shuffler_last_step_timestamp_seconds", "When the last step ended", registry=r
        )


@dataclass
class StepReport:
    """What one step did: batch keys released, held below their minimum, still open."""

    released: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    open: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)


class Shuffler:
    """The shuffler daemon's state: its config, spool, metrics and stop flag."""

    def __init__(
        self,
        config: ShufflerConfig,
        open_ledger: LedgerOpener,
        *,
        metrics: ShufflerMetrics | None = None,
        on_stage: Callable[[str], None] | None = None,
    ) -> None:
        """Open (creating if absent) the spool and out_dir; nothing is read yet."""
        self.config = config
        self.open_ledger = open_ledger
        self.metrics = metrics
        self.on_stage = on_stage or (lambda _name: None)
        self.stop = threading.Event()
        config.out_dir.mkdir(exist_ok=True)
        self.spool = ShuffleSpool(config.spool)
        self._held_logged: dict[str, int] = {}

    def request_stop(self) -> None:
        """Stop after the batch in hand (signal handlers call this)."""
        self.stop.set()

    def serve(self, clock: Callable[[], float] = time.time) -> None:
        """Run steps every interval until `request_stop`; a failing step is logged and
        counted, and the next one runs at the next interval."""
        while not self.stop.is_set():
            try:
                self.step(int(clock()))
            except Exception as exc:  # the ledger or the policy folder failed: retry later
                LOG.error("step failed: %s: %s", type(exc).__name__, exc)
                if self.metrics is not None:
                    self.metrics.errors.inc()
            if self.metrics is not None:
                self.metrics.last_step.set(clock())
            self.stop.wait(self.config.interval_seconds)
        LOG.info("stopped")

    def step(self, now: int) -> StepReport:
        """One pull-and-release pass at time `now` (see the module docstring)."""
        report = StepReport()
        policies = self._shuffle_policies(now)
        ids = {p.policy_id for p in policies.values()}
        pending = (parse_window_batch(b) for b in self.spool.unreleased())
        ids |= {key[0] for key in pending if key is not None}
        with self._ledger() as ledger:
            for policy_id in sorted(ids):
                for version, window in ledger.report_windows(policy_id):
                    if self.stop.is_set():
                        return report
                    self._batch(ledger, policies, policy_id, version, window, now, report)
        if self.metrics is not None:
            self.metrics.held.set(len(report.held))
            self.metrics.unverified.set(len(report.unverified))
        return report

    @contextmanager
    def _ledger(self) -> Iterator[Any]:
        """The collector's ledger, read-only, for one step (closed after it)."""
        ledger = self.open_ledger(self.config.ledger_url)
        try:
            yield ledger
        finally:
            ledger.close()

    def _shuffle_policies(self, now: int) -> dict[tuple[str, int], Any]:
        """(policy id, version) -> the shuffle-model policies of the folder that verify now."""
        from fedldp.client.policy.files import load_policy_folder, load_trust_folder

        trust = load_trust_folder(self.config.trust_dir, now=now)
        accepted, _refused = load_policy_folder(
            self.config.policy_dir, trust, now=now, audience=self.config.audience
        )
        return {(p.policy_id, p.version): p for p in accepted if p.analyzer_public_key is not None}

    def _policy_at(
        self, policies: dict[tuple[str, int], Any], policy_id: str, version: int, at: int
    ) -> Any:
        """The shuffle-model policy (id, version): as verified now, else as verified at
        `at` (its window's start: a version expired since); None if neither (a retired
        version too: the policy folder's `retired` list is honoured at any time)."""
        from fedldp.client.policy import PolicyError

        found = policies.get((policy_id, version))
        if found is not None:
            return found
        try:
            return self._shuffle_policies(at).get((policy_id, version))
        except PolicyError:  # the trust folder did not verify then: the batch is reported
            return None

    def _batch(
        self,
        ledger: Any,
        policies: dict[tuple[str, int], Any],
        policy_id: str,
        version: int,
        window: int,
        now: int,
        report: StepReport,
    ) -> None:
        """Pull one (policy version, window) batch and release it once its window closed."""
        from fedldp.aggregator.shuffler import window_batch

        batch = window_batch(policy_id, version, window)
        done = self.spool.released(batch)
        if done is not None:
            self._ensure_manifest(batch)
            return
        policy = self._policy_at(policies, policy_id, version, window)
        if policy is None:
            report.unverified.append(batch)
            self._log_held(
                batch,
                -1,
                f"policy {policy_id} v{version} verifies neither now nor at its window's start "
                "(check policy_dir, trust_dir, audience): not pulled, not released",
            )
            return
        self._pull(ledger, batch, policy_id, version, window)
        self.on_stage("pulled")
        if now < window + int(policy.window_seconds) + self.config.grace_seconds:
            report.open.append(batch)
            return
        self._release(batch, policy, report)

    def _pull(self, ledger: Any, batch: str, policy_id: str, version: int, window: int) -> None:
        """Add the window's new ciphertexts to the spool. The ciphertexts are read only when
        the ledger's count of the batch's reports (an index-only COUNT) differs from the
        count the spool recorded at its last pull: an unchanged window is not re-read."""
        if self.spool.ledger_count(batch) == ledger.report_count(policy_id, version, window):
            return
        ciphertexts = ledger.sealed_ciphertexts(policy_id, window).get(version, [])
        (pulled,) = pull_window({version: ciphertexts}, self.spool, policy_id, window)
        if pulled.added and self.metrics is not None:
            self.metrics.pulled.inc(pulled.added)
        if pulled.added:
            LOG.info(
                "batch %s: %d added, %d waiting (%d stored in the ledger)",
                batch,
                pulled.added,
                self.spool.pending(batch),
                pulled.stored,
            )

    def _release(self, batch: str, policy: Any, report: StepReport) -> None:
        """Release a closed window's batch at its minimum, or hold it (logged, counted)."""
        signed = max(1, int(policy.message.shuffle.min_batch))
        floor = max(signed, self.config.min_batch)
        try:
            path = release(
                self.spool, batch, self.config.out_dir, min_batch=floor, on_stage=self.on_stage
            )
        except BatchTooSmallError:
            report.held.append(batch)
            waiting = self.spool.pending(batch)
            self._log_held(
                batch,
                waiting,
                f"window closed with {waiting} ciphertexts, fewer than the minimum {floor}: "
                "not released (held in the spool)",
            )
            return
        write_manifest(self.spool, batch, path)
        self.on_stage("manifest")
        released = self.spool.released(batch)
        report.released.append(batch)
        if self.metrics is not None:
            self.metrics.released.inc()
        LOG.info(
            "batch %s: released %d shuffled ciphertexts to %s (collector count %s)",
            batch,
            released[0] if released else 0,
            path,
            self.spool.ledger_count(batch),
        )
        self._held_logged.pop(batch, None)

    def _ensure_manifest(self, batch: str) -> None:
        """A released batch whose manifest is missing (killed between the release and the
        manifest): write it now, from the spool's records (same bytes as before)."""
        intent = self.spool._intent(batch)  # where the release put it (maybe another out_dir)
        path = intent[0] if intent is not None else batch_path(self.config.out_dir, batch)
        if path.exists() and not manifest_path(path).exists():
            write_manifest(self.spool, batch, path)
            LOG.info("batch %s: manifest written after a restart", batch)

    def _log_held(self, batch: str, count: int, why: str) -> None:
        """Log a batch not released, once per count (not at every step)."""
        if self._held_logged.get(batch) == count:
            return
        self._held_logged[batch] = count
        LOG.warning("batch %s: %s", batch, why)


def serve_metrics(metrics: ShufflerMetrics, listen: str) -> Any:
    """Serve `metrics` over HTTP on HOST:PORT (host defaults to 127.0.0.1); the server."""
    from fedldp.collector.config import split_address
    from prometheus_client import start_http_server

    host, port = split_address(listen)
    server, _thread = start_http_server(port, addr=host or "127.0.0.1", registry=metrics.registry)
    return server
