"""Composition of central releases and training runs per (subject, purpose), from the ledger.

* ``basic``: Σε, Σδ over every reservation that is reserved or settled
  (`Ledger.central_spend`), exact decimals. Always available; it is what the
  ledger enforces against the cap.
* ``rdp``: Rényi-DP composition (Mironov 2017) with Google's dp-accounting
  `RdpAccountant`.
* ``pld``: privacy-loss-distribution composition (Koskela et al. 2020; Doroshenko
  et al. 2022) with dp-accounting's `PrivacyLossDistribution`, pessimistic
  estimates (an upper bound on ε), one discretization interval for all events.

Every event kind the ledger stores is composed by both (`EVENT_KINDS`):

- ``discrete_laplace`` (scale t and lattice_sensitivity Δ, lattice units): RDP
  as ½ε²-zCDP with ε = Δ/t (pure ε-DP implies it: Bun and Steinke 2016,
  Prop. 3.3); PLD `from_discrete_laplace_mechanism(1/t, Δ)`.
- ``laplace`` (scale b, sensitivity Δ): RDP `LaplaceDpEvent(b/Δ)` (Mironov
  2017, Table II); PLD `from_laplace_mechanism(b, Δ)`.
- ``discrete_gaussian`` (sigma σ, lattice_sensitivity Δ): RDP as
  Δ²/(2σ²)-zCDP (Canonne, Kamath, Steinke 2020, Thm 4); PLD
  `from_discrete_gaussian_mechanism(σ, Δ)`.
- ``gaussian`` and ``poisson_subsampled_gaussian`` (noise_multiplier z,
  sample_rate q, steps T; DP-SGD: Abadi et al. 2016, Mironov, Talwar and Zhang
  2019): RDP `GaussianDpEvent(z)`, Poisson-sampled at q when q < 1,
  self-composed T times; PLD `from_gaussian_mechanism(z, sampling_prob=q)`
  self-composed T times.
- ``exponential`` (epsilon ε; McSherry and Talwar 2007): RDP as ½ε²-zCDP (pure
  ε-DP; Bun and Steinke 2016, Prop. 3.3); PLD `from_privacy_parameters(ε, 0)`,
  the dominating pair of every ε-DP mechanism.
- ``threshold`` (epsilon ε, delta δ: DP partition selection, grouped.py): PLD
  `from_privacy_parameters(ε, δ)`; RDP refuses it (no Rényi curve for δ > 0).

Parameters are rounded toward more privacy loss when converted to floats.
An event of any other kind, or one missing a parameter, raises
CompositionError: a loud refusal, never a silent fallback to summing.

Reservations without mechanism events - settled as spent after a failure
that followed the data being opened, settled by an operator, or still open -
are charged their settled (or reserved) (ε, δ) by basic composition: nothing
is known about them but the amounts, and every mechanism composes basically.
The tight group is evaluated at δ_target = the sum of its own spent δ (or a δ
you pass), and the tight ε is used only if it beats basic composition of the
same group. Since (ε₁, δ₁) and (ε₂, δ₂) compose basically, the total (ε_tight +
ε_rest, δ_target + δ_rest) is a valid guarantee.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Protocol

#: PLD discretization of the privacy loss (dp-accounting's default).
PLD_INTERVAL = 1e-4


class Composition(str, enum.Enum):
    """Composition method."""

    BASIC = "basic"
    RDP = "rdp"
    PLD = "pld"


class CompositionError(ValueError):
    """A stored event this module cannot compose (unknown kind or missing parameter)."""


class AccountingLedger(Protocol):
    """What composition reads from the ledger."""

    def central_spend(self, subject: str, purpose: str) -> tuple[Decimal, Decimal]:
        """See `Ledger.central_spend`."""
        ...

    def reservations(self, subject: str, purpose: str | None = None) -> Sequence[Any]:
        """See `Ledger.reservations`."""
        ...

    def central_events(self, subject: str, purpose: str) -> Sequence[Any]:
        """See `Ledger.central_events`."""
        ...


@dataclass(frozen=True)
class ComposedSpend:
    """The composed (ε, δ) of (subject, purpose) and how it was obtained.

    `tight_events` counts the reservations composed by the accountant,
    `basic_events` those added by basic composition (open ones, and settled
    ones without mechanism events).
    """

    method: str
    epsilon: float
    delta: float
    basic_epsilon: Decimal
    basic_delta: Decimal
    tight_events: int
    basic_events: int


# --- reading stored parameters ---


def _param(event: Mapping[str, object], name: str) -> object:
    if name not in event:
        raise CompositionError(
            f"event of kind {event.get('kind')!r} has no {name!r}: cannot compose it"
        )
    return event[name]


def _positive(event: Mapping[str, object], name: str) -> Fraction:
    """An exact positive rational from a stored number or decimal/fraction string."""
    raw = _param(event, name)
    try:
        value = Fraction(str(raw)) if not isinstance(raw, float) else Fraction(raw)
    except (ValueError, ZeroDivisionError):
        raise CompositionError(f"event parameter {name!r} is not a number") from None
    if value <= 0:
        raise CompositionError(f"event parameter {name!r} must be positive")
    return value


def _count(event: Mapping[str, object], name: str, default: int | None = None) -> int:
    if name not in event and default is not None:
        return default
    raw = _param(event, name)
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise CompositionError(f"event parameter {name!r} must be an integer")
    try:
        value = int(raw)
    except ValueError:
        raise CompositionError(f"event parameter {name!r} must be an integer") from None
    if value < 1:
        raise CompositionError(f"event parameter {name!r} must be at least 1")
    return value


def _down(x: Fraction) -> float:
    """The largest float ≤ x (a noise scale rounded toward less noise: conservative)."""
    f = float(x)
    return f if Fraction(f) <= x else math.nextafter(f, 0.0)


def _up(x: Fraction) -> float:
    """The smallest float ≥ x (a privacy parameter rounded toward more loss: conservative)."""
    f = float(x)
    return f if Fraction(f) >= x else math.nextafter(f, math.inf)


def _sampled(event: Mapping[str, object]) -> tuple[float, float, int]:
    """(noise multiplier z, sample rate q, steps T) of a (subsampled) Gaussian event."""
    z = _down(_positive(event, "noise_multiplier"))
    q = _up(_positive(event, "sample_rate")) if "sample_rate" in event else 1.0
    if q > 1:
        raise CompositionError("event parameter 'sample_rate' must be at most 1")
    return z, q, _count(event, "steps", default=1)


# --- per kind: dp-accounting RDP events and PLDs ---


def _rdp_event(event: Mapping[str, object]) -> Any:
    import dp_accounting

    kind = event.get("kind")
    if kind == "discrete_laplace":
        eps = _positive(event, "lattice_sensitivity") / _positive(event, "scale")
        return dp_accounting.ZCDpEvent(_up(eps * eps / 2))
    if kind == "laplace":
        return dp_accounting.LaplaceDpEvent(
            _down(_positive(event, "scale") / _positive(event, "sensitivity"))
        )
    if kind == "discrete_gaussian":
        ratio = _positive(event, "lattice_sensitivity") / Fraction(_down(_positive(event, "sigma")))
        return dp_accounting.ZCDpEvent(_up(ratio * ratio / 2))
    if kind in ("gaussian", "poisson_subsampled_gaussian"):
        z, q, steps = _sampled(event)
        inner: Any = dp_accounting.GaussianDpEvent(z)
        if q < 1:
            inner = dp_accounting.PoissonSampledDpEvent(q, inner)
        return dp_accounting.SelfComposedDpEvent(inner, steps) if steps != 1 else inner
    if kind == "exponential":
        eps = _positive(event, "epsilon")
        return dp_accounting.ZCDpEvent(_up(eps * eps / 2))
    if kind == "threshold":
        raise CompositionError(
            "a partition selection (threshold) is (epsilon, delta)-DP with no Renyi "
            "curve: compose this ledger with 'pld' or 'basic'"
        )
    raise _unknown(kind)


def _pld(event: Mapping[str, object]) -> Any:
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    kind = event.get("kind")
    if kind == "discrete_laplace":
        return pld.from_discrete_laplace_mechanism(
            _up(1 / _positive(event, "scale")),
            sensitivity=_count(event, "lattice_sensitivity"),
            value_discretization_interval=PLD_INTERVAL,
        )
    if kind == "laplace":
        return pld.from_laplace_mechanism(
            _down(_positive(event, "scale")),
            sensitivity=_up(_positive(event, "sensitivity")),
            value_discretization_interval=PLD_INTERVAL,
        )
    if kind == "discrete_gaussian":
        return pld.from_discrete_gaussian_mechanism(
            _down(_positive(event, "sigma")),
            sensitivity=_count(event, "lattice_sensitivity"),
            value_discretization_interval=PLD_INTERVAL,
        )
    if kind in ("gaussian", "poisson_subsampled_gaussian"):
        z, q, steps = _sampled(event)
        one = pld.from_gaussian_mechanism(
            z, sampling_prob=q, value_discretization_interval=PLD_INTERVAL
        )
        return one.self_compose(steps) if steps != 1 else one
    if kind == "exponential":
        return pld.from_privacy_parameters(
            common.DifferentialPrivacyParameters(_up(_positive(event, "epsilon")), 0.0),
            value_discretization_interval=PLD_INTERVAL,
        )
    if kind == "threshold":  # partition selection: (ε, δ)-DP (aggregator/central/grouped.py)
        return pld.from_privacy_parameters(
            common.DifferentialPrivacyParameters(
                _up(_positive(event, "epsilon")), _up(_positive(event, "delta"))
            ),
            value_discretization_interval=PLD_INTERVAL,
        )
    raise _unknown(kind)


#: The event kinds both accountants compose.
EVENT_KINDS = (
    "discrete_laplace",
    "laplace",
    "discrete_gaussian",
    "gaussian",
    "poisson_subsampled_gaussian",
    "exponential",
    "threshold",
)


def _unknown(kind: object) -> CompositionError:
    return CompositionError(
        f"cannot compose stored event kind {kind!r} (known: {', '.join(EVENT_KINDS)}); "
        "refusing rather than falling back to summing epsilon"
    )


def events_epsilon(
    events: Sequence[Mapping[str, object]], method: Composition | str, delta: float
) -> float:
    """ε at `delta` of the composition of `events` by the RDP or PLD accountant.

    Raises CompositionError for an event it cannot compose; inf when the
    accountant has no finite ε at this δ (e.g. RDP at δ = 0).
    """
    m = Composition(method)
    if m is Composition.BASIC:
        raise ValueError("events_epsilon composes with 'rdp' or 'pld'")
    if not events:
        return 0.0
    if m is Composition.RDP:
        import dp_accounting
        from dp_accounting import rdp

        accountant = rdp.RdpAccountant()
        accountant.compose(dp_accounting.ComposedDpEvent([_rdp_event(e) for e in events]))
        return float(accountant.get_epsilon(delta)) if delta > 0 else math.inf
    plds = [_pld(e) for e in events]
    total = plds[0]
    for other in plds[1:]:
        total = total.compose(other)
    return float(total.get_epsilon_for_delta(delta))


def compose(
    ledger: AccountingLedger,
    subject: str,
    purpose: str,
    method: Composition | str = Composition.BASIC,
    *,
    target_delta: float | None = None,
) -> ComposedSpend:
    """The composed (ε, δ) spent by (subject, purpose), recomputed from the ledger.

    Raises CompositionError (module docstring) when a stored event cannot be
    composed by the chosen accountant.
    """
    m = Composition(method)
    basic_eps, basic_delta = ledger.central_spend(subject, purpose)
    reservations = ledger.reservations(subject, purpose)
    if m is Composition.BASIC:
        live = [r for r in reservations if r.status != "cancelled"]
        return ComposedSpend(
            m.value, float(basic_eps), float(basic_delta), basic_eps, basic_delta, 0, len(live)
        )
    events_by_res: dict[str, list[Mapping[str, object]]] = {}
    for ev in ledger.central_events(subject, purpose):
        events_by_res.setdefault(ev.reservation_id, []).append(ev.event)
    tight: list[Mapping[str, object]] = []
    tight_eps = tight_delta = rest_eps = rest_delta = Decimal(0)
    n_tight = n_rest = 0
    for res in reservations:
        if res.status == "cancelled":
            continue
        own = events_by_res.get(res.id, []) if res.status == "settled" else []
        if own:
            tight.extend(own)
            tight_eps += res.epsilon_spent
            tight_delta += res.delta_spent
            n_tight += 1
        elif res.status == "settled":  # charged without a mechanism record (failed after
            rest_eps += res.epsilon_spent  # reading, or settled by an operator)
            rest_delta += res.delta_spent
            n_rest += 1
        else:  # in flight: what is reserved
            rest_eps += res.epsilon
            rest_delta += res.delta
            n_rest += 1
    eps_tight, delta_tight = _tight_part(tight, m, tight_eps, tight_delta, target_delta)
    return ComposedSpend(
        m.value,
        eps_tight + float(rest_eps),
        delta_tight + float(rest_delta),
        basic_eps,
        basic_delta,
        n_tight,
        n_rest,
    )


def _tight_part(
    events: Sequence[Mapping[str, object]],
    method: Composition,
    basic_eps: Decimal,
    basic_delta: Decimal,
    target_delta: float | None,
) -> tuple[float, float]:
    """(ε, δ) of the accountant-composed group: the accountant's ε at δ_target, or the
    group's basic ε when that is smaller and valid (δ_target ≥ the group's Σδ)."""
    if not events:
        return 0.0, 0.0
    delta = float(basic_delta) if target_delta is None else float(target_delta)
    accountant_eps = events_epsilon(events, method, delta)
    if delta >= float(basic_delta):
        return min(float(basic_eps), accountant_eps), delta
    return accountant_eps, delta
