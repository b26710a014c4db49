"""`fedldp report --batch`: the analyzer's report on a shuffled batch (docs/shuffle.md).

The analyzer opens the batch with its private key (`fedldp.cli_shuffle.analyze_shuffled`:
the same gates as `fedldp shuffler analyze`), builds the policy's report from the valid
reports' statistic exactly as `fedldp report` does from a ledger's (`report_for_policy`:
the same estimates, error bars, consistency and release gate), and adds the shuffle
guarantees to the report's context (`ReportContext.shuffle`): the table, JSON and HTML
outputs then state local ε0 per report, the amplified central (ε, δ) per report over the n
valid reports, and the per-device guarantee, beside the estimates.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import click

#: `fedldp report` options that read a ledger (parameter name, flag): refused with --batch.
_LEDGER_OPTIONS = (
    ("ledgers", "--ledger"),
    ("window_start", "--window"),
    ("merge_files", "--merge"),
    ("export_path", "--export-statistics"),
    ("audit", "--audit"),
    ("source", "--source"),
)


def report_batch(params: dict[str, Any]) -> None:
    """Write the report on the batch file `params["batch_file"]` (see the module docstring).

    `params`: the `fedldp report` command's options by parameter name (click's
    `Context.params`). Its ledger-only options are refused here (a usage error);
    --config supplies only the policy folder, trust folder and audience.
    """
    from fedldp.aggregator.reports import MergedStatistic, ReportError, report_for_policy
    from fedldp.aggregator.shuffle_manifest import parse_window_batch
    from fedldp.cli_report import _candidates, _emit_report, _settings, load_verified_policy
    from fedldp.cli_shuffle import analyze_shuffled

    batch_file, analyzer_key = params["batch_file"], params["analyzer_key"]
    fmt, out_path = params["fmt"], params["out_path"]
    if batch_file is None or analyzer_key is None:
        raise click.UsageError("--batch and --analyzer-key go together")
    refused = [flag for name, flag in _LEDGER_OPTIONS if params[name] not in (None, (), False)]
    if refused:
        raise click.UsageError(
            f"--batch reports on a shuffled batch, not a ledger: drop {', '.join(refused)}"
        )
    _, policy_dir, trust_dir, audience = _settings(
        params["config_path"], (), params["policy_dir"], params["trust_dir"], params["audience"]
    )
    if not policy_dir or not trust_dir:
        raise click.UsageError("pass --policies and --trust (or --config)")
    if fmt == "html" and out_path is None:
        raise click.UsageError("--format html needs --out PATH")
    at = params["at_time"] if params["at_time"] is not None else int(time.time())
    policy = load_verified_policy(
        policy_dir,
        trust_dir,
        params["policy_id"],
        version=_version(params["version"], Path(batch_file), params["policy_id"]),
        at=at,
        audience=audience,
    )
    if policy.analyzer_public_key is None:
        raise click.ClickException(
            f"policy {policy.policy_id} v{policy.version} has no [shuffle] section: its reports "
            "are in the ledger, not in a shuffled batch (drop --batch, pass --ledger)"
        )
    candidates = _candidates(policy, params["candidates_path"], False)
    result, count, source = analyze_shuffled(
        Path(batch_file),
        Path(analyzer_key),
        policy,
        delta=params["delta"],
        collector_count=params["collector_count"],
    )
    window = parse_window_batch(result.batch)
    merged = MergedStatistic(
        statistic=result.statistic, n=result.accepted, partials=1, sources=(result.batch,)
    )
    try:
        report = report_for_policy(
            policy,
            merged,
            window_start=window[2] if window is not None else None,
            confidence=params["confidence"],
            simultaneous=params["simultaneous"],
            consistency=params["consistency"],
            candidates=candidates,
        )
    except (ReportError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    shuffle = result.guarantee_dict(count, source, epsilon0=policy.mechanism.epsilon)
    context = dataclasses.replace(report.context, shuffle=shuffle)
    report = dataclasses.replace(report, context=context)
    _emit_report(report, fmt, out_path, heavy_hitters=params["heavy_hitters"])


def _version(given: int | None, batch_file: Path, policy_id: str) -> int | None:
    """--version, else the version the batch key names (POLICY.vVERSION.WINDOW, the key of a
    window batch of `policy_id`): a batch opens only under the version it was sealed for.
    None (the highest version) for any other key."""
    from fedldp.aggregator.shuffle_manifest import parse_window_batch
    from fedldp.aggregator.shuffler import read_batch

    if given is not None:
        return given
    try:
        key = parse_window_batch(read_batch(batch_file)[0])
    except ValueError as exc:  # not a batch file
        raise click.ClickException(f"--batch {batch_file}: {exc}") from None
    return key[1] if key is not None and key[0] == policy_id else None
