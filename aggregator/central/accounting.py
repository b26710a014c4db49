"""Composition of central releases per (subject, purpose), from the ledger alone.

* ``basic``: Σε, Σδ over every reservation that is reserved or settled
  (`Ledger.central_spend`), exact decimals. Always available; it is what the
  ledger enforces against the cap.
* ``rdp``: Rényi-DP composition (Mironov 2017) with Google's dp-accounting
  `RdpAccountant`, for the Gaussian-type events: central discrete-Gaussian
  releases (recorded as ``{"kind": "discrete_gaussian", "noise_multiplier":
  σ/Δ}`` in lattice units; CKS20 Theorem 4: the discrete Gaussian satisfies the
  same ½(Δ/σ)² concentrated DP, hence the same RDP curve, as the continuous
  one) and DP-SGD runs (``{"kind": "gaussian", "noise_multiplier", "sample_rate",
  "steps"}``, Poisson-subsampled Gaussian).
* ``pld``: privacy-loss-distribution composition (dp-accounting
  `PLDAccountant`) for the continuous Gaussian events (DP-SGD). Discrete
  Gaussian releases are composed by basic composition in this mode: the PLD of
  the continuous Gaussian is not proven to dominate the discrete one.

Every other settled reservation (Laplace, exponential mechanism, unknown event
kinds, reservations without events) and every open reservation is added by
basic composition with its settled (or reserved) amounts. The tight group is
evaluated at δ_target = the sum of its own spent δ (or a δ you pass), and the
tight ε is used only if it beats basic composition of the same group. Since
(ε₁, δ₁) and (ε₂, δ₂) compose basically, the total (ε_tight + ε_rest,
δ_target + δ_rest) is a valid guarantee.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol


class Composition(str, enum.Enum):
    """Composition method."""

    BASIC = "basic"
    RDP = "rdp"
    PLD = "pld"


class AccountingLedger(Protocol):
    """What composition reads from the ledger."""

    def central_spend(self, subject: str, purpose: str) -> tuple[Decimal, Decimal]: ...

    def reservations(self, subject: str, purpose: str | None = None) -> Sequence[Any]: ...

    def central_events(self, subject: str, purpose: str) -> Sequence[Any]: ...


@dataclass(frozen=True)
class ComposedSpend:
    """The composed (ε, δ) of (subject, purpose) and how it was obtained."""

    method: str
    epsilon: float
    delta: float
    basic_epsilon: Decimal
    basic_delta: Decimal
    tight_events: int
    basic_events: int


def _dp_event(event: Mapping[str, object], method: Composition) -> Any | None:
    """The dp-accounting event for a stored event, or None if it composes basically."""
    import dp_accounting

    kind = event.get("kind")
    try:
        nm = float(str(event.get("noise_multiplier")))
    except ValueError:
        return None
    if kind == "discrete_gaussian" and method is Composition.RDP:
        return dp_accounting.GaussianDpEvent(nm)
    if kind == "gaussian":
        gaussian = dp_accounting.GaussianDpEvent(nm)
        rate = event.get("sample_rate")
        steps = int(str(event.get("steps", 1)))
        inner: Any = gaussian
        if rate is not None and float(str(rate)) < 1.0:
            inner = dp_accounting.PoissonSampledDpEvent(float(str(rate)), gaussian)
        return dp_accounting.SelfComposedDpEvent(inner, steps) if steps != 1 else inner
    return None


def compose(
    ledger: AccountingLedger,
    subject: str,
    purpose: str,
    method: Composition | str = Composition.BASIC,
    *,
    target_delta: float | None = None,
) -> ComposedSpend:
    """The composed (ε, δ) spent by (subject, purpose), recomputed from the ledger."""
    m = Composition(method)
    basic_eps, basic_delta = ledger.central_spend(subject, purpose)
    if m is Composition.BASIC:
        return ComposedSpend(
            m.value,
            float(basic_eps),
            float(basic_delta),
            basic_eps,
            basic_delta,
            0,
            len(ledger.reservations(subject, purpose)),
        )
    # Group settled reservations: all of their events tight-composable -> tight group.
    events_by_res: dict[str, list[Mapping[str, object]]] = {}
    for ev in ledger.central_events(subject, purpose):
        events_by_res.setdefault(ev.reservation_id, []).append(ev.event)
    tight: list[Any] = []
    tight_eps = Decimal(0)
    tight_delta = Decimal(0)
    rest_eps = Decimal(0)
    rest_delta = Decimal(0)
    n_tight = n_rest = 0
    for res in ledger.reservations(subject, purpose):
        if res.status == "cancelled":
            continue
        if res.status != "settled":  # in flight: count what is reserved
            rest_eps += res.epsilon
            rest_delta += res.delta
            n_rest += 1
            continue
        converted = [_dp_event(e, m) for e in events_by_res.get(res.id, [])]
        if converted and all(c is not None for c in converted):
            tight.extend(converted)
            tight_eps += res.epsilon_spent
            tight_delta += res.delta_spent
            n_tight += 1
        else:
            rest_eps += res.epsilon_spent
            rest_delta += res.delta_spent
            n_rest += 1
    eps_tight = float(tight_eps)
    delta_tight = float(tight_delta) if target_delta is None else float(target_delta)
    if tight and delta_tight > 0:
        import dp_accounting
        from dp_accounting import pld, rdp

        accountant: Any = rdp.RdpAccountant() if m is Composition.RDP else pld.PLDAccountant()
        accountant.compose(dp_accounting.ComposedDpEvent(tight))
        eps_accountant = float(accountant.get_epsilon(delta_tight))
        # Basic composition of the group holds at its own Σδ; use it only if δ_target ≥ Σδ.
        eps_tight = (
            min(eps_tight, eps_accountant) if delta_tight >= float(tight_delta) else eps_accountant
        )
    elif not tight:
        delta_tight = 0.0
    return ComposedSpend(
        m.value,
        eps_tight + float(rest_eps),
        delta_tight + float(rest_delta),
        basic_eps,
        basic_delta,
        n_tight,
        n_rest,
    )
