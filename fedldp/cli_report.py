"""`fedldp report` (analyst reports) and `fedldp release` (central DP releases).

Heavy imports (numpy, SQLAlchemy, matplotlib, scipy) happen inside the commands.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from fedldp.cli_common import (
    LEDGER_URL_HELP,
    TimeParam,
    config_option,
    decimal_option,
    iso_utc,
    ledger_option,
    open_cli_ledger,
    resolve_ledger_url,
    trust_option,
)
from fedldp.cli_shuffle import guarantee_options
from fedldp.client.textfiles import not_text

if TYPE_CHECKING:
    from fedldp.client.policy import VerifiedPolicy

F = TypeVar("F", bound=Callable[..., Any])

_FORMATS = ("table", "json", "csv", "html")
_CONSISTENCY = ("none", "norm-sub", "base-cut", "project")


def _settings(
    config_path: str | None,
    ledgers: tuple[str, ...],
    policies: str | None,
    trust: str | None,
    audience: str | None,
) -> tuple[list[str], str | None, str | None, str]:
    """Explicit options win; the rest comes from a collector.toml when given."""
    if config_path is None:
        return list(ledgers), policies, trust, audience or "default"
    from fedldp.collector.config import load_config

    cfg = load_config(config_path)  # a ConfigError names the file (fedldp/cli_errors.py)
    return (
        # every shard of a sharded ledger: their partials merge like collectors'
        list(ledgers) or ([cfg.ledger_url] if cfg.ledger_url else list(cfg.ledger_shards)),
        policies or cfg.policy_dir or None,
        trust or cfg.trust_dir or None,
        audience or cfg.audience,
    )


def _lists_shards(config_path: str | None) -> bool:
    """Whether --config names a sharded ledger (`ledger_shards`)."""
    if config_path is None:
        return False
    from fedldp.collector.config import load_config

    return bool(load_config(config_path).ledger_shards)


def _open_sources(urls: list[str], *, sharded: bool) -> list[Any]:
    """The ledgers to report on, read-only: every shard of the config's
    `ledger_shards` as one source (its shard map must list exactly these URLs,
    `open_sharded`), else each URL, refused when it is one shard of a sharded
    ledger (`refuse_if_shard`): a report never silently reads part of a ledger."""
    if sharded:
        from fedldp.cli_shards import open_cli_shards

        return [open_cli_shards(urls)]
    opened: list[Any] = []
    try:
        for url in urls:
            opened.append(open_cli_ledger(url, "read", scope="whole"))
    except BaseException:
        for ledger in opened:
            ledger.close()
        raise
    return opened


def load_verified_policy(
    policy_dir: str | Path,
    trust_dir: str | Path,
    policy_id: str,
    *,
    version: int | None,
    at: int,
    audience: str | None,
) -> VerifiedPolicy:
    """The signed policy `policy_id` (given version, or the highest) verified at time `at`.

    Verification at `at` (default: the window's start) lets an analyst report on
    a window of a policy that has since expired.
    """
    from fedldp.client.policy import PolicyError, verify_policy
    from fedldp.client.policy.files import load_trust_folder, read_envelope

    try:
        trust = load_trust_folder(trust_dir, now=at)
    except PolicyError as exc:
        raise click.ClickException(f"trust folder {trust_dir}: {exc}") from None
    found: list[VerifiedPolicy] = []
    refused: list[str] = []  # why envelopes of this id were refused
    seen_ids: set[str] = set()
    for path in sorted(Path(policy_dir).glob("*.policy")):
        try:
            envelope = read_envelope(path)
            verified = verify_policy(envelope, trust, now=at, audience=audience)
        except PolicyError as exc:
            unverified = _unverified_id(path)
            if unverified is not None:
                seen_ids.add(unverified)
            if unverified == policy_id:
                refused.append(f"{path.name}: {exc}")
            continue
        seen_ids.add(verified.policy_id)
        if verified.policy_id == policy_id and (version is None or verified.version == version):
            found.append(verified)
    if not found:
        which = f"{policy_id!r}" + (f" v{version}" if version is not None else "")
        if refused:
            raise click.ClickException(
                f"policy {which} in {policy_dir} was refused at {iso_utc(at)} (audience "
                f"{audience!r}; --audience and --at change these): " + "; ".join(refused)
            )
        known = ", ".join(sorted(seen_ids)) or "none"
        raise click.ClickException(
            f"no signed policy {which} in {policy_dir} (policy ids there: {known}); "
            "check --policy and --version"
        )
    return max(found, key=lambda p: p.version)


def _unverified_id(path: Path) -> str | None:
    """The policy id an envelope claims, read WITHOUT verification (only to explain a
    refusal; never trusted)."""
    from google.protobuf.message import DecodeError

    from fedldp.client.policy import PolicyError
    from fedldp.client.policy.files import read_envelope
    from fedldp.v1 import policy_pb2

    try:
        return policy_pb2.Policy.FromString(read_envelope(path).payload).policy_id
    except (DecodeError, OSError, PolicyError):
        return None


@click.command("report")
@click.option("--policy", "policy_id", required=True, help="policy id")
@click.option(
    "--version", type=click.IntRange(min=1), help="policy version (default: the highest found)"
)
@click.option(
    "--window",
    "window_start",
    type=TimeParam(),
    help="window start (ISO 8601 UTC, e.g. 2026-12-01T00:00:00Z, or epoch seconds); "
    "default: every window",
)
@click.option(
    "--ledger",
    "ledgers",
    multiple=True,
    help=LEDGER_URL_HELP + "; repeat to merge several collectors' or regions' ledgers",
)
@click.option(
    "--policies",
    "policy_dir",
    type=click.Path(file_okay=False),
    help="folder of signed *.policy envelopes",
)
@trust_option()
@click.option("--audience", help="deployment name the policy must list (default: 'default')")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="collector.toml supplying ledger_url, policy_dir, trust_dir, audience",
)
@click.option(
    "--at",
    "at_time",
    type=TimeParam(),
    help="verify the policy as of this time (default: the window start, else now)",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(_FORMATS),
    default="table",
    show_default=True,
    help="table and html for people (dates in ISO 8601 UTC); json and csv for programs",
)
@click.option(
    "--consistency",
    type=click.Choice(_CONSISTENCY),
    default="none",
    show_default=True,
    help="post-processing of frequencies (Wang et al. NDSS 2020); norm-sub recommended",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.95,
    show_default=True,
    help="confidence level of the intervals",
)
@click.option("--simultaneous", is_flag=True, help="Bonferroni intervals over all values")
@click.option("--heavy-hitters", is_flag=True, help="list values above the noise floor")
@click.option(
    "--merge",
    "merge_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="exported statistics JSON (another region) to merge; repeatable",
)
@click.option(
    "--export-statistics",
    "export_path",
    type=click.Path(dir_okay=False),
    help="write this ledger's partial statistics as JSON instead of a report",
)
@click.option("--source", default=None, help="source name written in an export (e.g. the region)")
@click.option("--audit", is_flag=True, help="also recompute from raw rows; fail on any difference")
@click.option(
    "--candidates",
    "candidates_path",
    type=click.Path(exists=True, dir_okay=False),
    help="sketch policies (cms, hcms): UTF-8 file of the strings to estimate, one per line",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    help="write here instead of stdout (required for html)",
)
@click.option(
    "--batch",
    "batch_file",
    type=click.Path(exists=True, dir_okay=False),
    help="a shuffled batch file (shuffle-model policy, docs/shuffle.md) instead of a ledger: "
    "needs --analyzer-key; shows local ε0 and the central (ε, δ) beside the estimates",
)
@click.option(
    "--analyzer-key",
    type=click.Path(exists=True, dir_okay=False),
    help="with --batch: the analyzer's private key (analyzer.key)",
)
@guarantee_options("with --batch: ")
def report(
    policy_id: str,
    version: int | None,
    window_start: int | None,
    ledgers: tuple[str, ...],
    policy_dir: str | None,
    trust_dir: str | None,
    audience: str | None,
    config_path: str | None,
    at_time: int | None,
    fmt: str,
    consistency: str,
    confidence: float,
    simultaneous: bool,
    heavy_hitters: bool,
    merge_files: tuple[str, ...],
    export_path: str | None,
    source: str | None,
    audit: bool,
    candidates_path: str | None,
    out_path: str | None,
    **shuffle: Any,  # --batch, --analyzer-key, --delta, --collector-count
) -> None:
    """Estimate a policy's metric with error bars from the ledger's statistics.

    Frequencies (categorical policies), the mean (numeric policies), or the
    frequencies of the strings in --candidates (sketch policies over an open
    domain), with standard errors from the mechanism's exact variance (for
    sketches, including the collision term). Refused below the policy's minimum
    report count (exit status 1, nothing printed on stdout).
    """
    if shuffle["batch_file"] is not None or shuffle["analyzer_key"] is not None:
        from fedldp.cli_report_shuffle import report_batch

        report_batch(click.get_current_context().params)
        return
    if shuffle["delta"] is not None or shuffle["collector_count"] is not None:
        raise click.UsageError("--delta and --collector-count apply to --batch only")
    from fedldp.aggregator.reports import (
        ReportError,
        audit_statistics,
        export_statistics,
        load_export,
        report_from_ledgers,
    )

    urls, policy_dir, trust_dir, aud = _settings(
        config_path, ledgers, policy_dir, trust_dir, audience
    )
    if not policy_dir or not trust_dir:
        raise click.UsageError("pass --policies and --trust (or --config)")
    if not urls and not merge_files:
        raise click.UsageError("pass --ledger URL (or --config, or --merge FILE)")
    if fmt == "html" and out_path is None:
        raise click.UsageError("--format html needs --out PATH")
    at = (
        at_time
        if at_time is not None
        else (window_start if window_start is not None else int(time.time()))
    )
    policy = load_verified_policy(
        policy_dir, trust_dir, policy_id, version=version, at=at, audience=aud
    )
    candidates = _candidates(policy, candidates_path, export_path is not None)
    opened = _open_sources(urls, sharded=not ledgers and _lists_shards(config_path))
    try:
        if export_path is not None:
            if len(opened) != 1:
                raise click.UsageError("--export-statistics reads exactly one --ledger")
            if not source:
                raise click.UsageError("--export-statistics needs --source NAME (the region)")
            doc = export_statistics(opened[0], policy, window_start, source=source)
            Path(export_path).write_text(json.dumps(doc, indent=1), encoding="utf-8")
            click.echo(f"wrote {len(doc['partials'])} partial statistics to {export_path}")
            return
        try:
            if audit:
                for ledger in opened:
                    audit_statistics(ledger, policy, window_start)
            extra = [p for f in merge_files for p in load_export(Path(f), policy)]
            names = [f"ledger{i}" if len(opened) > 1 else "ledger" for i in range(len(opened))]
            result = report_from_ledgers(
                list(zip(names, opened, strict=True)),
                policy,
                window_start=window_start,
                confidence=confidence,
                simultaneous=simultaneous,
                consistency=consistency,
                extra_partials=extra,
                candidates=candidates,
            )
        except (ReportError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    finally:
        for ledger in opened:
            ledger.close()
    _emit_report(result, fmt, out_path, heavy_hitters=heavy_hitters)


def _emit_report(result: Any, fmt: str, out_path: str | None, *, heavy_hitters: bool) -> None:
    """Write `result` as html (to `out_path`, required), json, csv or a table (to
    `out_path` or stdout); heavy hitters are added to json and table output of a
    frequency report when asked for."""
    from fedldp.aggregator.estimation import FrequencyReport
    from fedldp.aggregator.estimation import heavy_hitters as find_hh
    from fedldp.aggregator.render import render_html, render_table

    hh = find_hh(result) if heavy_hitters and isinstance(result, FrequencyReport) else None
    if fmt == "html":
        assert out_path is not None
        render_html(result, out_path)
        click.echo(f"wrote {out_path}")
        return
    if fmt == "json":
        data = result.to_dict()
        if hh is not None:
            data["heavy_hitters"] = [h.to_dict() for h in hh]
        text = json.dumps(data, indent=2) + "\n"
    elif fmt == "csv":
        text = result.to_csv()
    else:
        text = render_table(result)
        if hh is not None:
            text += (
                "heavy hitters (Bonferroni, alpha 0.05): "
                + (", ".join(f"{h.label} (z={h.z_score:.1f})" for h in hh) or "none")
                + "\n"
            )
    if out_path is not None:
        Path(out_path).write_text(text, encoding="utf-8")
        click.echo(f"wrote {out_path}")
    else:
        click.echo(text, nl=False)


def _candidates(policy: VerifiedPolicy, path: str | None, exporting: bool) -> list[str] | None:
    """--candidates read for a sketch policy (required there unless exporting), refused
    (usage error) for any other policy."""
    from fedldp.aggregator.sketches import CandidateFileError, read_candidates
    from fedldp.client.mechanisms.sketch import Sketch

    mechanism = policy.mechanism
    if path is None:
        if isinstance(mechanism, Sketch) and not exporting:
            raise click.UsageError(
                f"policy {policy.policy_id!r} collects strings with the sketch "
                f"{mechanism.wire_id!r}: pass --candidates FILE (the strings to "
                "estimate, one per line)"
            )
        return None
    if not isinstance(mechanism, Sketch):
        raise click.UsageError(
            f"--candidates applies to sketch policies (cms, hcms); policy {policy.policy_id!r} "
            f"uses {mechanism.wire_id!r}"
        )
    try:
        candidates = read_candidates(path)
        mechanism.check_candidates(candidates)
    except CandidateFileError as exc:
        raise click.ClickException(f"--candidates {exc}") from None
    except ValueError as exc:  # positions are 1-based among the file's non-empty lines
        raise click.ClickException(f"--candidates {path}: {exc}") from None
    return candidates


# --- central releases ---


class _DataFile:
    """A loader over a one-value-per-line file or a CSV column, read only when called.

    It hashes the exact bytes it reads, streaming (`sha256` once the whole file
    was read), so the digest is of what was released, read once, after the
    ledger recorded the data opened. The plain hash is never published:
    `digest()` is its HMAC under the secret data-digest key (datakey.py), the
    binding stored in the ledger's events and signed into the receipt.
    """

    def __init__(self, path: str, column: str | None, key: Any = None) -> None:
        self.path, self.column, self.key = path, column, key
        self.sha256: str | None = None

    def digest(self) -> Any:
        """The keyed digest (datakey.KeyedDigest) of the bytes read."""
        assert self.sha256 is not None, "the data was not read to its end"
        return self.key.digest("file", self.sha256)

    def __call__(self) -> Iterator[str]:
        try:
            yield from self._values()
        except UnicodeDecodeError as exc:
            raise click.ClickException(
                f"--data {not_text(self.path, exc)}; "
                "give one value per line, or a CSV file with --column"
            ) from None

    def _values(self) -> Iterator[str]:
        from fedldp.aggregator.central.receipts import HashingReader

        digest = hashlib.sha256()
        with open(self.path, "rb") as fh:
            text = io.TextIOWrapper(
                io.BufferedReader(HashingReader(fh, digest)), encoding="utf-8", newline=""
            )
            if self.column is None:
                for line in text:
                    value = line.strip()
                    if value:
                        yield value
            else:
                reader = csv.DictReader(text)
                if reader.fieldnames is None or self.column not in reader.fieldnames:
                    raise click.ClickException(f"{self.path} has no column {self.column!r}")
                for row in reader:
                    yield row[self.column]
            text.read()  # hash to the end whatever the parser left
        self.sha256 = digest.hexdigest()


_common = [
    ledger_option(),
    config_option("collector.toml to read ledger_url from"),
    click.option("--subject", help="whose central budget is charged (local)"),
    click.option("--purpose", required=True, help="the purpose the budget is set for"),
    click.option("--epsilon", "epsilon_text", required=True, help="epsilon (decimal)"),
    click.option(
        "--key",
        "idempotency_key",
        required=True,
        help="idempotency key: a retry with the same key returns the same release",
    ),
    click.option(
        "--data",
        "data_path",
        type=click.Path(exists=True, dir_okay=False),
        help="one value per line, or a CSV with --column (local)",
    ),
    click.option(
        "--column", help="CSV column holding the values; with --service, the dataset's column"
    ),
    click.option(
        "--receipt",
        "receipt_path",
        type=click.Path(dir_okay=False),
        help="write the signed release receipt here (local: needs --signing-key)",
    ),
    click.option(
        "--signing-key",
        "signing_key",
        type=click.Path(exists=True, dir_okay=False),
        help="the service's Ed25519 receipt key (fedldp keys generate)",
    ),
    click.option(
        "--passphrase-env", metavar="VAR", help="passphrase of an encrypted --signing-key"
    ),
    click.option(
        "--data-key",
        "data_key_path",
        type=click.Path(exists=True, dir_okay=False),
        help="secret data-digest key (fedldp keys data-key): binds the data to the receipt "
        "with a keyed HMAC; without it no data digest is recorded",
    ),
]


def _apply(options: list[Any]) -> Callable[[F], F]:
    def wrap(fn: F) -> F:
        out: Any = fn
        for option in reversed(options):
            out = option(out)
        return cast(F, out)

    return wrap


_noise = [
    click.option(
        "--mechanism",
        type=click.Choice(["laplace", "gaussian"]),
        default="laplace",
        show_default=True,
        help="noise: laplace (pure epsilon) or gaussian (needs --delta > 0)",
    ),
    click.option(
        "--delta",
        "delta_text",
        default="0",
        show_default=True,
        help="delta (decimal; > 0 for gaussian)",
    ),
    click.option(
        "--calibration",
        type=click.Choice(["analytic", "classic"]),
        default="analytic",
        show_default=True,
        help="Gaussian sigma: analytic (any eps) or classic (eps<1)",
    ),
]
_bounds = [
    click.option("--lower", "lower_text", help="clipping lower bound (local)"),
    click.option("--upper", "upper_text", help="clipping upper bound (local)"),
    click.option("--granularity", "granularity_text", help="output lattice step (default: auto)"),
]


@click.group("release")
def release() -> None:
    """Central DP releases over consolidated data, charged to the ledger first."""


def _emit(result: Any) -> None:
    click.echo(json.dumps(result.to_dict(), indent=2))


_DECIMAL_OPTIONS = ("epsilon", "delta", "lower", "upper", "granularity", "quantile")


def _release_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """The release function's keyword arguments from the raw click options.

    Decimal options (`NAME_text`) are parsed in the fixed order of
    `_DECIMAL_OPTIONS` (whatever the command-line order), each failing with a
    BadParameter naming its option; the data file becomes a lazy loader.
    """
    kwargs = dict(options)
    kwargs["ledger_url"] = resolve_ledger_url(kwargs.pop("ledger_url"), kwargs.pop("config_path"))
    key = _data_key(kwargs.pop("data_key_path", None))
    data = _DataFile(kwargs.pop("data_path"), kwargs.pop("column"), key)
    kwargs["load"] = data
    if key is not None:
        kwargs["data_digest"] = data.digest
    for name in _DECIMAL_OPTIONS:
        if f"{name}_text" in kwargs:
            kwargs[name] = decimal_option(
                kwargs.pop(f"{name}_text"), f"--{name}", allow_negative=name in ("lower", "upper")
            )
    return kwargs


def _data_key(path: str | None) -> Any:
    """The secret data-digest key (None: no data digest is recorded), loaded before reserving."""
    if path is None:
        return None
    from fedldp.aggregator.central.datakey import DataKeyError, load_data_key

    try:
        return load_data_key(path)
    except DataKeyError as exc:
        raise click.ClickException(str(exc)) from None


def _signing_key(path: str | None, passphrase_env: str | None, receipt: str | None) -> Any:
    """The receipt key, loaded before anything is reserved (None: no receipt asked for)."""
    if receipt is None:
        if path is not None:
            raise click.UsageError("--signing-key needs --receipt PATH")
        return None
    if path is None:
        raise click.UsageError("--receipt needs --signing-key (receipts are always signed)")
    if Path(receipt).exists():
        raise click.ClickException(f"{receipt} exists; a receipt is never overwritten")
    from fedldp.authoring import KeyFileError, load_private_key
    from fedldp.cli_keys import passphrase_from_env

    try:
        return load_private_key(path, passphrase=passphrase_from_env(passphrase_env))
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None


def _run(fn: Any, **options: Any) -> None:
    """Parse `options`, call `fn(ledger, now=..., **kwargs)`, print its result as JSON and
    write its signed receipt when asked."""
    from fedldp.aggregator.central.releases import ReleaseError
    from fedldp.collector.ledger.store import LedgerError

    receipt_path = options.pop("receipt_path")
    key = _signing_key(options.pop("signing_key"), options.pop("passphrase_env"), receipt_path)
    kwargs = _release_kwargs(options)
    if key is not None:  # bound in the reservation: verify refuses any other signer
        from fedldp.client.policy.envelope import key_id_of

        kwargs["receipt_key_id"] = key_id_of(key.public_key())
    ledger = open_cli_ledger(kwargs.pop("ledger_url"), "write", scope="central")
    try:
        result = fn(ledger, now=int(time.time()), **kwargs)
        _emit(result)
        if key is not None:
            _write_receipt(ledger, result, key, Path(receipt_path))
    except (LedgerError, ReleaseError, ValueError, TypeError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        ledger.close()


def _write_receipt(ledger: Any, result: Any, key: Any, path: Path) -> None:
    from fedldp.aggregator.central.receipts import release_receipt
    from fedldp.aggregator.central.signing import RELEASE_RECEIPT_TYPE, sign

    receipt = release_receipt(ledger, result.reservation_id, value=str(result.value))
    envelope = sign(RELEASE_RECEIPT_TYPE, receipt, key)
    with path.open("x", encoding="utf-8") as fh:
        fh.write(json.dumps(envelope, indent=2, sort_keys=True) + "\n")
    click.echo(f"receipt: {path}", err=True)


# Each command takes the options of its decorators as keyword arguments:
# _common (ledger_url, subject, purpose, epsilon_text, idempotency_key, data_path,
# column), _noise (mechanism, delta_text, calibration), _bounds (lower_text,
# upper_text, granularity_text), and MODE_OPTIONS (fedldp.cli_release_client:
# --service / --embedded and theirs).


def _dispatch(kind: str, fn_name: str, options: dict[str, Any], *required: str) -> None:
    """Ask the release service (--service / --embedded), or run the local release
    `fn_name` of fedldp.aggregator.central.releases with its `required` options."""
    from fedldp.cli_release_client import flag, run_mode

    if run_mode(kind, options):
        return
    from fedldp.aggregator.central import releases  # the local mode only

    for name in ("subject", "data_path", *required):
        if options.get(name) in (None, ""):
            raise click.UsageError(
                f"Missing option '{flag(name)}' (or ask a release service: --service ADDR "
                "or --embedded, with --dataset)"
            )
    _run(getattr(releases, fn_name), **options)


def _release_command(name: str, options: list[Any]) -> Callable[[F], F]:
    from fedldp.cli_release_client import MODE_OPTIONS

    def wrap(fn: F) -> F:
        return release.command(name)(_apply([*_common, *options, *MODE_OPTIONS])(fn))  # type: ignore[return-value]

    return wrap


@_release_command("count", _noise)
def count_cmd(**options: Any) -> None:
    """Noised count of the records."""
    _dispatch("count", "private_count", options)


@_release_command("sum", _noise + _bounds)
def sum_cmd(**options: Any) -> None:
    """Noised sum of values clipped to [lower, upper]."""
    _dispatch("sum", "private_sum", options, "lower_text", "upper_text")


@_release_command("mean", _noise + _bounds)
def mean_cmd(**options: Any) -> None:
    """Noised mean of values clipped to [lower, upper] (half the budget each to sum and count)."""
    _dispatch("mean", "private_mean", options, "lower_text", "upper_text")


def _labels(text: str | None, option: str) -> list[str] | None:
    if text is None:
        return None
    labels = [c.strip() for c in text.split(",") if c.strip()]
    if not labels:
        raise click.BadParameter("give comma-separated labels", param_hint=option)
    return labels


@_release_command(
    "choice",
    [click.option("--candidates", help="comma-separated candidate labels (local)")],
)
def choice_cmd(**options: Any) -> None:
    """The most frequent candidate, chosen with the exponential mechanism."""
    options["candidates"] = _labels(options["candidates"], "--candidates")
    _dispatch("choice", "private_choice", options, "candidates")


@_release_command(
    "histogram",
    [click.option("--domain", help="comma-separated domain values, one bin each (local)")],
)
def histogram_cmd(**options: Any) -> None:
    """Noised count of every value of a declared domain (discrete Laplace, pure epsilon)."""
    options["domain"] = _labels(options["domain"], "--domain")
    _dispatch("histogram", "private_histogram", options, "domain")


@_release_command(
    "quantile",
    [
        click.option("--quantile", "quantile_text", help="q in (0, 1), e.g. 0.5 for the median"),
        _bounds[0],
        _bounds[1],
    ],
)
def quantile_cmd(**options: Any) -> None:
    """The q-quantile of values clipped to [lower, upper] (exponential mechanism, pure epsilon)."""
    _dispatch("quantile", "private_quantile", options, "quantile_text", "lower_text", "upper_text")


def _with_mode_options(fn: F) -> F:
    """Add the --service / --embedded options (fedldp.cli_release_client.MODE_OPTIONS)."""
    from fedldp.cli_release_client import MODE_OPTIONS

    return _apply(MODE_OPTIONS)(fn)


def _plain(text: str, name: str) -> str:
    """A decimal option as the plain string the service takes ("1e-6" -> "0.000001")."""
    from decimal import Decimal, InvalidOperation

    try:
        value = Decimal(text)
    except InvalidOperation:
        raise click.BadParameter("must be a decimal number", param_hint=name) from None
    if not value.is_finite():
        raise click.BadParameter("must be finite", param_hint=name)
    return format(value, "f")


@release.command("sql")
@click.argument("query")
@click.option("--purpose", required=True, help="the purpose the budget is set for")
@click.option(
    "--epsilon", "epsilon_text", required=True, help="epsilon, split across the aggregates"
)
@click.option(
    "--delta",
    "delta_text",
    default="0",
    show_default=True,
    help="delta of the partition selection (needed when a GROUP BY column has no public domain)",
)
@click.option(
    "--key",
    "idempotency_key",
    help="idempotency key (default: derived from the query, purpose, epsilon and delta, so a "
    "retried command is never charged twice)",
)
@click.option(
    "--receipt",
    "receipt_path",
    type=click.Path(dir_okay=False),
    help="write the signed receipt here",
)
@ledger_option()
@click.option(
    "--signing-key",
    "signing_key",
    type=click.Path(exists=True, dir_okay=False),
    help="the service's Ed25519 receipt key (--embedded)",
)
@click.option("--passphrase-env", metavar="VAR", help="passphrase of an encrypted --signing-key")
@_with_mode_options
def sql_cmd(**options: Any) -> None:
    """A DP SQL release over the release service (--service ADDR or --embedded).

    One SELECT over one dataset: GROUP BY columns, COUNT(*), SUM, AVG, MEDIAN,
    QUANTILE_CONT(column, q), WHERE on declared columns; anything else is refused
    with a named reason before any budget is reserved. Laplace noise; epsilon is
    split equally across the aggregates (and the partition selection).
    """
    from fedldp.cli_release_client import run_sql

    query = options.pop("query")
    options["epsilon_text"] = _plain(options["epsilon_text"], "--epsilon")
    options["delta_text"] = _plain(options["delta_text"], "--delta")
    if not options.get("idempotency_key"):
        seed = "\0".join(
            [query, options["purpose"], options["epsilon_text"], options["delta_text"]]
        )
        options["idempotency_key"] = "sql-" + hashlib.sha256(seed.encode()).hexdigest()[:40]
    run_sql(query, options)


def _target_delta(value: float | None) -> float | None:
    """--delta of `release spend`: a finite 0 < δ < 1 (a usage error, exit 2, otherwise)."""
    if value is not None and not 0 < value < 1:  # NaN fails both comparisons
        raise click.BadParameter("must satisfy 0 < delta < 1", param_hint="--delta")
    return value


@release.command("spend")
@ledger_option()
@config_option("collector.toml to read ledger_url from")
@click.option("--subject", required=True, help="whose central budget to add up")
@click.option("--purpose", required=True, help="the purpose whose releases to compose")
@click.option(
    "--composition",
    type=click.Choice(["basic", "rdp", "pld"]),
    default="basic",
    show_default=True,
    help="basic (sum of epsilons and deltas) or a tighter accountant (rdp, pld)",
)
@click.option(
    "--delta",
    "target_delta",
    type=float,
    callback=lambda _ctx, _param, value: _target_delta(value),
    help="target delta for rdp/pld, 0 < delta < 1",
)
def spend_cmd(
    ledger_url: str | None,
    config_path: str | None,
    subject: str,
    purpose: str,
    composition: str,
    target_delta: float | None,
) -> None:
    """Composed (epsilon, delta) spent by (subject, purpose), recomputed from the ledger.

    rdp/pld compose every stored event kind; an event they cannot compose is an
    error (exit status 1), never a silent fallback to summing. Read-only: the
    ledger must exist (a mistyped path creates nothing).
    """
    from fedldp.aggregator.central.accounting import CompositionError, compose

    url = resolve_ledger_url(ledger_url, config_path)
    ledger = open_cli_ledger(url, "read", scope="central")
    try:
        spent = compose(ledger, subject, purpose, composition, target_delta=target_delta)
    except CompositionError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        ledger.close()
    if not math.isfinite(spent.epsilon):
        raise click.ClickException(
            f"the {composition} accountant gave a non-finite epsilon at delta {target_delta}; "
            "use --composition basic or another --delta"
        )
    click.echo(
        json.dumps(
            {
                "method": spent.method,
                "epsilon": spent.epsilon,
                "delta": spent.delta,
                "basic_epsilon": str(spent.basic_epsilon),
                "basic_delta": str(spent.basic_delta),
                "tight_releases": spent.tight_events,
                "basic_releases": spent.basic_events,
            },
            indent=2,
            allow_nan=False,
        )
    )
