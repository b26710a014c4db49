"""The common frame of every frequency oracle over a categorical domain [0, k).

Every oracle here is a *support-count* oracle (Wang et al., "Locally
Differentially Private Protocols for Frequency Estimation", USENIX Security
2017, Section 3, the "pure" protocols): each report supports a set of values,
and

    P[report supports v | true value = v] = p*      (`support_p`)
    P[report supports v | true value != v] = q*     (`support_q`)

the same for every v and independent across users. With C(v) the number of
the n reports supporting v, the unbiased estimate and its exact variance are

    f̂_v = (C(v)/n - q*) / (p* - q*)
    Var[f̂_v] = (f_v p*(1 - p*) + (1 - f_v) q*(1 - q*)) / (n (p* - q*)^2).

A subclass says how to perturb, how to check an output, how to count support
(`support_counts`), and states the exact law its sampler realizes
(`exact_probability`, Fractions computed from the sampler's own integer
thresholds), from which the contract tests check the privacy ratio against
e^ε exactly. Its float `support_p`, `support_q` are that law's, so the
estimator is unbiased for what is actually sampled.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from fedldp.client.mechanisms._common import check_domain_size, support_variance
from fedldp.client.mechanisms.base import CountStatistic, Estimate, Mechanism, Output

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


def domain_index(labels: Sequence[str]) -> dict[str, int]:
    """Label -> index for a categorical domain; duplicate or too few labels raise ValueError.

    The message names positions, never label contents (labels may be sensitive).
    """
    if len(labels) < 2:
        raise ValueError(f"a categorical domain needs at least 2 values, got {len(labels)}")
    index: dict[str, int] = {}
    for position, label in enumerate(labels):
        if not isinstance(label, str):
            raise ValueError(f"domain value at position {position} is not a string")
        if label in index:
            raise ValueError(f"duplicate domain value at positions {index[label]} and {position}")
        index[label] = position
    return index


class FrequencyOracle(Mechanism[int, CountStatistic]):
    """Base of the categorical mechanisms: estimator and variance written once."""

    #: P[a report supports v | value = v] and P[... | value != v].
    support_p: float
    support_q: float

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon)
        self.k = check_domain_size(k)

    # --- contract pieces a subclass provides ---

    def exact_probability(self, value: int, output: Output) -> Fraction:
        """P[perturb(value) == output] exactly as the sampler realizes it.

        Every categorical sampler here draws only integers (thresholds of
        `_common.DyadicProbability`, `randrange`, `sample`), so this is a
        rational number, computed from the same thresholds the sampler uses.
        """
        raise NotImplementedError(f"{type(self).__name__} does not state its exact law")

    def exact_law(self, value: int) -> dict[Output, Fraction]:
        """Every output with its exact probability under `value` (small parameters)."""
        return {output: self.exact_probability(value, output) for output in self.outputs()}

    def output_probability(self, value: int, output: Output) -> float:
        """P[perturb(value) == output] as a float (`exact_probability`, rounded)."""
        return float(self.exact_probability(value, output))

    @abstractmethod
    def outputs(self) -> Iterator[Output]:
        """Every possible output (for exhaustive tests with small parameters)."""

    def statistic_size(self) -> int:
        """Length of the statistic's `counts` (k unless the oracle counts outputs)."""
        return self.k

    def support_counts(self, statistic: CountStatistic) -> npt.NDArray[np.float64]:
        """C(v) for every v in [0, k) from the statistic."""
        import numpy as np

        return np.asarray(statistic.counts, dtype=np.float64)

    # --- written once ---

    def new_statistic(self) -> CountStatistic:
        return CountStatistic(counts=[0] * self.statistic_size())

    def variance(self, n: int, frequency: Any) -> npt.NDArray[np.float64]:
        """Exact Var[f̂_v] at true frequency f_v (array or scalar), n reports."""
        return support_variance(n, frequency, self.support_p, self.support_q)

    def estimate(self, statistic: CountStatistic) -> Estimate:
        import numpy as np

        n = statistic.n
        if n <= 0:
            raise ValueError("cannot estimate from zero reports")
        if len(statistic.counts) != self.statistic_size():
            raise ValueError("statistic does not belong to this mechanism's parameters")
        support = self.support_counts(statistic)
        p, q = self.support_p, self.support_q
        values = (support / n - q) / (p - q)
        # Plug-in variance at the estimate, clipped to [0, 1] for the f-dependent term.
        variances = self.variance(n, np.clip(values, 0.0, 1.0))
        return Estimate(n=n, values=values, variances=variances)

    def _add_counts(self, statistic: CountStatistic, counts: Any, reports: int) -> None:
        if len(statistic.counts) != len(counts):
            raise ValueError("statistic does not belong to this mechanism's parameters")
        statistic.counts = [a + int(b) for a, b in zip(statistic.counts, counts, strict=True)]
        statistic.n += int(reports)
