"""Exact longitudinal privacy loss of the memoized (RAPPOR-style) mechanisms.

`fedldp.client.mechanisms.memo` chains a permanent randomized response B, drawn
once per (user, metric, value), with an instantaneous randomization of B per
report (Erlingsson, Pihur, Korolova, CCS 2014, Sections 2-3). T reports of one
value v share B, so they are not independent given v and their loss is not
T times the loss of one report. This module computes, from the exact
probabilities the samplers realize,

    L(T) = max over output sequences y = (y_1..y_T) and values v != v' of
           ln P_T(y | v) / P_T(y | v'),

the exact worst-case loss of T reports of one unchanged value, as a rigorous
upper bound (every rounding is directed so that the result is >= the true
value; the slack is below 1e-30), and the value-blind per-report rate

    r* = max over m >= 1 of L(m) / m.

Closed forms (derived here; the notation is memo.py's):

* rappor-grr — permanent GRR(p∞, q∞) and instantaneous GRR(p_r, q_r) on k
  values, ρ = p_r / q_r. Given B = z the reports are i.i.d., so with c_z the
  number of reports equal to z and g(c) = p_r^c q_r^(T-c),
  P_T(y | v) = q∞ S + (p∞ - q∞) g(c_v), S = Σ_z g(c_z). Dividing by q_r^T
  (ρ^c instead of g(c)), with a = c_v, b = c_v' and the n = T - a - b other
  reports spread over the k - 2 other values,

      ratio = (q∞ (ρ^b + R) + p∞ ρ^a) / (q∞ (ρ^a + R) + p∞ ρ^b),

  R = Σ of ρ^c over the other values. The ratio decreases in R, and R is
  smallest, by convexity of c -> ρ^c, when the n reports are spread as evenly
  as possible: R(n) = w ρ^(u+1) + (k - 2 - w) ρ^u, n = (k - 2) u + w. So
  L(T) = ln max over (a, b) of that ratio. Pruning (proved in `_grr_best`):
  for fixed a, once b >= floor((n - 1)/(k - 2)), moving a report from the
  others to v' never increases the ratio, so b need not go further; this leaves
  about T^2 / (2 (k - 1)) pairs. For k = 2 there are no other values: b = T - a.
* rappor-oue / rappor-sue — bit i of the permanent vector is 1 w.p. π (p∞ at
  i = v, q∞ elsewhere) and every report flips every bit independently w.p. f.
  Columns are independent given v and only columns v and v' differ in law, so
  with a ones among T in a column, h_π(a) = π (1-f)^a f^(T-a) + (1-π) f^a (1-f)^(T-a),
  and L(T) = ln max_a h_p(a)/h_q(a) + ln max_b h_q(b)/h_p(b). With σ = (1-f)/f,
  h_p(a)/h_q(a) = (p t + 1 - p)/(q t + 1 - q), t = σ^(2a - T), increasing in t
  (its derivative has the sign of p - q > 0), so the maxima are at a = T and
  b = 0:

      L(T) = ln (p σ^T + 1 - p)/(q σ^T + 1 - q) + ln (q + (1 - q) σ^T)/(p + (1 - p) σ^T).

Bounds used by the scan for r*:

* L(m) <= E∞, the permanent response's own loss (ln p∞/q∞ for GRR,
  ln p∞(1 - q∞)/(q∞(1 - p∞)) for the unary encodings): the reports are a
  randomized function of B alone (post-processing). Hence for m >= E∞ / r,
  L(m)/m <= r: the scan over m stops at the first m with m r >= E∞, r the
  largest L(j)/j seen (`joint_rate`).
* Unary encodings with p∞ >= 1/2 >= q∞ (OUE and SUE): with x = T ln σ,
  L'' (x) = [s'(x + α) - s'(x - α)] + [s'(x - β) - s'(x + β)], s the logistic
  function, α = logit p∞ >= 0 >= β = logit q∞; s' is even and decreasing in
  |x|, so both brackets are <= 0 for x >= 0. L is concave with L(0) = 0, so
  L(m)/m is non-increasing and r* = L(1): one report's loss.

Sequences of values (the ledger's charge). The neighbouring inputs of a
user's reports are two *sequences* of values x, x' of one length T, changed
or not; L(T) above covers only x = (v, ..., v) against x' = (v', ..., v'),
and its rate r* is not a sound charge: reports that share a permanent
response carry its fingerprint, which tells whether two reports share a
value (rappor-oue, k = 64, ε1 = 1, ε∞ = 2, x = (0, 0), x' = (0, 1): loss
27.9 against 2 r* = 2). The sound value-blind bound:

    Draw the permanent responses B_u ~ P∞(. | u) for every value u at once
    (drawing them lazily, as the device does, gives the same law), and let
    report t be Y_t ~ I(. | B_{x_t}), independent given B. Write
    e^{ε_I} = max over y, b, b' of I(y | b) / I(y | b'), the instantaneous
    step's own loss on the permanent responses. By the chain rule
    P[y | x] = Π_t P[y_t | y_<t, x] and P[y_t | y_<t, x] = Σ_b π_t(b) I(y_t | b),
    π_t the posterior of B_{x_t} given y_<t under x. Any two mixtures of
    I(y_t | .) lie within a factor max_b I(y_t | b) / min_b I(y_t | b) <= e^{ε_I}
    of each other, and the first term is one report's law (loss ε1). So for
    every T, every x, x' and every output sequence y,

        ln P[y | x] / P[y | x'] <= ε1 + (T - 1) ε_I <= T max(ε1, ε_I).

  rappor-grr: ε_I = ln p_r / q_r (`instantaneous_rate_grr`); rappor-oue and
  rappor-sue: ε_I = k ln (1 - f)/f (`instantaneous_rate_unary`: two permanent
  vectors may differ in every bit). The charge is max(ε1, ε_I) per report
  (`sequence_charge`). It is of the right order, not a loose bound: reports
  whose values all differ against reports of one value give a loss that
  grows linearly in T at a rate close to ε_I (x = (u_1, ..., u_T) distinct,
  x' = (v, ..., v), y = (v, ..., v): ln p∞ + T ln p_r / q1, q1 the one-report
  probability of v given another value), so no cap on the lifetime loss of
  a memoized mechanism holds when values may change, however few memo
  entries it keeps (test_memo_sequences.py enumerates this exactly).

Everything is computed in `decimal` at `PRECISION` digits with ROUND_CEILING
for quantities bounded from above and ROUND_FLOOR for those bounded from below;
ln and exp are correctly rounded by the decimal module and then moved one unit
in the last place in the safe direction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from fractions import Fraction

#: Significant digits of every intermediate bound.
PRECISION = 50
#: Decimal places of a ledger charge (`charge_from_rate`): an exact decimal string.
CHARGE_PLACES = 6
#: Most ratio evaluations `joint_rate` may spend; parameters needing more are refused.
MAX_EVALUATIONS = 200_000

_UP = Context(prec=PRECISION, rounding=ROUND_CEILING)
_DOWN = Context(prec=PRECISION, rounding=ROUND_FLOOR)
_NEAREST = Context(prec=PRECISION)


def _dec_up(x: Fraction) -> Decimal:
    """Smallest PRECISION-digit decimal >= x."""
    return _UP.divide(Decimal(x.numerator), Decimal(x.denominator))


def _dec_down(x: Fraction) -> Decimal:
    """Largest PRECISION-digit decimal <= x."""
    return _DOWN.divide(Decimal(x.numerator), Decimal(x.denominator))


def ln_upper(x: Decimal) -> Decimal:
    """A decimal >= ln x (x > 0): the correctly rounded ln, one unit up."""
    return _NEAREST.ln(x).next_plus(_UP)


def exp_lower(epsilon: Decimal) -> Fraction:
    """A rational <= e^epsilon: the correctly rounded exp, one unit down."""
    return Fraction(_NEAREST.exp(epsilon).next_minus(_DOWN))


def charge_from_rate(rate: Decimal, epsilon: Decimal) -> Decimal:
    """The per-report ledger charge: ε1 when r* <= ε1, else r* rounded up at CHARGE_PLACES.

    Both are >= r*, so the charge is sound; ε1 keeps the charge of a mechanism
    whose reports compose no worse than sequentially equal to its epsilon.
    """
    if rate <= epsilon:
        return epsilon
    return _rounded_charge(rate)


def _power(context: Context, x: Decimal, m: int) -> Decimal:
    """x^m (x > 0) by binary exponentiation, every product rounded in `context`'s direction."""
    result = Decimal(1)
    while m:
        if m & 1:
            result = context.multiply(result, x)
        x = context.multiply(x, x)
        m >>= 1
    return result


def _rounded_charge(rate: Decimal) -> Decimal:
    """`rate` rounded up at CHARGE_PLACES decimals (a ledger charge: an exact decimal string)."""
    return rate.quantize(Decimal(1).scaleb(-CHARGE_PLACES), rounding=ROUND_CEILING)


class InfiniteSequenceLossError(ValueError):
    """The instantaneous step is deterministic: changing values are linkable with certainty."""


def instantaneous_rate_grr(k: int, p_r: Fraction) -> Decimal:
    """Upper bound on ε_I = ln p_r / q_r, q_r = (1 - p_r)/(k - 1): the instantaneous GRR's loss.

    ε_I is the most one report can move the likelihood of any output between two
    permanent responses b, b' (max over y, b, b' of ln I(y | b) / I(y | b')); it
    bounds each report's term of the sequence loss (module docstring, "Sequences
    of values"). Raises InfiniteSequenceLossError when q_r = 0.
    """
    if k < 2 or not 0 < p_r <= 1:
        raise ValueError("need k >= 2 and 0 < p_r <= 1")
    q_r = (1 - p_r) / (k - 1)
    if q_r == 0:
        raise InfiniteSequenceLossError(
            "the instantaneous response repeats the permanent one (epsilon = "
            "epsilon_permanent): two reports of one value are always equal and two of "
            "different values may differ, so a change of value is revealed with certainty "
            "(unbounded loss); lower epsilon below epsilon_permanent"
        )
    return ln_upper(_dec_up(max(p_r, q_r) / min(p_r, q_r)))


def instantaneous_rate_unary(k: int, flip: Fraction) -> Decimal:
    """Upper bound on ε_I = k ln (1 - f)/f: independent flips of k permanent bits w.p. f.

    Two permanent vectors may differ in all k bits, so one report's likelihood moves
    by ((1 - f)/f)^k at most. Raises InfiniteSequenceLossError when f = 0.
    """
    if k < 1 or not 0 <= flip <= Fraction(1, 2):
        raise ValueError("need k >= 1 and 0 <= flip <= 1/2")
    if flip == Fraction(1, 2):
        return Decimal(0)  # every bit is a fair coin: reports carry nothing
    if flip == 0:
        raise InfiniteSequenceLossError(
            "the instantaneous step flips no bit (epsilon = epsilon_permanent): a change "
            "of value is revealed with certainty (unbounded loss); lower epsilon below "
            "epsilon_permanent"
        )
    return _UP.multiply(k, ln_upper(_dec_up((1 - flip) / flip)))


def sequence_charge(rate: Decimal, epsilon: Decimal) -> Decimal:
    """The sound per-report ledger charge of a memoized mechanism: max(ε1, ε_I), ε_I rounded up.

    For every T and every two sequences of T values (changed or not), the T
    reports' exact joint loss is at most ε1 + (T - 1) ε_I <= T max(ε1, ε_I)
    (module docstring), so T charges cover them. ε_I >= ε1 always holds for the
    exact quantities (one report is a post-processing of the instantaneous step);
    the max only guards the rounding.
    """
    return max(epsilon, _rounded_charge(rate))


class JointLossTooCostlyError(ValueError):
    """The exact joint rate would need more than MAX_EVALUATIONS ratio evaluations."""


@dataclass
class _Powers:
    """ρ^c bounded above (`hi`) and below (`lo`), by repeated directed multiplication."""

    rho: Fraction
    hi: list[Decimal] = field(default_factory=lambda: [Decimal(1)])
    lo: list[Decimal] = field(default_factory=lambda: [Decimal(1)])

    def upto(self, m: int) -> None:
        """Extend both lists to index m."""
        rho_hi, rho_lo = _dec_up(self.rho), _dec_down(self.rho)
        while len(self.hi) <= m:
            self.hi.append(_UP.multiply(self.hi[-1], rho_hi))
            self.lo.append(_DOWN.multiply(self.lo[-1], rho_lo))


@dataclass
class GRRChain:
    """Permanent GRR(p∞, q∞) then instantaneous GRR(p_r, q_r) on k values (exact laws)."""

    k: int
    p_inf: Fraction
    p_r: Fraction
    evaluations: int = 0
    _powers: _Powers | None = field(default=None, repr=False)
    _bounds: tuple[Decimal, Decimal, Decimal, Decimal] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.k < 2 or not 0 < self.p_inf <= 1 or not 0 < self.p_r <= 1:
            raise ValueError("need k >= 2 and probabilities in (0, 1]")
        if self.p_inf <= self.q_inf or self.p_r < self.q_r:
            raise ValueError("need p∞ > q∞ and p_r >= q_r (the pruning in _grr_best assumes it)")
        p, q = self.p_inf, self.q_inf
        self._bounds = (_dec_up(p), _dec_down(p), _dec_up(q), _dec_down(q))

    @property
    def q_inf(self) -> Fraction:
        """Probability of each other value in the permanent response."""
        return (1 - self.p_inf) / (self.k - 1)

    @property
    def q_r(self) -> Fraction:
        """Probability of each other value in an instantaneous response."""
        return (1 - self.p_r) / (self.k - 1)

    def permanent_loss(self) -> Decimal:
        """Upper bound on E∞ = ln p∞/q∞, the permanent response's loss."""
        return ln_upper(_dec_up(self.p_inf / self.q_inf))

    def _ratio_upper(self, a: int, b: int, n: int) -> Decimal:
        """Upper bound on the likelihood ratio at counts a (for v), b (for v'), n (others)."""
        assert self._powers is not None
        hi, lo = self._powers.hi, self._powers.lo
        others = self.k - 2
        u, w = divmod(n, others) if others else (0, 0)
        p_hi, p_lo, q_hi, q_lo = self._bounds
        rest_hi = _UP.add(_UP.multiply(w, hi[u + 1]), _UP.multiply(others - w, hi[u]))
        rest_lo = _DOWN.add(_DOWN.multiply(w, lo[u + 1]), _DOWN.multiply(others - w, lo[u]))
        num = _UP.add(_UP.multiply(q_hi, _UP.add(hi[b], rest_hi)), _UP.multiply(p_hi, hi[a]))
        den = _DOWN.add(
            _DOWN.multiply(q_lo, _DOWN.add(lo[a], rest_lo)), _DOWN.multiply(p_lo, lo[b])
        )
        self.evaluations += 1
        return _UP.divide(num, den)

    def _grr_best(self, m: int) -> Decimal:
        """Upper bound on max over (a, b) of the ratio for m reports (module docstring).

        Pruning: with n = m - a - b > 0 others spread evenly, moving one report
        from the others to v' changes the denominator by
        (ρ - 1)(p∞ ρ^b - q∞ ρ^floor((n-1)/(k-2))) >= 0 when b >= floor((n-1)/(k-2))
        (p∞ >= q∞, ρ >= 1), and lowers ρ^a - ρ^b; so the ratio does not increase,
        the condition keeps holding as b grows, and the scan over b stops there.
        """
        if self.q_r == 0:  # the reports repeat the permanent response
            return _dec_up(self.p_inf / self.q_inf)
        if self._powers is None:
            self._powers = _Powers(self.p_r / self.q_r)
        self._powers.upto(m + 1)
        best = Decimal(1)
        for a in range(m + 1):
            if self.k == 2:
                best = max(best, self._ratio_upper(a, m - a, 0))
                continue
            for b in range(m - a + 1):
                n = m - a - b
                if a > b:
                    best = max(best, self._ratio_upper(a, b, n))
                if n == 0 or b >= (n - 1) // (self.k - 2):
                    break
        return best

    def loss(self, m: int) -> Decimal:
        """Upper bound on L(m), the exact loss of m reports of one value."""
        if m < 0:
            raise ValueError("the number of reports must be >= 0")
        if m == 0:
            return Decimal(0)
        return ln_upper(self._grr_best(m))


@dataclass
class UnaryChain:
    """Permanent unary encoding (p∞, q∞) then independent flips w.p. `flip` per bit."""

    p_inf: Fraction
    q_inf: Fraction
    flip: Fraction
    evaluations: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.q_inf < self.p_inf < 1 or not 0 <= self.flip < Fraction(1, 2):
            raise ValueError("need 0 < q∞ < p∞ < 1 and 0 <= flip < 1/2")

    def permanent_loss(self) -> Decimal:
        """Upper bound on E∞ = ln p∞(1 - q∞)/(q∞(1 - p∞))."""
        p, q = self.p_inf, self.q_inf
        return ln_upper(_dec_up(p * (1 - q) / (q * (1 - p))))

    def loss(self, m: int) -> Decimal:
        """Upper bound on L(m) (closed form of the module docstring)."""
        if m < 0:
            raise ValueError("the number of reports must be >= 0")
        if m == 0:
            return Decimal(0)
        self.evaluations += 1
        p, q = self.p_inf, self.q_inf
        if self.flip == 0:
            return self.permanent_loss()
        sigma = (1 - self.flip) / self.flip
        s_hi = _power(_UP, _dec_up(sigma), m)
        s_lo = _power(_DOWN, _dec_down(sigma), m)
        # Both factors increase in σ^m (numerator's coefficient ratio exceeds the
        # denominator's), so use the upper σ^m on top and the lower below.
        first = _UP.divide(
            _UP.add(_UP.multiply(_dec_up(p), s_hi), _dec_up(1 - p)),
            _DOWN.add(_DOWN.multiply(_dec_down(q), s_lo), _dec_down(1 - q)),
        )
        second = _UP.divide(
            _UP.add(_dec_up(q), _UP.multiply(_dec_up(1 - q), s_hi)),
            _DOWN.add(_dec_down(p), _DOWN.multiply(_dec_down(1 - p), s_lo)),
        )
        return ln_upper(_UP.multiply(first, second))


def joint_rate(
    loss: Callable[[int], Decimal], permanent: Decimal, cost: Callable[[], int]
) -> Decimal:
    """Upper bound on r* = max over m >= 1 of L(m)/m.

    Scans m = 1, 2, ... keeping r = max L(j)/j and stops at the first m with
    m r >= `permanent` (an upper bound on E∞ >= L(m') for every m'), after
    which L(m')/m' <= E∞/m' <= r. `cost` reports the evaluations spent so far;
    past MAX_EVALUATIONS the computation is refused (JointLossTooCostlyError)
    rather than guessed.
    """
    rate = loss(1)
    m = 1
    while _DOWN.multiply(m, rate) < permanent:
        m += 1
        rate = max(rate, _UP.divide(loss(m), m))
        if cost() > MAX_EVALUATIONS:
            raise JointLossTooCostlyError(
                "the exact joint loss of these parameters is too costly to compute "
                f"(more than {MAX_EVALUATIONS} evaluations); raise epsilon or lower "
                "epsilon_permanent"
            )
    return rate


__all__ = [
    "CHARGE_PLACES",
    "GRRChain",
    "InfiniteSequenceLossError",
    "JointLossTooCostlyError",
    "UnaryChain",
    "charge_from_rate",
    "exp_lower",
    "instantaneous_rate_grr",
    "instantaneous_rate_unary",
    "joint_rate",
    "ln_upper",
    "sequence_charge",
]
