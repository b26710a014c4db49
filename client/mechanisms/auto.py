"""`auto`: the frequency oracle with the least variance for (k, ε).

Resolved when a policy is authored, never signed (policy.proto, MechanismSpec).
Each candidate is built with its default parameters and compared on n·Var[f̂_v]
at f_v = 0, the quantity Wang et al. compare (USENIX Security 2017, Section 5,
Table 1), computed from each mechanism's exact (p*, q*):

* grr:  (e^ε + k - 2) / (e^ε - 1)^2                (Wang et al. 2017, eq. (4))
* oue:  4 e^ε / (e^ε - 1)^2                        (ibid., eq. (6))
* sue:  e^{ε/2} / (e^{ε/2} - 1)^2                  (ibid., Section 4.2)
* olh:  (e^ε - 1 + g)^2 / ((e^ε - 1)^2 (g - 1)), g the prime of `olh.default_g`
                                                   (ibid., eq. (10))
* hr:   (e^ε + 1)^2 / (e^ε - 1)^2                  (Acharya, Sun, Zhang, AISTATS 2019)
* ss:   q*(1-q*)/(p*-q*)^2 with p* = d e^ε/(d e^ε + k - d),
        q* = (p*(d-1) + (1-p*) d)/(k-1), d = `subset.default_subset_size`
                                                   (Ye and Barg, IEEE T-IT 2018, Sec. III)

Ties go to the earlier entry of `AUTO_CANDIDATES` (the one with the shorter report).

Longitudinal `auto` (a policy whose mechanism is "auto" with the param
"epsilon_permanent" ε∞): the memoized oracles of `LONGITUDINAL_CANDIDATES`
(rappor-grr, loloha, rappor-oue, rappor-sue) are built at (k, ε1, ε∞) and
compared on

    score = n·Var[f̂_v] at f_v = 0  ×  report_charge,

the variance of one window's estimate at equal lifetime loss: a user whose
budget B buys B / charge reports, averaged over those reports' windows, has
its variance divided by their number, so variance × charge is the variance
per unit of ε spent (memo_loss.py: each report costs `report_charge`,
max(ε1, ε_I), for any sequence of values). One report of each candidate has
its base oracle's law at ε1 (memo.py, loloha.py), so the variance is the
formula above for grr, olh (with loloha's g), oue and sue. Ties go to the
earlier candidate.
"""

from __future__ import annotations

from decimal import Decimal

from fedldp.client.mechanisms._common import f0_variance_scalar
from fedldp.client.mechanisms.base import MetricArg, MultiMetric
from fedldp.client.mechanisms.oracle import FrequencyOracle

#: Candidates in tie-break order: shorter reports first.
AUTO_CANDIDATES: tuple[str, ...] = ("grr", "hr", "olh", "ss", "oue", "sue")


def build_candidate(wire_id: str, epsilon: Decimal, k: int) -> FrequencyOracle:
    """One candidate with its default parameters."""
    from fedldp.client.mechanisms.registry import create

    mechanism = create(wire_id, epsilon, k, {})
    assert isinstance(mechanism, FrequencyOracle)
    return mechanism


def f0_variance(mechanism: FrequencyOracle) -> float:
    """n·Var[f̂_v] at f_v = 0 from the mechanism's exact support probabilities."""
    return f0_variance_scalar(mechanism.support_p, mechanism.support_q)


def choose_frequency_oracle(k: int, epsilon: Decimal) -> str:
    """The wire id of the least-variance frequency oracle for domain size k and ε."""
    best_id = ""
    best = float("inf")
    for wire_id in AUTO_CANDIDATES:
        try:
            candidate = build_candidate(wire_id, epsilon, k)
        except ValueError:
            continue  # e.g. olh when ε is too large for its seed space
        variance = f0_variance(candidate)
        if variance < best * (1.0 - 1e-12):
            best_id, best = wire_id, variance
    if not best_id:
        raise ValueError(f"no frequency oracle accepts k={k}, epsilon={epsilon}")
    return best_id


#: Longitudinal candidates (memoized; see `choose_longitudinal`), tie-break order.
LONGITUDINAL_CANDIDATES: tuple[str, ...] = ("rappor-grr", "loloha", "rappor-oue", "rappor-sue")


def longitudinal_score(mechanism: FrequencyOracle) -> float:
    """n·Var[f̂_v] at f_v = 0 times the per-report charge (module docstring)."""
    return f0_variance(mechanism) * float(mechanism.report_charge)


def choose_longitudinal(k: int, epsilon: Decimal, epsilon_permanent: Decimal) -> str:
    """The memoized oracle with the least variance per unit of lifetime loss at (k, ε1, ε∞)."""
    from fedldp.client.mechanisms.registry import create

    best_id, best = "", float("inf")
    for wire_id in LONGITUDINAL_CANDIDATES:
        try:
            candidate = create(wire_id, epsilon, k, {"epsilon_permanent": str(epsilon_permanent)})
        except ValueError:
            continue  # e.g. ε1 = ε∞ (no finite charge) or olh's seed space too large
        assert isinstance(candidate, FrequencyOracle)
        score = longitudinal_score(candidate)
        if score < best * (1.0 - 1e-12):
            best_id, best = wire_id, score
    if not best_id:
        raise ValueError(
            f"no longitudinal oracle accepts k={k}, epsilon={epsilon}, "
            f"epsilon_permanent={epsilon_permanent}"
        )
    return best_id


def resolve(
    wire_id: str,
    epsilon: Decimal,
    metric: MetricArg,
    *,
    epsilon_permanent: Decimal | None = None,
) -> str:
    """`wire_id`, or for "auto" the concrete id to sign into the policy: the
    least-variance oracle of a categorical metric, or for a multi-attribute
    metric "multi-split" or "multi-sample" (`multi.choose_mode`)."""
    if wire_id != "auto":
        return wire_id
    if isinstance(metric, MultiMetric):
        from fedldp.client.mechanisms.multi import choose_mode

        return choose_mode(metric, epsilon)
    if isinstance(metric, bool) or not isinstance(metric, int):
        raise ValueError("auto is defined for categorical metrics only; name a numeric mechanism")
    if epsilon_permanent is not None:
        return choose_longitudinal(metric, epsilon, epsilon_permanent)
    return choose_frequency_oracle(metric, epsilon)


__all__ = [
    "AUTO_CANDIDATES",
    "LONGITUDINAL_CANDIDATES",
    "choose_frequency_oracle",
    "choose_longitudinal",
    "f0_variance",
    "longitudinal_score",
    "resolve",
]
