"""`fedldp train`, `fedldp verify training` and `fedldp audit membership`.

`fedldp verify mechanism` lives in `fedldp.cli_mechanism_audit` and is attached
to the `verify` group here.

torch and Opacus are imported inside the commands, so `fedldp --help` works
without the `train` extra; a command that needs them says what to install.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import click

from fedldp.cli_common import deprecated_alias, fallback_to_alias, ledger_option
from fedldp.cli_mechanism_audit import verify_mechanism
from fedldp.cli_train_service import CONNECTION, JOB, submit_and_wait, train_status, with_options

TRAIN_EXTRA_HINT = "pip install 'fedldp[train]'"


def _need_train_extra() -> None:
    """Fail with an install hint when torch/Opacus/scikit-learn are missing."""
    missing = []
    for module in ("torch", "opacus"):
        try:
            __import__(module)
        except ModuleNotFoundError:
            missing.append(module)
    if missing:
        raise click.ClickException(
            f"this command needs {', '.join(missing)}, from the train extra: {TRAIN_EXTRA_HINT}"
        )


@click.group(name="train", invoke_without_command=True)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="train.toml (see deploy/examples/train.toml): a local run",
)
@click.option(
    "--fix-model",
    is_flag=True,
    help="replace layers DP-SGD cannot train (BatchNorm -> GroupNorm) instead of refusing",
)
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="train across this many processes (torch.distributed, gloo on CPU); same "
    "accounting, reservation and receipt as one process (a local run)",
)
@click.option("--json", "as_json", is_flag=True, help="print the receipt (or the job) as JSON")
@with_options([*CONNECTION, *JOB])
@click.pass_context
def train(
    ctx: click.Context,
    /,
    config_path: Path | None,
    fix_model: bool,
    nproc: int,
    as_json: bool,
    **job: Any,
) -> None:
    """Train a model with central DP-SGD under a budget reserved in the ledger.

    Locally (--config): the (epsilon, delta) of [budget] is reserved before the
    data is opened; a refusal reads nothing and writes nothing. The model and
    its privacy receipt, signed with [receipt] signing_key (required: without it
    the run is refused, exit 2), are written to [output] dir. With --nproc N, this process
    is rank 0 (it alone reserves, reads the data, settles and publishes) and N-1
    spawned workers train their shards of each Poisson batch. On the release
    service (--service ADDR and the job's options): the service reserves, trains
    and signs; the model and receipt are written to --out.
    """
    if ctx.invoked_subcommand is not None:
        return
    if job["service"]:
        if config_path is not None or fix_model or nproc != 1:
            raise click.UsageError(
                "--config, --fix-model and --nproc are for a local run, not --service"
            )
        submit_and_wait(job, as_json=as_json)
        return
    if config_path is None:
        raise click.UsageError(
            "Missing option '--config' (a local run) or '--service' (a job on the release service)"
        )
    from fedldp.aggregator.training.config import TrainingConfigError, load_config

    try:
        config = load_config(config_path)
    except TrainingConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    if config.receipt.signing_key is None:
        raise click.UsageError(
            f"{config_path} has no [receipt] signing_key: a local run's receipt is always "
            "signed (an unsigned one cannot be verified, as `fedldp release --receipt` needs "
            "--signing-key); make a key with `fedldp keys generate --out keys --name receipts` "
            'and set [receipt] signing_key = "keys/receipts.key". Nothing was reserved or read.'
        )
    if fix_model and not config.model.fix_model:
        config = dataclasses.replace(
            config, model=dataclasses.replace(config.model, fix_model=True)
        )
    _need_train_extra()
    import warnings

    from fedldp.aggregator.training import (
        BudgetRefusedError,
        DataError,
        DistributedError,
        OutputExistsError,
        TrainingAbortedError,
        UnsupportedModelError,
        train_private,
    )

    warnings.filterwarnings("ignore", module="opacus")
    try:
        result = train_private(config, log=lambda msg: click.echo(msg, err=True), nproc=nproc)
    except (UnsupportedModelError, OutputExistsError, DataError, DistributedError) as exc:
        raise click.ClickException(str(exc)) from exc
    except BudgetRefusedError as exc:
        raise click.ClickException(f"{exc}. Nothing was read or written.") from exc
    except TrainingAbortedError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result.receipt, indent=2, sort_keys=True))
        return
    r = result.receipt
    eps = r["privacy"]["epsilon"]
    click.echo(f"model:   {result.model_path}")
    click.echo(f"receipt: {result.receipt_path}")
    tr = r["training"]
    click.echo(
        f"steps {result.steps} ({result.stop_reason}), sigma {tr['noise_multiplier']:.6g}, "
        f"q {tr['sample_rate']:.6g}, grad-sample mode {tr['grad_sample_mode']['mode']}, "
        f"processes {tr['processes']}"
    )
    click.echo(
        f"epsilon spent {result.epsilon_spent} of {r['privacy']['epsilon_budget']} at delta "
        f"{r['privacy']['delta']} ({r['privacy']['accountant']['used']}); "
        f"prv={eps.get('prv')} rdp={eps.get('rdp')}"
    )


train.add_command(train_status)


@click.group(name="verify")
def verify() -> None:
    """Check evidence an independent reviewer can replay."""


def _trusted(paths: tuple[Path, ...]) -> dict[str, Any]:
    """Trusted receipt public keys by key id (a click error for an unreadable file)."""
    from fedldp.aggregator.central.signing import trusted_keys
    from fedldp.client.policy import KeyFileError, load_public_key

    try:
        return trusted_keys([load_public_key(p) for p in paths])
    except (KeyFileError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


def _report(checks: list[Any], ok: bool, as_json: bool, what: str) -> None:
    if as_json:
        click.echo(
            json.dumps({"ok": ok, "checks": [dataclasses.asdict(c) for c in checks]}, indent=2)
        )
    else:
        for c in checks:
            mark = "SKIP" if c.skipped else ("ok  " if c.ok else "FAIL")
            click.echo(f"{mark} {c.name}: {c.detail}")
        click.echo(f"{what} verified" if ok else f"{what} NOT verified")
    if not ok:
        raise SystemExit(1)


_ledger_option = click.option(
    "--ledger", "ledger_url", required=True, help="URL of the ledger the run was charged to"
)
_trusted_option = click.option(
    "--trusted-key",
    "trusted_key_paths",
    required=True,
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="the service's receipt public key (.pub); repeat for several",
)
_seeded_option = click.option(
    "--accept-seeded",
    is_flag=True,
    help="accept a receipt of a seeded (not-for-release) run, for tests",
)
_data_key_option = click.option(
    "--data-key",
    "data_key_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="the secret data-digest key the run used: without it the data binding is not checked",
)


def _load_data_key(path: Path | None) -> Any:
    """The secret data-digest key (None when not given); a click error when unusable."""
    if path is None:
        return None
    from fedldp.aggregator.central.datakey import DataKeyError, load_data_key

    try:
        return load_data_key(path)
    except DataKeyError as exc:
        raise click.ClickException(str(exc)) from exc


@verify.command(name="training")
@click.argument("receipt", type=click.Path(dir_okay=False, path_type=Path))
@_ledger_option
@_trusted_option
@_seeded_option
@click.option(
    "--no-data", is_flag=True, help="do not re-read the dataset (its digest is not checked)"
)
@click.option("--data-url", help="SQLAlchemy URL for a SQL source (the receipt hides its password)")
@_data_key_option
@click.option("--json", "as_json", is_flag=True, help="print the checks as JSON")
def verify_training(
    receipt: Path,
    ledger_url: str,
    trusted_key_paths: tuple[Path, ...],
    accept_seeded: bool,
    no_data: bool,
    data_url: str | None,
    data_key_path: Path | None,
    as_json: bool,
) -> None:
    """Check a signed training receipt against the ledger; replay its accountant.

    Checks the signature (a --trusted-key), the ledger row (same ledger, settled,
    same owner and amounts, same accountant inputs and digests), the model file,
    the randomness (seeded runs refused unless --accept-seeded), the accountant
    replayed on the receipt's and on the ledger's inputs, and the dataset digest.
    Exit status 0 when every check passes, 1 otherwise.
    """
    _need_train_extra()
    from fedldp.aggregator.training.receipt import ReceiptError, verify_receipt
    from fedldp.cli_common import open_cli_ledger

    trusted = _trusted(trusted_key_paths)
    with open_cli_ledger(ledger_url, "read", scope="central") as ledger:
        try:
            result = verify_receipt(
                receipt,
                trusted=trusted,
                ledger=ledger,
                accept_seeded=accept_seeded,
                check_data=not no_data,
                data_url=data_url,
                data_key=_load_data_key(data_key_path),
            )
        except ReceiptError as exc:
            raise click.ClickException(str(exc)) from exc
    _report(result.checks, result.ok, as_json, "receipt")


@verify.command(name="release")
@click.argument("receipt", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_ledger_option
@_trusted_option
@_seeded_option
@click.option(
    "--data",
    "data_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="the released data file, to check it against the receipt's keyed digest",
)
@_data_key_option
@click.option("--json", "as_json", is_flag=True, help="print the checks as JSON")
def verify_release(
    receipt: Path,
    ledger_url: str,
    trusted_key_paths: tuple[Path, ...],
    accept_seeded: bool,
    data_path: Path | None,
    data_key_path: Path | None,
    as_json: bool,
) -> None:
    """Check a signed central-release receipt against the ledger; replay its accountant.

    Exit status 0 when every check passes, 1 otherwise.
    """
    from fedldp.aggregator.central.receipts import ReleaseReceiptError, verify_release_receipt
    from fedldp.cli_common import open_cli_ledger

    trusted = _trusted(trusted_key_paths)
    with open_cli_ledger(ledger_url, "read", scope="central") as ledger:
        try:
            result = verify_release_receipt(
                receipt,
                trusted=trusted,
                ledger=ledger,
                accept_seeded=accept_seeded,
                data_path=data_path,
                data_key=_load_data_key(data_key_path),
            )
        except ReleaseReceiptError as exc:
            raise click.ClickException(str(exc)) from exc
    _report(result.checks, result.ok, as_json, "release receipt")


verify.add_command(verify_mechanism)


def _check_members(dataset: dict[str, Any], digest: str, key: Any) -> None:
    """The audited rows are the trained ones when the receipt's keyed digest can be checked
    (with --data-key); otherwise say on stderr that they were not checked."""
    if key is None or dataset.get("digest") is None:
        click.echo(
            "warning: the training data was not checked against the receipt "
            "(needs --data-key and a receipt with a data binding)",
            err=True,
        )
        return
    if not key.matches("dataset", digest, dataset["digest"]):
        raise click.ClickException("the training data no longer matches the receipt's digest")


@click.group(name="audit")
def audit() -> None:
    """Empirical privacy audits of trained models."""


@audit.command(name="membership")
@click.option(
    "--receipt",
    "receipt_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="the private model's receipt (model and training data are found through it)",
)
@click.option(
    "--holdout",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="CSV/Parquet rows of the same population that were NOT trained on",
)
@click.option(
    "--baseline/--no-baseline",
    default=True,
    help="also train (in memory, never saved) a non-private model of the same architecture "
    "with the same hyperparameters, and attack it",
)
@click.option(
    "--baseline-epochs",
    type=click.IntRange(min=1),
    help="train the baseline this many epochs instead of the private run's (e.g. to overfit)",
)
@click.option(
    "--baseline-batch",
    type=click.IntRange(min=1),
    help="baseline batch size instead of the private run's expected batch size",
)
@click.option(
    "--baseline-lr",
    type=click.FloatRange(min=0, min_open=True),
    help="baseline learning rate instead of the private run's",
)
@click.option("--fpr", "fprs", multiple=True, type=float, help="FPRs to report TPR at")
@click.option("--seed", default=0, show_default=True, help="split/subsample seed of the audit")
@click.option("--data-url", help="SQLAlchemy URL for a SQL training source")
@_data_key_option
@click.option(
    "--out",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    callback=fallback_to_alias,
    help="also write the results as JSON to this file",
)
@deprecated_alias("--json", "--out", "json_path")
def audit_membership(
    receipt_path: Path,
    holdout: Path,
    baseline: bool,
    baseline_epochs: int | None,
    baseline_batch: int | None,
    baseline_lr: float | None,
    fprs: tuple[float, ...],
    seed: int,
    data_url: str | None,
    data_key_path: Path | None,
    json_path: Path | None,
) -> None:
    """Membership-inference attacks (loss threshold, offline LiRA) beside the (eps, delta) bound.

    The audit reads the private training rows; its figures are for the operator
    and are not themselves differentially private.
    """
    _need_train_extra()
    import warnings

    from fedldp.aggregator.training.audit import DEFAULT_FPRS, format_report, membership_audit

    warnings.filterwarnings("ignore", module="opacus")
    for f in fprs:
        if not 0 < f < 1:
            raise click.ClickException("--fpr values must be in (0, 1)")
    receipt, private, members, held = _audit_inputs(receipt_path, holdout, data_url, data_key_path)
    eps = float(receipt["privacy"]["epsilon"][receipt["privacy"]["accountant"]["used"]])
    delta = float(receipt["privacy"]["delta"])
    chosen = tuple(fprs) or DEFAULT_FPRS
    reports = [
        membership_audit(
            private,
            (members.features, members.labels),
            (held.features, held.labels),
            name="private (DP-SGD)",
            epsilon=eps,
            delta=delta,
            fprs=chosen,
            seed=seed,
        )
    ]
    if baseline:
        tr = receipt["training"]
        model = _baseline_model(
            receipt, members, seed, baseline_epochs, baseline_batch, baseline_lr
        )
        reports.append(
            membership_audit(
                model,
                (members.features, members.labels),
                (held.features, held.labels),
                name="non-private baseline (same architecture"
                + (
                    ", same hyperparameters)"
                    if not (baseline_epochs or baseline_batch or baseline_lr)
                    else f", {baseline_epochs or tr['epochs']} epochs, batch "
                    f"{baseline_batch or round(float(tr['expected_batch_size']))}, lr "
                    f"{baseline_lr or tr['learning_rate']})"
                ),
                epsilon=math.inf,
                delta=0.0,
                fprs=chosen,
                seed=seed,
            )
        )
    for rep in reports:
        click.echo(format_report(rep))
    if json_path is not None:
        payload: dict[str, Any] = {
            "receipt": str(receipt_path),
            "audits": [r.to_json() for r in reports],
        }
        json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        click.echo(f"wrote {json_path}")


def _audit_inputs(
    receipt_path: Path, holdout: Path, data_url: str | None, data_key_path: Path | None
) -> tuple[dict[str, Any], Any, Any, Any]:
    """The receipt, the private model, its training rows (checked against the receipt's
    keyed data digest) and the held-out rows; a ClickException on a receipt or data
    error."""
    from fedldp.aggregator.training.config import DataConfig
    from fedldp.aggregator.training.data import DataError, load_dataset
    from fedldp.aggregator.training.receipt import (
        ReceiptError,
        data_config_from_receipt,
        load_receipt,
        load_trained_model,
    )

    try:
        receipt = load_receipt(receipt_path)
        private = load_trained_model(receipt_path)
        members = load_dataset(data_config_from_receipt(receipt, data_url=data_url))
        _check_members(receipt["dataset"], members.digest, _load_data_key(data_key_path))
        ds = receipt["dataset"]
        held = load_dataset(
            DataConfig(
                source="parquet" if holdout.suffix == ".parquet" else "csv",
                label=ds["label"],
                privacy_unit=receipt["privacy"]["unit"],
                path=str(holdout.resolve()),
                features=tuple(ds["features"]),
            )
        )
    except (ReceiptError, DataError) as exc:
        raise click.ClickException(str(exc)) from exc
    return receipt, private, members, held


def _baseline_model(
    receipt: dict[str, Any],
    members: Any,
    seed: int,
    epochs: int | None,
    batch: int | None,
    learning_rate: float | None,
) -> Any:
    """A non-private model of the receipt's architecture trained (in memory) on the
    members with the private run's hyperparameters, or the overrides given; seeded."""
    import torch

    from fedldp.aggregator.training.config import ModelConfig
    from fedldp.aggregator.training.engine import train_nonprivate_baseline
    from fedldp.aggregator.training.models import build_mlp, validate_model

    desc, tr = receipt["model"], receipt["training"]
    model: torch.nn.Module = build_mlp(
        ModelConfig(
            hidden=tuple(desc["hidden"]),
            activation=desc["activation"],
            norm=desc["norm"],
            fix_model=bool(desc["fixed"]),
        ),
        desc["num_features"],
        desc["num_classes"],
    )
    if desc["fixed"]:
        model = validate_model(model, fix=True).module
    gen = torch.Generator().manual_seed(seed)
    train_nonprivate_baseline(
        model,
        members.features,
        members.labels,
        epochs=epochs or int(tr["epochs"]),
        batch_size=batch or max(1, round(float(tr["expected_batch_size"]))),
        learning_rate=learning_rate or float(tr["learning_rate"]),
        optimizer=str(tr["optimizer"]),
        momentum=float(tr["momentum"]),
        generator=gen,
    )
    return model


# --- `fedldp ledger reservations` and `fedldp ledger settle-stale` (attached to the
# `ledger` group in cli_collector.py) ---

_RESERVATION_STATES = ("open", "stale", "settled", "cancelled")


def _ledger_url_of(url: str | None, config_path: str | None) -> str:
    from fedldp.cli_common import resolve_ledger_url

    return resolve_ledger_url(url, config_path)


def _age(seconds: int) -> str:
    """A short human duration: 42s, 17m, 5h, 3d."""
    s = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _state(res: Any, now: int) -> str:
    if res.status == "reserved":
        return "stale" if res.stale(now) else "open"
    return str(res.status)


def _reservation_row(res: Any, now: int) -> dict[str, Any]:
    return {
        "id": res.id,
        "state": _state(res, now),
        "subject": res.subject,
        "purpose": res.purpose,
        "kind": res.metadata.get("kind"),
        "age_seconds": now - res.created_at,
        "epsilon_reserved": str(res.epsilon),
        "delta_reserved": str(res.delta),
        "epsilon_spent": None if res.epsilon_spent is None else str(res.epsilon_spent),
        "delta_spent": None if res.delta_spent is None else str(res.delta_spent),
        "data_opened": res.data_opened_at is not None,
        "lease_expires_at": res.lease_expires_at,
        "closed_at": res.closed_at,
        "reason": res.close_reason,
    }


@click.command(name="reservations")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(_RESERVATION_STATES),
    help="only these states (repeat; default: all). stale = open with its lease expired",
)
@click.option("--subject", help="only this subject")
@ledger_option(envvar="FEDLDP_COLLECTOR_LEDGER_URL", dest="url")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="collector.toml to read ledger_url from",
)
@click.option(
    "--now",
    type=click.IntRange(min=0),
    help="the time to judge leases at (Unix seconds; default: now)",
)
@click.option("--json", "as_json", is_flag=True, help="one JSON object per reservation")
def ledger_reservations(
    states: tuple[str, ...],
    subject: str | None,
    url: str | None,
    config_path: str | None,
    now: int | None,
    as_json: bool,
) -> None:
    """List central reservations: open, stale (lease expired), settled, cancelled.

    An open or stale reservation is charged in full until it is settled; a stale one
    (its run crashed or was killed) is settled by `fedldp ledger settle-stale`.
    """
    import time

    from fedldp.cli_common import open_cli_ledger

    now = int(time.time()) if now is None else now
    with open_cli_ledger(_ledger_url_of(url, config_path), "read", scope="central") as led:
        rows = [_reservation_row(r, now) for r in led.all_reservations()]
    rows = [
        r
        for r in rows
        if (not states or r["state"] in states) and (subject is None or r["subject"] == subject)
    ]
    if as_json:
        for r in rows:
            click.echo(json.dumps(r, sort_keys=True))
        return
    if not rows:
        click.echo("no reservations")
        return
    click.echo(
        f"{'reservation':<32} {'state':<9} {'age':>5} {'eps':>8} {'delta':>8} "
        f"{'spent':>14} {'data':<6} subject/purpose"
    )
    for r in rows:
        spent = r["epsilon_spent"] if r["epsilon_spent"] is not None else "-"
        click.echo(
            f"{r['id']:<32} {r['state']:<9} {_age(r['age_seconds']):>5} "
            f"{r['epsilon_reserved']:>8} {r['delta_reserved']:>8} {spent:>14} "
            f"{'opened' if r['data_opened'] else '-':<6} {r['subject']}/{r['purpose']}"
        )
    charged = [r for r in rows if r["state"] in ("open", "stale")]
    if charged:
        click.echo(
            f"{len(charged)} open reservation(s) charged in full until settled; "
            f"{sum(r['state'] == 'stale' for r in charged)} stale"
        )


@click.command(name="settle-stale")
@click.argument("reservation_id")
@click.option(
    "--now",
    type=click.IntRange(min=0),
    help="the time to judge leases at (Unix seconds; default: now)",
)
@click.option("--note", default="", help="why (kept in the reservation's log)")
@ledger_option(envvar="FEDLDP_COLLECTOR_LEDGER_URL", dest="url")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="collector.toml to read ledger_url from",
)
def ledger_settle_stale(
    reservation_id: str, note: str, url: str | None, config_path: str | None, now: int | None
) -> None:
    """Settle a STALE reservation AS SPENT (the full reserved amount; never a refund).

    Refused while its run's lease is live. The action is logged as an event of the
    reservation (settled_stale, with --note).
    """
    import time

    from fedldp.cli_common import open_cli_ledger
    from fedldp.collector.ledger import LedgerError

    with open_cli_ledger(_ledger_url_of(url, config_path), "write", scope="central") as led:
        try:
            stamp = int(time.time()) if now is None else now
            res = led.settle_stale(reservation_id, now=stamp, note=note)
        except (LedgerError, KeyError) as exc:
            raise click.ClickException(str(exc).strip("\"'")) from None
    click.echo(
        f"reservation {res.id} settled as spent: eps={res.epsilon_spent} "
        f"delta={res.delta_spent} ({res.subject}/{res.purpose})"
    )
