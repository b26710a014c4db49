"""`auto` with epsilon_permanent: the least variance per unit of lifetime loss.

The expected choice is computed here from closed forms, independently of the
mechanisms: one report's f_v = 0 variance of the base oracle at ε1 (Wang et al.,
USENIX Security 2017: grr eq. (4), olh eq. (10) with loloha's g, oue eq. (6), sue
Section 4.2) times the per-report charge max(ε1, ε_I), ε_I from the calibration's
closed form (memo.py): GRR over m values with λ_r = λ(ε1)/λ(ε∞), λ(ε) = (e^ε - 1)
/(e^ε + m - 1), gives ε_I = ln (1 + (m - 1) λ_r)/(1 - λ_r); unary encodings flip
each of k bits w.p. f and ε_I = k ln (1 - f)/f.
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from fedldp.authoring.policies import resolve_auto_mechanism
from fedldp.client.mechanisms.auto import choose_longitudinal, resolve
from fedldp.client.mechanisms.olh import default_g
from fedldp.v1 import policy_pb2


def _grr_rate(m: int, e1: float, einf: float) -> float:
    def lam(e: float) -> float:
        return (math.exp(e) - 1) / (math.exp(e) + m - 1)

    lam_r = lam(e1) / lam(einf)
    return math.log((1 + (m - 1) * lam_r) / (1 - lam_r))


def _scores(k: int, e1: float, einf: float) -> dict[str, float]:
    e = math.exp(e1)
    g = default_g(Decimal(str(e1)))
    q1 = 1 / (e + 1)
    q_inf = 1 / (math.exp(einf) + 1)
    f_oue = 1 - (1 - q_inf - q1) / (1 - 2 * q_inf)
    p1_sue = math.exp(e1 / 2) / (math.exp(e1 / 2) + 1)
    p_inf_sue = math.exp(einf / 2) / (math.exp(einf / 2) + 1)
    f_sue = (1 - (2 * p1_sue - 1) / (2 * p_inf_sue - 1)) / 2
    variance = {
        "rappor-grr": (e + k - 2) / (e - 1) ** 2,
        "loloha": (e - 1 + g) ** 2 / ((e - 1) ** 2 * (g - 1)),
        "rappor-oue": 4 * e / (e - 1) ** 2,
        "rappor-sue": math.exp(e1 / 2) / (math.exp(e1 / 2) - 1) ** 2,
    }
    rate = {
        "rappor-grr": _grr_rate(k, e1, einf),
        "loloha": _grr_rate(g, e1, einf),
        "rappor-oue": k * math.log((1 - f_oue) / f_oue),
        "rappor-sue": k * math.log((1 - f_sue) / f_sue),
    }
    return {m: variance[m] * max(e1, rate[m]) for m in variance}


@pytest.mark.parametrize("k", [2, 3, 8, 64])
@pytest.mark.parametrize(("eps1", "eps_inf"), [("0.5", "2"), ("1", "2"), ("1", "4"), ("2", "4")])
def test_choice_matches_the_closed_forms(k: int, eps1: str, eps_inf: str) -> None:
    scores = _scores(k, float(eps1), float(eps_inf))
    best = min(scores.values())
    chosen = choose_longitudinal(k, Decimal(eps1), Decimal(eps_inf))
    # The chosen one is the closed-form minimum (up to float noise in near-ties).
    assert scores[chosen] <= best * (1 + 1e-6), (chosen, scores)


def test_loloha_wins_at_large_k_and_rappor_grr_at_k_2() -> None:
    assert choose_longitudinal(64, Decimal(1), Decimal(2)) == "loloha"
    assert choose_longitudinal(2, Decimal(1), Decimal(2)) == "rappor-grr"
    assert resolve("auto", Decimal(1), 64, epsilon_permanent=Decimal(2)) == "loloha"
    with pytest.raises(ValueError, match="no longitudinal oracle"):
        choose_longitudinal(8, Decimal(2), Decimal(2))  # ε1 = ε∞: no finite charge


def test_authoring_resolves_longitudinal_auto() -> None:
    policy = policy_pb2.Policy()
    policy.metric.categorical.values.extend([f"v{i}" for i in range(64)])
    policy.mechanism.id = "auto"
    policy.mechanism.epsilon = "1"
    policy.mechanism.params["epsilon_permanent"] = "2"
    resolve_auto_mechanism(policy)
    assert policy.mechanism.id == "loloha"
    assert dict(policy.mechanism.params) == {"epsilon_permanent": "2"}
