"""`fedldp shuffler`: the shuffle model's roles (docs/shuffle.md).

    fedldp shuffler keygen --out DIR                      # the analyzer's key pair
    fedldp shuffler pull --config collector.toml --policy ID --window W --spool S
    fedldp shuffler release --spool S --batch B --out DIR (--min-batch N | --policies P --trust T)
    fedldp shuffler analyze BATCH_FILE --analyzer-key K --policy ID --policies P --trust T
    fedldp shuffler serve --config shuffler.toml          # the shuffler as a daemon

`release` is the shuffler (its own process; idempotent, safe to rerun after a crash);
`analyze` is the analyzer, the only role that holds the private key: it prints the estimates,
the invalid payloads it dropped, and both guarantees (local ε0 and the amplified central
(ε, δ)). numpy and scipy load only inside `analyze`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from fedldp.cli_common import config_option, ledger_option, trust_option

F = TypeVar("F", bound=Callable[..., Any])


@click.group("shuffler")
def shuffler() -> None:
    """Shuffle model: analyzer keys, the shuffler's release, the analyzer's estimate."""


@shuffler.command("keygen")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="folder for analyzer.key and analyzer.pub",
)
def keygen(out_dir: str) -> None:
    """Write the analyzer's X25519 key: analyzer.key (0600, never overwritten), analyzer.pub."""
    from fedldp.aggregator.shuffle_analyzer import generate_analyzer_key
    from fedldp.client.sealed import key_id

    try:
        key_path, public = generate_analyzer_key(Path(out_dir))
    except FileExistsError:
        raise click.ClickException(f"{out_dir}/analyzer.key exists; not overwritten") from None
    click.echo(f"wrote {key_path} and {Path(out_dir) / 'analyzer.pub'} (key id {key_id(public)})")


@shuffler.command("release")
@click.option(
    "--spool",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="the spool SQLite file the collector appends (batch, ciphertext) rows to",
)
@click.option("--batch", required=True, help="batch key (e.g. policy-v1-2026-12-01)")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="folder the shuffled batch file is written to (for the analyzer)",
)
@click.option(
    "--min-batch",
    type=click.IntRange(min=1),
    help="refuse below this; with --policies it may only raise the policy's signed min_batch",
)
@click.option(
    "--policies",
    "policy_dir",
    type=click.Path(exists=True, file_okay=False),
    help="folder of signed *.policy envelopes: the batch POLICY.vVERSION.WINDOW's policy "
    "gives the signed minimum (needs --trust)",
)
@trust_option(help="trust folder that verifies --policies")
@click.option("--audience", help="deployment name the policy must list (default: 'default')")
def release_cmd(
    spool: str,
    batch: str,
    out_dir: str,
    min_batch: int | None,
    policy_dir: str | None,
    trust_dir: str | None,
    audience: str | None,
) -> None:
    """Shuffle one batch with the OS CSPRNG and write it for the analyzer, once, with its
    manifest (BATCH.shuffled.manifest.json: the ledger's count at the last pull).

    The minimum is the larger of --min-batch and, with --policies/--trust, the batch policy's
    signed [shuffle] min_batch. Exit status 1, nothing changed, when fewer ciphertexts wait.
    """
    from fedldp.aggregator.shuffler import BatchTooSmallError, ShuffleSpool, release

    floor = _release_minimum(batch, min_batch, policy_dir, trust_dir, audience)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    store = ShuffleSpool(Path(spool))
    try:
        path = release(store, batch, Path(out_dir), min_batch=floor)
    except (BatchTooSmallError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    from fedldp.aggregator.shuffle_manifest import write_manifest

    released = store.released(batch)
    count = released[0] if released else 0
    manifest = write_manifest(store, batch, path)
    click.echo(f"released {count} shuffled ciphertexts to {path} (manifest {manifest.name})")


def _release_minimum(
    batch: str,
    min_batch: int | None,
    policy_dir: str | None,
    trust_dir: str | None,
    audience: str | None,
) -> int:
    """The release's minimum batch: max(--min-batch, the batch policy's signed min_batch).

    Without --policies, --min-batch is required; with it, --trust is, and the batch key must
    be a window batch (POLICY.vVERSION.WINDOW) naming a verifiable shuffle-model policy.
    """
    import re

    from fedldp.cli_report import load_verified_policy

    if policy_dir is None:
        if min_batch is None:
            raise click.UsageError("give --min-batch, or --policies and --trust")
        return min_batch
    if trust_dir is None:
        raise click.UsageError("--policies needs --trust")
    match = re.fullmatch(r"(.+)\.v([0-9]+)\.([0-9]+)", batch)
    if match is None:
        raise click.ClickException(f"batch {batch!r} is not POLICY.vVERSION.WINDOW")
    policy = load_verified_policy(
        policy_dir,
        trust_dir,
        match.group(1),
        version=int(match.group(2)),
        at=int(time.time()),
        audience=audience,
    )
    if not policy.message.HasField("shuffle"):
        raise click.ClickException(f"policy {policy.policy_id} has no [shuffle] section")
    return max(_signed_min_batch(policy), min_batch or 1)


@shuffler.command("pull")
@config_option("collector.toml whose ledger_url holds the sealed reports")
@ledger_option()
@click.option("--policy", "policy_id", required=True, help="a shuffle-model policy id")
@click.option(
    "--window",
    "window_start",
    required=True,
    type=click.IntRange(min=0),
    help="the window's start, Unix seconds (as `fedldp ledger` and GetBudget show it)",
)
@click.option(
    "--spool",
    required=True,
    type=click.Path(dir_okay=False),
    help="the shuffler's spool SQLite file (created if absent)",
)
def pull_cmd(
    config_path: str | None,
    ledger_url: str | None,
    policy_id: str,
    window_start: int,
    spool: str,
) -> None:
    """Copy a window's sealed payloads from the collector's ledger (read-only) into the spool.

    Only ciphertexts travel: no subject, report id, time or arrival order. One batch per
    policy version, named POLICY.vVERSION.WINDOW; pulling again adds only what is new.
    """
    from fedldp.aggregator.shuffler import ShuffleSpool, pull_window
    from fedldp.cli_common import open_cli_ledger, resolve_ledger_url

    url = resolve_ledger_url(ledger_url, config_path)
    with open_cli_ledger(url, "read", scope="whole") as ledger:
        by_version = ledger.sealed_ciphertexts(policy_id, window_start)
    if not by_version:
        raise click.ClickException(
            f"no sealed reports of policy {policy_id!r} in the window starting {window_start}"
        )
    store = ShuffleSpool(Path(spool))
    for pulled in pull_window(by_version, store, policy_id, window_start):
        if pulled.released:
            click.echo(f"batch {pulled.batch}: released already; nothing added")
        else:
            click.echo(
                f"batch {pulled.batch}: {pulled.added} added, {store.pending(pulled.batch)} "
                f"waiting ({pulled.stored} stored in the ledger)"
            )


def guarantee_options(prefix: str = "") -> Callable[[F], F]:
    """The analyzer's --delta (δ of the central guarantee) and --collector-count (the
    collector's accepted count for the batch, which caps n), each help text after `prefix`."""

    def wrap(fn: F) -> F:
        fn = click.option(
            "--collector-count",
            type=click.IntRange(min=0),
            help=prefix + "reports the collector accepted for this batch: caps n of the "
            "central guarantee (default: the manifest beside the batch file)",
        )(fn)
        return click.option(
            "--delta",
            type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
            help=prefix + "δ of the central guarantee (default 1e-8)",
        )(fn)

    return wrap


@shuffler.command("serve")
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="shuffler.toml (deploy/examples/shuffler.toml lists every setting)",
)
def serve_cmd(config_path: str) -> None:
    """Pull every shuffle-model policy's windows from the collector's ledger (read-only) and
    release each closed window's batch at its minimum, every interval, until SIGTERM/SIGINT.

    The config is checked whole before anything starts (one line naming every problem);
    a stop request takes effect after the batch in hand; kill -9 loses nothing.
    """
    import logging
    import signal

    from fedldp.aggregator.shuffler_config import load
    from fedldp.aggregator.shuffler_service import Shuffler, ShufflerMetrics, serve_metrics
    from fedldp.cli_common import open_cli_ledger
    from fedldp.client.policy import PolicyError
    from fedldp.client.policy.files import load_trust_folder

    config = load(config_path)
    open_cli_ledger(config.ledger_url, "read", scope="whole").close()  # refused: one line
    try:
        load_trust_folder(config.trust_dir, now=int(time.time()))
    except PolicyError as exc:
        raise click.ClickException(f"trust folder {config.trust_dir}: {exc}") from None
    metrics = ShufflerMetrics() if config.metrics_listen else None
    try:
        server = serve_metrics(metrics, config.metrics_listen) if metrics is not None else None
    except OSError as exc:
        raise click.ClickException(
            f"metrics_listen {config.metrics_listen}: cannot listen ({exc.strerror})"
        ) from None
    formatter = logging.Formatter("%(asctime)sZ %(levelname)s %(name)s %(message)s")
    formatter.converter = time.gmtime  # the Z in the format: times in UTC
    handler = logging.StreamHandler()  # stderr: journald under systemd
    handler.setFormatter(formatter)
    logging.getLogger("fedldp.shuffler").addHandler(handler)
    logging.getLogger("fedldp.shuffler").setLevel(logging.INFO)
    daemon = Shuffler(
        config,
        lambda url: open_cli_ledger(url, "read", scope="whole"),
        metrics=metrics,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: daemon.request_stop())
    click.echo(
        f"fedldp shuffler serving: spool {config.spool}, batches to {config.out_dir}, every "
        f"{config.interval_seconds:g} s (SIGTERM or Ctrl-C stops after the batch in hand)",
        err=True,
    )
    try:
        daemon.serve()
    finally:
        if server is not None:
            server.shutdown()


@shuffler.command("analyze")
@click.argument("batch_file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--analyzer-key",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="the analyzer's private key (analyzer.key from `fedldp shuffler keygen`)",
)
@click.option("--policy", "policy_id", required=True, help="policy id")
@click.option(
    "--version", type=click.IntRange(min=1), help="policy version (default: the highest found)"
)
@click.option(
    "--policies",
    "policy_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="folder of signed *.policy envelopes",
)
@trust_option(required=True)
@click.option("--audience", help="deployment name the policy must list (default: 'default')")
@guarantee_options()
def analyze(
    batch_file: str,
    analyzer_key: str,
    policy_id: str,
    version: int | None,
    policy_dir: str,
    trust_dir: str,
    audience: str | None,
    delta: float | None,
    collector_count: int | None,
) -> None:
    """Decrypt a shuffled batch, drop and count invalid payloads, print estimates and guarantees.

    The collector's count that caps n is --collector-count, else the manifest beside the
    batch file (written by `fedldp shuffler serve` / `release`), else none.
    """
    from fedldp.cli_report import load_verified_policy

    policy = load_verified_policy(
        policy_dir, trust_dir, policy_id, version=version, at=int(time.time()), audience=audience
    )
    result, count, source = analyze_shuffled(
        Path(batch_file), Path(analyzer_key), policy, delta=delta, collector_count=collector_count
    )
    _print_estimate(policy, result)
    click.echo(_count_line(count, source))


def analyze_shuffled(
    batch_file: Path,
    analyzer_key: Path,
    policy: Any,
    *,
    delta: float | None,
    collector_count: int | None,
) -> tuple[Any, int | None, str | None]:
    """The analyzer's pass over a shuffled batch, behind its gates: (ShuffledRelease, the
    collector count that capped n, where it came from: "--collector-count", "manifest" or None).

    Refused (click errors, nothing printed) when the manifest beside the file is malformed or
    not the file's, the batch does not open as the policy's (not a batch file, not an X25519
    key), n is below the policy's signed shuffle min_batch, or the valid reports are fewer
    than its min_reports_for_release.
    """
    from fedldp.aggregator.shuffle_analyzer import DEFAULT_DELTA, analyze_batch, load_analyzer_key
    from fedldp.aggregator.shuffle_manifest import read_manifest
    from fedldp.client.sealed import seal_info

    source = "--collector-count" if collector_count is not None else None
    try:
        manifest = read_manifest(batch_file)
    except ValueError as exc:
        raise click.ClickException(f"{exc}; pass --collector-count instead") from None
    if collector_count is None and manifest is not None and manifest.collector_count is not None:
        collector_count, source = manifest.collector_count, "manifest"
    info = seal_info(policy.policy_id, policy.version, policy.digest)
    try:
        result = analyze_batch(
            batch_file,
            policy.mechanism,
            load_analyzer_key(analyzer_key),
            info=info,
            delta=delta or DEFAULT_DELTA,
            collector_count=collector_count,
            max_reports_per_device=_max_reports_per_device(policy),
        )
    except ValueError as exc:  # not a batch file, not an X25519 key
        raise click.ClickException(f"{exc}") from None
    signed_min = _signed_min_batch(policy)
    n = result.central.n if result.central is not None else 0  # capped by the collector count
    if n < signed_min:
        raise click.ClickException(
            f"{n} valid reports (capped by the collector count), fewer than the policy's signed "
            f"shuffle min_batch {signed_min}: not estimated"
        )
    if result.accepted < policy.min_reports_for_release:
        raise click.ClickException(
            f"{result.accepted} valid reports, fewer than the policy's minimum "
            f"{policy.min_reports_for_release}: not released"
        )
    return result, collector_count, source


def _count_line(count: int | None, source: str | None) -> str:
    """Which collector count capped n, in words."""
    if count is None:
        return "collector count: none given (n is the valid reports; see docs/shuffle.md)"
    who = "the shuffler's manifest" if source == "manifest" else "--collector-count"
    return f"collector count: {count} (from {who}; caps n)"


def _max_reports_per_device(policy: Any) -> int:
    """m: how many reports one device can have in a window's batch, the policy's per-window
    cap ÷ the charge per report (exact decimals, rounded down), at least 1."""
    if policy.charge <= 0:
        raise click.ClickException(f"policy {policy.policy_id} charges nothing per report")
    return max(1, int(policy.epsilon_cap // policy.charge))


def _signed_min_batch(policy: Any) -> int:
    """The policy's signed `[shuffle] min_batch` (1 when the policy has no shuffle section)."""
    if not policy.message.HasField("shuffle"):
        return 1
    return max(1, int(policy.message.shuffle.min_batch))


def _print_estimate(policy: Any, result: Any) -> None:
    """The estimate's table, the dropped payloads and both guarantees."""
    estimate = policy.mechanism.estimate(result.statistic)
    labels = policy.labels or [str(i) for i in range(len(estimate.values))]
    click.echo(f"policy {policy.policy_id} v{policy.version}, batch {result.batch}")
    click.echo(f"{'value':<20} {'estimate':>10} {'std error':>10}")
    for label, value, variance in zip(labels, estimate.values, estimate.variances, strict=False):
        click.echo(f"{label:<20} {float(value):>10.4f} {float(variance) ** 0.5:>10.4f}")
    dropped = ", ".join(f"{k}: {v}" for k, v in sorted(result.invalid.items())) or "none"
    click.echo(f"valid reports: {result.accepted}; invalid dropped: {dropped}")
    click.echo(result.guarantee_line())
