"""The privacy plan of a run, fixed before the first step: σ, the step limit, the spend.

From the configuration alone (never from the data): the sample rate q, the
planned steps, σ calibrated to the budget (accounting.calibrate_noise) or given,
and the step limit — the largest T ≤ planned with ε(σ, q, T) ≤ budget. A
multi-process run uses the same plan (the global q and steps; engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from fedldp.aggregator.training.accounting import (
    AccountantError,
    BudgetAccountant,
    calibrate_noise,
    epsilon,
)
from fedldp.aggregator.training.config import TrainConfig

# ε is charged to the ledger rounded up to this quantum (never below the bound).
SPEND_QUANTUM = Decimal("1e-12")


@dataclass
class Plan:
    """The accountant in force, σ, and the step limit that keeps ε within the budget."""

    mechanism: str
    noise_multiplier: float
    calibrated: bool
    accountant: BudgetAccountant
    step_limit: int
    fallback_reason: str | None


def _plan(config: TrainConfig, *, sample_rate: float, planned_steps: int, mechanism: str) -> Plan:
    budget = config.budget
    delta = float(budget.delta)
    sigma = config.training.noise_multiplier
    calibrated = sigma is None
    eps_planned: float | None = None
    if sigma is None:
        sigma, eps_planned = calibrate_noise(
            mechanism,
            target_epsilon=float(budget.epsilon),
            delta=delta,
            sample_rate=sample_rate,
            steps=planned_steps,
            eps_error=config.accountant.eps_error,
        )
    acct = BudgetAccountant(
        mechanism=mechanism,
        delta=delta,
        budget=budget.epsilon,
        sample_rate=sample_rate,
        noise_multiplier=sigma,
        eps_error=config.accountant.eps_error,
    )
    if eps_planned is not None:
        acct.remember(planned_steps, eps_planned)
    limit = acct.step_limit(planned_steps)
    acct.horizon = limit
    return Plan(mechanism, sigma, calibrated, acct, limit, None)


def plan_with_fallback(config: TrainConfig, *, sample_rate: float, planned_steps: int) -> Plan:
    """Calibrate and compute the step limit with the configured accountant; if PRV
    fails and fallback_to_rdp is set, redo both with RDP and record why."""
    try:
        return _plan(
            config,
            sample_rate=sample_rate,
            planned_steps=planned_steps,
            mechanism=config.accountant.kind,
        )
    except AccountantError as exc:
        if not config.accountant.fallback_to_rdp:
            raise
        plan = _plan(config, sample_rate=sample_rate, planned_steps=planned_steps, mechanism="rdp")
        plan.fallback_reason = str(exc)
        return plan


def spend_of(eps: float, budget: Decimal) -> Decimal:
    """ε as charged: rounded up to SPEND_QUANTUM, never above the reservation."""
    exact = Decimal(eps)
    if exact > budget:  # the caller certified eps ≤ budget; refuse to charge otherwise
        raise AccountantError("final epsilon exceeds the reservation")
    return min(exact.quantize(SPEND_QUANTUM, rounding=ROUND_CEILING), budget)


def other_epsilons(
    history: list[tuple[float, float, int]], delta: float, eps_error: float, skip: str
) -> dict[str, Any]:
    """ε at δ of `history` under each accountant but `skip` (None + `<name>_error` when
    one fails), for the receipt."""
    out: dict[str, Any] = {}
    for mech in ("prv", "rdp"):
        if mech == skip:
            continue
        try:
            out[mech] = epsilon(mech, history, delta, eps_error=eps_error)
        except AccountantError as exc:
            out[mech] = None
            out[f"{mech}_error"] = str(exc)
    return out
