"""`fedldp verify mechanism`: the black-box ε auditor on registered mechanisms.

The audit itself is `fedldp.aggregator.audit_ldp`; this module parses the
options, runs one audit per (mechanism, ε) and prints a table or JSON. Exit
status 1 when any audit fails (a lower bound above the claim, or a law
mismatch), 0 otherwise; bad input is a one-line `Error: ...` with exit status 2
(nothing is audited).
"""

from __future__ import annotations

import json
import time
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from fedldp.aggregator.audit_ldp import AuditReport, AuditSettings, MechanismSpec


class InputError(click.ClickException):
    """Bad input: one `Error: ...` line, exit status 2 (1 means an audit failed)."""

    exit_code = 2


class _OneLineErrors(click.Command):
    """Report option errors as one `Error: ...` line, without the usage text."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            raise InputError(exc.format_message()) from None


def _decimal(text: str, what: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise InputError(f"{what} must be a decimal number, got {text!r}") from None
    if not value.is_finite():
        raise InputError(f"{what} must be finite, got {text!r}")
    return value


def _epsilons(texts: tuple[str, ...]) -> list[Decimal]:
    values = [_decimal(part, "--epsilon") for text in texts for part in text.split(",")]
    for value in values:
        if value <= 0:
            raise InputError(f"--epsilon must be positive, got {value}")
    return list(dict.fromkeys(values))


def _params(texts: tuple[str, ...]) -> dict[str, str]:
    params: dict[str, str] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not name or not value:
            raise InputError(f"--param must be NAME=VALUE, got {text!r}")
        params[name] = value
    return params


def _permanent(text: str, epsilon: Decimal) -> Decimal:
    """ε∞ from '2x' (a multiple of ε) or an absolute decimal."""
    if text.endswith("x"):
        return _decimal(text[:-1], "--epsilon-permanent multiple") * epsilon
    return _decimal(text, "--epsilon-permanent")


def _specs(
    mechanisms: list[str],
    epsilons: list[Decimal],
    k: int,
    numeric_range: tuple[Decimal, Decimal],
    params: dict[str, str],
    permanent: str,
    max_bytes: int,
) -> list[MechanismSpec]:
    from fedldp.aggregator.audit_ldp import resolve_spec
    from fedldp.client.mechanisms import OpenDomain

    specs = []
    for wire_id in mechanisms:
        for eps in epsilons:
            try:
                specs.append(
                    resolve_spec(
                        wire_id,
                        eps,
                        k,
                        numeric_range,
                        params,
                        _permanent(permanent, eps),
                        OpenDomain(max_bytes),
                    )
                )
            except ValueError as exc:
                raise InputError(str(exc)) from None
    return specs


def _domain(spec: MechanismSpec) -> str:
    from fedldp.client.mechanisms import OpenDomain

    if isinstance(spec.domain, int):
        return f"k={spec.domain}"
    if isinstance(spec.domain, tuple):
        return f"[{spec.domain[0]}, {spec.domain[1]}]"
    if isinstance(spec.domain, OpenDomain):
        return f"max_bytes={spec.domain.max_bytes}"
    return " + ".join(  # a multi-attribute metric: its attributes
        f"{a.name}:{a.mechanism_id} "
        + (f"k={len(a.labels)}" if a.labels is not None else f"{list(map(str, a.metric))}")  # type: ignore[arg-type]
        for a in spec.domain.attributes
    )


def _params_text(spec: MechanismSpec) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(spec.params.items()))


def _bound(report: AuditReport, path: str, paths: tuple[str, ...], sequences: bool = False) -> str:
    if path not in paths or not any(
        e.path == path and e.sequences == sequences for e in report.events
    ):
        return "-"
    return f"{report.epsilon_lb(path, sequences):.3f}"


def _table(rows: list[tuple[MechanismSpec, AuditReport]], paths: tuple[str, ...]) -> str:
    header = (
        "| mechanism | domain | params | ε | T | claimed (charge for T) | "
        "lower bound, device | lower bound, batch | sequences, device | sequences, batch | "
        "law | time (s) | verdict |"
    )
    lines = [header, "|" + "---|" * 13]
    for spec, report in rows:
        law = "ok" if report.law_passed else "MISMATCH"
        if not report.laws:
            law = "-"
        lines.append(
            f"| {spec.wire_id} | {_domain(spec)} | {_params_text(spec) or '-'} | {spec.epsilon} "
            f"| {report.reports} | {report.claim} | {_bound(report, 'device', paths)} "
            f"| {_bound(report, 'batch', paths)} | {_bound(report, 'device', paths, True)} "
            f"| {_bound(report, 'batch', paths, True)} | {law} | {report.wall_s:.1f} "
            f"| {'PASS' if report.passed else 'FAIL'} |"
        )
    return "\n".join(lines)


def _as_json(spec: MechanismSpec, report: AuditReport, settings: AuditSettings) -> dict[str, Any]:
    best = report.best_event()
    return {
        "mechanism": spec.wire_id,
        "domain": _json_domain(spec),
        "params": dict(spec.params),
        "epsilon": str(spec.epsilon),
        "reports": report.reports,
        "claim": str(report.claim),
        "epsilon_lb": {p: report.epsilon_lb(p, sequences=False) for p in settings.paths},
        "sequences_epsilon_lb": {
            p: report.epsilon_lb(p, sequences=True)
            for p in settings.paths
            if report.has_sequences(p)
        },
        "best_event": None
        if best is None
        else {
            "path": best.path,
            "pair": list(best.pair),
            "feature": best.feature,
            "hits": best.hits,
            "misses": best.misses,
            "n": best.n,
            "epsilon_lb": best.epsilon_lb,
            "sequences": best.sequences,
        },
        "law_checks": len(report.laws),
        "law_mismatches": [
            {"path": law.path, "input": law.input, "test": law.test, "p_value": law.p_value}
            for law in report.laws
            if not law.passed
        ],
        "alpha": report.alpha,
        "tests": report.tests,
        "notes": list(report.notes),
        "wall_s": round(report.wall_s, 3),
        "passed": report.passed,
    }


def _json_domain(spec: MechanismSpec) -> Any:
    from fedldp.client.mechanisms import OpenDomain

    if isinstance(spec.domain, int):
        return spec.domain
    if isinstance(spec.domain, tuple):
        return [str(x) for x in spec.domain]
    if isinstance(spec.domain, OpenDomain):
        return {"max_bytes": spec.domain.max_bytes}
    return _domain(spec)


@click.command(name="mechanism", cls=_OneLineErrors)
@click.option("--mechanism", "-m", "mechanisms", multiple=True, help="wire id (repeatable)")
@click.option("--all", "all_", is_flag=True, help="every registered mechanism")
@click.option(
    "--epsilon",
    "-e",
    "epsilon_texts",
    multiple=True,
    default=("1",),
    show_default=True,
    help="ε per report; repeatable or comma-separated, e.g. 0.5,1,2,4",
)
@click.option(
    "--k",
    "k",
    type=click.IntRange(min=2),
    default=16,
    show_default=True,
    help="domain size of the frequency mechanisms",
)
@click.option(
    "--range",
    "range_texts",
    nargs=2,
    default=("0", "1"),
    show_default=True,
    metavar="LO HI",
    help="numeric range of the numeric mechanisms",
)
@click.option(
    "--max-bytes",
    "max_bytes",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="longest string (UTF-8 bytes) of the open-domain mechanisms",
)
@click.option("--param", "param_texts", multiple=True, metavar="NAME=VALUE", help="policy param")
@click.option(
    "--epsilon-permanent",
    default="2x",
    show_default=True,
    help="ε∞ of memoized mechanisms: a decimal, or a multiple of ε such as 2x",
)
@click.option(
    "--samples",
    type=click.IntRange(min=2),
    default=None,
    help="reports per input on the batch path (half choose events, half bound them)"
    "  [default: 400000]",
)
@click.option(
    "--device-samples",
    type=click.IntRange(min=2),
    default=None,
    help="reports per input on the device path (OS CSPRNG)  [default: 40000]",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0.5, 1.0, min_open=True, max_open=True),
    default=1 - 1e-6,
    show_default=True,
    help="confidence of each audit's bounds and verdict (Bonferroni inside)",
)
@click.option(
    "--reports",
    type=click.IntRange(1, 8),
    default=2,
    show_default=True,
    help="T: reports per user for memoized mechanisms (of one value, and the sequences "
    "of the longitudinal test)",
)
@click.option(
    "--sequences/--no-sequences",
    default=True,
    show_default=True,
    help="run the longitudinal test on memoized mechanisms: two sequences of T values, "
    "changed or not, against the charge for T reports",
)
@click.option(
    "--path",
    "path_choice",
    type=click.Choice(["device", "batch", "both"]),
    default="both",
    show_default=True,
    help="audit the device randomizer, the batch simulation path, or both",
)
@click.option("--seed", type=int, default=None, help="batch path seed (default: fresh entropy)")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people, json for programs",
)
def verify_mechanism(
    mechanisms: tuple[str, ...],
    all_: bool,
    epsilon_texts: tuple[str, ...],
    k: int,
    range_texts: tuple[str, str],
    max_bytes: int,
    param_texts: tuple[str, ...],
    epsilon_permanent: str,
    samples: int | None,
    device_samples: int | None,
    confidence: float,
    reports: int,
    sequences: bool,
    path_choice: str,
    seed: int | None,
    output_format: str,
) -> None:
    """Audit mechanisms black-box: Clopper–Pearson lower bounds on ε from the shipped
    randomizer (device path with the OS CSPRNG, and batch path) on neighbouring inputs,
    and checks of its output law. Memoized mechanisms are also audited on two
    sequences of T values, changed or not (the longitudinal test). Exit status 1 when
    any audit fails.
    """
    from fedldp.aggregator.audit_ldp import (
        DEFAULT_DEVICE_SAMPLES,
        DEFAULT_SAMPLES,
        AuditSettings,
        audit_spec,
    )
    from fedldp.client.mechanisms import registered_ids

    if all_ and mechanisms:
        raise InputError("give --mechanism ID (repeatable) or --all, not both")
    if not all_ and not mechanisms:
        raise InputError("give --mechanism ID (repeatable) or --all (every registered mechanism)")
    lo, hi = (_decimal(t, "--range") for t in range_texts)
    paths = ("device", "batch") if path_choice == "both" else (path_choice,)
    try:
        settings = AuditSettings(
            samples=samples or DEFAULT_SAMPLES,
            device_samples=device_samples or DEFAULT_DEVICE_SAMPLES,
            alpha=1.0 - confidence,
            reports=reports,
            paths=paths,
            seed=seed,
            sequences=sequences,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None
    specs = _specs(
        list(registered_ids()) if all_ else list(mechanisms),
        _epsilons(epsilon_texts),
        k,
        (lo, hi),
        _params(param_texts),
        epsilon_permanent,
        max_bytes,
    )
    rows = []
    started = time.perf_counter()
    for spec in specs:
        try:
            rows.append((spec, audit_spec(spec, settings)))
        except ValueError as exc:
            raise InputError(f"{spec.wire_id} at ε={spec.epsilon}: {exc}") from None
    if output_format == "json":
        click.echo(json.dumps([_as_json(s, r, settings) for s, r in rows], indent=2))
    else:
        click.echo(_table(rows, paths))
        click.echo(
            f"confidence {confidence} per audit (Bonferroni over its tests); reports per input: "
            f"batch {settings.samples}, device {settings.device_samples}; "
            f"total {time.perf_counter() - started:.1f} s"
        )
        notes = {f"{s.wire_id}: {note}" for s, r in rows for note in r.notes}
        for note in sorted(notes):
            click.echo(f"note: {note}")
    if not all(r.passed for _, r in rows):
        raise SystemExit(1)
