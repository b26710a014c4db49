"""Composition of every stored event kind, against golden numbers computed independently.

Each golden value comes from a closed form or an exact sum written here (the
Gaussian's δ(ε) of Balle and Wang 2018, Thm 8; exact privacy-loss sums over the
discrete Laplace / discrete Gaussian lattice; the randomized-response dominating
pair of k-fold pure ε-DP, Kairouz, Oh and Viswanath 2015), or from a different
implementation (Opacus's RDP accountant, dp-accounting's PLDAccountant). PLD
values are pessimistic: at least the exact ε, and within the discretization.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fedldp.aggregator.central.accounting import (
    EVENT_KINDS,
    CompositionError,
    compose,
    events_epsilon,
)
from fedldp.collector.ledger import Ledger, open_ledger
from scipy.optimize import brentq
from scipy.stats import norm

PLD_SLACK = 1e-3  # discretization (1e-4 per event) plus the pessimistic rounding


def _solve(delta_of: Callable[[float], float], delta: float) -> float:
    return float(brentq(lambda e: delta_of(e) - delta, 0.0, 60.0, xtol=1e-12))


def _exact_epsilon(losses: np.ndarray, probs: np.ndarray, delta: float) -> float:
    """ε at δ from a privacy-loss distribution: δ(ε) = E[(1 − e^(ε−L))₊]."""
    return _solve(lambda e: float(np.sum(probs * np.clip(1 - np.exp(e - losses), 0, None))), delta)


def _self_convolve(losses: np.ndarray, probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    table = defaultdict(float, {0.0: 1.0})
    support = [(round(float(a), 9), float(p)) for a, p in zip(losses, probs, strict=True) if p > 0]
    for _ in range(k):
        nxt: defaultdict[float, float] = defaultdict(float)
        for a, pa in table.items():
            for b, pb in support:
                nxt[round(a + b, 9)] += pa * pb
        table = nxt
    return np.array(list(table)), np.array(list(table.values()))


def test_gaussians_pld_matches_the_closed_form() -> None:
    z, k, delta = 2.0, 3, 1e-6
    sigma = z / math.sqrt(k)  # k Gaussians of multiplier z = one of z/sqrt(k)

    def gauss_delta(e: float) -> float:  # Balle and Wang 2018, Theorem 8
        return float(
            norm.cdf(-e * sigma + 1 / (2 * sigma))
            - math.exp(e) * norm.cdf(-e * sigma - 1 / (2 * sigma))
        )

    exact = _solve(gauss_delta, delta)
    got = events_epsilon([{"kind": "gaussian", "noise_multiplier": z}] * k, "pld", delta)
    assert exact - 1e-9 <= got <= exact + PLD_SLACK


def test_discrete_gaussian_pld_matches_the_exact_lattice_sum() -> None:
    sigma, sens, delta = 3.0, 2, 1e-6
    x = np.arange(-400, 401)
    p = np.exp(-(x**2) / (2 * sigma**2))
    p /= p.sum()
    losses = ((x - sens) ** 2 - x**2) / (2 * sigma**2)  # log P(x)/Q(x), Q shifted by Δ
    exact = _exact_epsilon(losses, p, delta)
    event = {"kind": "discrete_gaussian", "sigma": sigma, "lattice_sensitivity": sens}
    got = events_epsilon([event], "pld", delta)
    assert exact - 1e-9 <= got <= exact + PLD_SLACK


def test_discrete_laplace_pld_matches_the_exact_lattice_sum() -> None:
    scale, sens, k, delta = 2.5, 1, 3, 1e-3
    x = np.arange(-400, 401)
    p = np.exp(-np.abs(x) / scale)
    p /= p.sum()
    losses, probs = _self_convolve((np.abs(x - sens) - np.abs(x)) / scale, p, k)
    exact = _exact_epsilon(losses, probs, delta)
    event = {"kind": "discrete_laplace", "scale": "5/2", "lattice_sensitivity": sens}
    got = events_epsilon([event] * k, "pld", delta)
    assert exact - 1e-9 <= got <= exact + PLD_SLACK
    assert got < k * sens / scale  # tighter than summing the pure ε


def test_exponential_pld_is_optimal_composition_of_pure_dp() -> None:
    eps, k, delta = 0.1, 20, 1e-3
    p = math.exp(eps) / (1 + math.exp(eps))

    def rr_delta(e: float) -> float:  # Kairouz, Oh and Viswanath 2015: the RR dominating pair
        return sum(
            math.comb(k, j)
            * p ** (k - j)
            * (1 - p) ** j
            * max(0.0, 1 - math.exp(e - (k - 2 * j) * eps))
            for j in range(k + 1)
        )

    exact = _solve(rr_delta, delta)
    got = events_epsilon([{"kind": "exponential", "epsilon": "0.1"}] * k, "pld", delta)
    assert exact - 1e-9 <= got <= exact + PLD_SLACK and got < k * eps


def test_training_event_rdp_matches_opacus_and_pld_matches_the_pld_accountant() -> None:
    import dp_accounting
    from dp_accounting.pld import PLDAccountant
    from opacus.accountants import RDPAccountant

    z, q, steps, delta = 1.1, 0.05, 100, 1e-5
    event = {
        "kind": "poisson_subsampled_gaussian",
        "noise_multiplier": z,
        "sample_rate": q,
        "steps": steps,
    }
    opacus = RDPAccountant()
    opacus.history = [(z, q, steps)]
    # two implementations, on different grids of Rényi orders: agree to 1e-4
    assert events_epsilon([event], "rdp", delta) == pytest.approx(
        opacus.get_epsilon(delta), rel=1e-4
    )
    pld_acc = PLDAccountant()
    pld_acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    assert events_epsilon([event], "pld", delta) == pytest.approx(
        pld_acc.get_epsilon(delta), rel=1e-6
    )


def test_pure_events_rdp_is_their_zcdp_sum() -> None:
    """Discrete Laplace and exponential (pure ε-DP: ½ε²-zCDP) and discrete Gaussian
    (Δ²/2σ²): the zCDP sum ρ is the RDP curve of one Gaussian of multiplier 1/sqrt(2ρ)."""
    import dp_accounting
    from dp_accounting import rdp

    events: list[dict[str, object]] = [
        {"kind": "discrete_laplace", "scale": "4", "lattice_sensitivity": 2},  # ε = 1/2
        {"kind": "exponential", "epsilon": "0.3"},
        {"kind": "discrete_gaussian", "sigma": 5.0, "lattice_sensitivity": 1},
    ]
    rho = 0.5**2 / 2 + 0.3**2 / 2 + 1 / (2 * 25.0)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(1 / math.sqrt(2 * rho)))
    assert events_epsilon(events, "rdp", 1e-6) == pytest.approx(acc.get_epsilon(1e-6), rel=1e-9)


def test_continuous_laplace_composes_by_both() -> None:
    event = {"kind": "laplace", "scale": "2", "sensitivity": "1"}  # pure ε = 1/2
    assert events_epsilon([event], "pld", 1e-9) == pytest.approx(0.5, abs=PLD_SLACK)
    assert events_epsilon([event] * 2, "rdp", 1e-6) < 1e9


@pytest.mark.parametrize("method", ["rdp", "pld"])
@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({"kind": "sparse_vector", "epsilon": "1"}, "cannot compose stored event kind"),
        ({"kind": "gaussian"}, "has no 'noise_multiplier'"),
        ({"kind": "exponential", "epsilon": "-1"}, "must be positive"),
        ({"kind": "discrete_laplace", "scale": "x", "lattice_sensitivity": 1}, "not a number"),
    ],
)
def test_unknown_or_malformed_events_are_refused_loudly(
    method: str, event: dict[str, object], message: str
) -> None:
    with pytest.raises(CompositionError, match=message):
        events_epsilon([event], method, 1e-6)


def test_every_kind_is_listed() -> None:
    assert set(EVENT_KINDS) >= {
        "discrete_laplace",
        "discrete_gaussian",
        "exponential",
        "poisson_subsampled_gaussian",
        "gaussian",
        "laplace",
    }


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    led.set_central_cap("s", "p", epsilon_cap=Decimal(100), delta_cap=Decimal("0.1"))
    return led


def _settled(
    ledger: Ledger, key: str, eps: str, delta: str, events: list[dict[str, object]]
) -> None:
    res = ledger.reserve(
        subject="s", purpose="p", epsilon=Decimal(eps), delta=Decimal(delta),
        idempotency_key=key, now=1, owner=key,
    )  # fmt: skip
    ledger.settle(
        res.id,
        epsilon_spent=Decimal(eps),
        delta_spent=Decimal(delta),
        events=events,
        now=2,
        owner=key,
    )


def test_a_ledger_with_training_composes_tightly_and_an_unknown_kind_fails_the_cli(
    ledger: Ledger, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from fedldp.cli_report import release

    training = {
        "kind": "poisson_subsampled_gaussian",
        "noise_multiplier": 1.1,
        "sample_rate": 0.05,
        "steps": 100,
    }
    _settled(ledger, "train", "4", "1e-5", [training])
    _settled(ledger, "count", "0.5", "0", [{"kind": "exponential", "epsilon": "0.5"}])
    failed = ledger.reserve(
        subject="s", purpose="p", epsilon=Decimal(1), delta=Decimal(0),
        idempotency_key="failed", now=1, owner="f",
    )  # fmt: skip
    ledger.open_data(failed.id, owner="f", now=1)
    ledger.settle(failed.id, epsilon_spent=Decimal(1), delta_spent=Decimal(0), now=2, owner="f")
    for method in ("rdp", "pld"):
        spent = compose(ledger, "s", "p", method)
        assert (spent.tight_events, spent.basic_events) == (2, 1)
        tight = events_epsilon([training, {"kind": "exponential", "epsilon": "0.5"}], method, 1e-5)
        assert spent.epsilon == pytest.approx(min(tight, 4.5) + 1.0, rel=1e-9)
        assert spent.epsilon < float(spent.basic_epsilon)
    url = ledger.url
    _settled(ledger, "odd", "1", "0", [{"kind": "sparse_vector", "epsilon": "1"}])
    out = CliRunner().invoke(
        release,
        ["spend", "--ledger", url, "--subject", "s", "--purpose", "p", "--composition", "pld"],
    )
    assert out.exit_code == 1 and "cannot compose stored event kind 'sparse_vector'" in out.output
    basic = CliRunner().invoke(
        release, ["spend", "--ledger", url, "--subject", "s", "--purpose", "p"]
    )
    assert basic.exit_code == 0 and json.loads(basic.output)["basic_epsilon"] == "6.5"
    ledger.close()


def _spend_with_training(ledger: Ledger, delta: str) -> Any:
    """`release spend --composition pld --delta=<delta>` on a ledger holding one training."""
    from click.testing import CliRunner

    from fedldp.cli_report import release

    training = {
        "kind": "poisson_subsampled_gaussian",
        "noise_multiplier": 1.2,
        "sample_rate": 0.25,
        "steps": 8,
        "delta": "0.00001",
    }
    _settled(ledger, "train", "3", "1e-5", [training])
    args = ["spend", "--ledger", ledger.url, "--subject", "s", "--purpose", "p"]
    return CliRunner().invoke(release, [*args, "--composition", "pld", f"--delta={delta}"])


@pytest.mark.parametrize("delta", ["2", "1", "0", "-1", "inf", "nan", "-inf"])
def test_spend_refuses_a_delta_outside_the_unit_interval(ledger: Ledger, delta: str) -> None:
    """Finding 07: --delta outside (0, 1) printed epsilon 0.0 / NaN / Infinity with exit 0.
    (The same ledger with a delta inside: the next test.)"""
    out = _spend_with_training(ledger, delta)
    assert out.exit_code == 2 and "0 < delta < 1" in out.output
    errors = [line for line in out.output.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: Invalid value for --delta: must satisfy 0 < delta < 1"]
    assert "epsilon" not in out.output


def test_spend_composes_with_a_delta_inside_the_unit_interval(ledger: Ledger) -> None:
    good = _spend_with_training(ledger, "0.00001")
    assert good.exit_code == 0 and math.isfinite(json.loads(good.output)["epsilon"])
