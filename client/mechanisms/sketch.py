"""Count Mean Sketch (CMS) and Hadamard Count Mean Sketch (HCMS) over open string domains.

Apple Differential Privacy Team, "Learning with Privacy at Scale", Apple Machine
Learning Journal, 2017: Algorithm 1 (client CMS), 2 (server CMS sketch),
3 (client HCMS), 4 (server HCMS sketch) and the frequency oracle of Section
"Count Mean Sketch". A device holding a string s (policy `Metric.open`, 1..max_bytes
UTF-8 bytes) draws one of k hash functions and reports, about the cell h_j(s) of
an m-column sketch row, either a perturbed one-hot vector (CMS) or one perturbed
Hadamard coefficient (HCMS). No list of values exists: the analyst asks for the
frequency of any candidate string (`estimate_candidates`).

Hash family (the wire contract; any SDK reproduces it with SHA-256 alone)
--------------------------------------------------------------------------
For row j in [0, k) and the UTF-8 bytes u of s::

    h_j(s) = int.from_bytes(SHA-256(HASH_TAG || j as 4-byte big-endian || u)[0:8], "big") mod m

with HASH_TAG = b"fedldp/v1/sketch\\x00" (17 bytes). m is a power of two, so
h_j(s) is the low log2(m) bits of the first 8 digest bytes read big-endian, and
is exactly uniform when SHA-256 is modelled as a random function (the model of
every variance below). Test vectors: tests/client/mechanisms/test_sketch.py.

Parameters (policy params, stated explicitly in the signed policy at authoring,
`sketch_params`): "rows" k (default `DEFAULT_ROWS`, 1..`MAX_ROWS`) and "columns"
m (default `DEFAULT_COLUMNS`, a power of two in [2, `MAX_COLUMNS`]), with
k·m <= `MAX_CELLS` (the statistic has k·m integer counters).

Randomizers and their exact privacy
-----------------------------------
Both draw the row j = randrange(k) (exact, independent of s).

* CMS (Algorithm 1): the m-bit one-hot vector of h_j(s), every bit flipped
  independently with probability f = 1/(1 + e^{ε/2}). Two inputs' vectors
  differ in at most two bits, so the ratio is ((1 - f)/f)^2 = e^ε. Realized: f
  is rounded UP to a multiple of 2^-53 (`_common.dyadic_from_exp`), so
  ((1 - f)/f)^2 <= e^ε exactly. Bit at the true cell is 1 w.p. p = 1 - f, any
  other bit w.p. q = f (p + q = 1 exactly).
* HCMS (Algorithm 3): a column l = randrange(m) (exact, m a power of two) and
  the Hadamard coefficient w = H[h_j(s)][l] = (-1)^popcount(h_j(s) & l), kept
  with probability p = e^ε/(1 + e^ε) (rounded DOWN to a multiple of 2^-53),
  otherwise negated; the ratio p/(1 - p) <= e^ε exactly. The wire bit is True
  for +1.

Estimator (Apple 2017, Algorithms 2 and 4 and the CMS frequency oracle)
------------------------------------------------------------------------
Per report i with row J_i, an unbiased estimate Y_i of the indicator T_i =
[h_{J_i}(s_i) = h_{J_i}(d)] for the candidate d:

* CMS: Y_i = (B_i - q)/(p - q), B_i the reported bit at h_{J_i}(d);
* HCMS: Y_i = c · b_i · H[h_{J_i}(d)][L_i], c = 1/(2p - 1), b_i = ±1.

With n reports and N_d of them holding d, Apple's debiased count (its m/(m-1)
corrects the expected (n - N_d)/m collisions) is

    N̂_d = m/(m - 1) · (Σ_i Y_i - n/m),      f̂_d = N̂_d / n,

unbiased over the mechanism's coins, the row draws and the hash model.
Its exact variance (derived in docs/mechanisms.md, "Sketches"), with P_{-d} =
Σ_{d' != d} N_{d'}(N_{d'} - 1):

    Var[N̂_d] = (m/(m-1))^2 · V_noise  +  ((n - N_d) + P_{-d}/k) / (m - 1)

    V_noise = n p q/(p - q)^2                 (CMS; = n (c_ε^2 - 1)/4 in Apple's terms)
    V_noise = n c^2 - N_d - (n - N_d)/m       (HCMS)

The second term is the collision term: another string lands in d's cell of its
row with probability 1/m, and users sharing a string d' who drew the same row
collide together (covariance N_{d'}(N_{d'} - 1)/(k m)(1 - 1/m)); it shrinks as
1/m, and its heavy-hitter part as 1/(k m). The plug-in variance reports use
P̂ (`pair_count_estimate`, an unbiased estimate of P = Σ_d N_d(N_d - 1) from
the sketch's own second moment) minus the candidate's own N̂_d(N̂_d - 1).
Cormode, Kulkarni, Srivastava, "Marginal Release Under Local Differential
Privacy" (SIGMOD 2018), Section 4, give the same Hadamard-coefficient variance
c^2 per report.

Statistic (additive, exact integers, JSON): `SketchStatistic`, k·m cell
counters row-major (CMS: reports with the cell's bit set; HCMS: the signed sum
of ±1 bits at (row, column)) and the report count per row.

Wire: CMS SketchRowPayload (row, m bits packed like BitVectorPayload, length m);
HCMS SketchBitPayload (row, column, bit). Batch layouts: CMS (rows int64,
packed uint8 (n, ceil(m/8))); HCMS (rows int64, columns int64, bits bool).
Batch inputs are any sequence of str (a numpy object array included).
"""

from __future__ import annotations

import hashlib
import random
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar

from fedldp.client.mechanisms._common import (
    PROB_ONE,
    DyadicProbability,
    bernoulli_bits,
    bernoulli_read_bytes,
    byte_length,
    column_counts,
    dyadic_from_exp,
    half,
    int_param,
    only_params,
)
from fedldp.client.mechanisms.base import (
    Estimate,
    Mechanism,
    OpenDomain,
    Output,
    OutputDomainError,
    SketchBitOutput,
    SketchRowOutput,
    system_random,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Domain-separation tag of the hash family (see the module docstring).
HASH_TAG = b"fedldp/v1/sketch\x00"
DEFAULT_ROWS = 64
DEFAULT_COLUMNS = 1024
MAX_ROWS = 65536
MIN_COLUMNS = 2
MAX_COLUMNS = 16384
#: Largest k·m: the statistic holds one integer per cell.
MAX_CELLS = 1 << 20
#: Largest number of candidate strings one estimate takes (k SHA-256 calls each).
MAX_CANDIDATES = 100_000
SKETCH_MECHANISMS = ("cms", "hcms")


class CandidatesRequiredError(ValueError):
    """A sketch has no fixed list of values: estimate candidate strings instead."""


def sketch_hash(row: int, data: bytes, columns: int) -> int:
    """h_row(data) of the contract: the first 8 bytes of SHA-256(HASH_TAG || row (4 bytes,
    big-endian) || data) as a big-endian integer, mod `columns` (a power of two)."""
    digest = hashlib.sha256(HASH_TAG + row.to_bytes(4, "big") + data).digest()
    return int.from_bytes(digest[:8], "big") & (columns - 1)


def check_sketch_size(wire_id: str, rows: int, columns: int) -> tuple[int, int]:
    """Validate (rows k, columns m) against the documented bounds; return them."""
    for name, given in (("rows", rows), ("columns", columns)):
        if isinstance(given, bool) or not isinstance(given, int):
            raise TypeError(f"{wire_id} {name} must be an int")
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"{wire_id} parameter 'rows' must be in [1, {MAX_ROWS}]")
    if not MIN_COLUMNS <= columns <= MAX_COLUMNS or columns & (columns - 1):
        raise ValueError(
            f"{wire_id} parameter 'columns' must be a power of two in "
            f"[{MIN_COLUMNS}, {MAX_COLUMNS}]"
        )
    if rows * columns > MAX_CELLS:
        raise ValueError(f"{wire_id}: rows x columns must be at most {MAX_CELLS} cells")
    return rows, columns


def parse_sketch_params(wire_id: str, params: Mapping[str, str]) -> tuple[int, int]:
    """(rows, columns) from policy params, the documented defaults for what is missing."""
    only_params(wire_id, params, {"rows", "columns"})
    rows = int_param(wire_id, params, "rows")
    columns = int_param(wire_id, params, "columns")
    return check_sketch_size(
        wire_id,
        DEFAULT_ROWS if rows is None else rows,
        DEFAULT_COLUMNS if columns is None else columns,
    )


def sketch_params(wire_id: str, params: Mapping[str, str]) -> dict[str, str]:
    """`params` with "rows" and "columns" written in (authoring states them in the signed
    policy); other ids and invalid input come back unchanged (validation reports it)."""
    if wire_id not in SKETCH_MECHANISMS:
        return dict(params)
    try:
        rows, columns = parse_sketch_params(wire_id, params)
    except ValueError:
        return dict(params)
    return {**params, "rows": str(rows), "columns": str(columns)}


@dataclass
class SketchStatistic:
    """k·m cell counters (row-major) and reports per row; additive, exact integers."""

    counts: list[int]
    row_reports: list[int]
    n: int = 0

    def merge(self, other: SketchStatistic) -> None:
        """Add another partial statistic in place."""
        if len(other.counts) != len(self.counts) or len(other.row_reports) != len(self.row_reports):
            raise ValueError("cannot merge sketch statistics of different sizes")
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.row_reports = [a + b for a, b in zip(self.row_reports, other.row_reports, strict=True)]
        self.n += other.n


@dataclass(frozen=True)
class CandidateEstimate(Estimate):
    """`Estimate` over candidate strings, with the two parts of each variance (fractions²).

    `variances` = `noise_variances` + `collision_variances`; `pair_count` is P̂.
    """

    noise_variances: npt.NDArray[np.float64] | None = field(repr=False, default=None)
    collision_variances: npt.NDArray[np.float64] | None = field(repr=False, default=None)
    pair_count: float = 0.0


class Sketch(Mechanism[str, SketchStatistic]):
    """Shared body of CMS and HCMS: hashing, rows, statistic, estimator (module docstring)."""

    _name: ClassVar[str]
    #: The threshold that keeps the truth (CMS: a bit; HCMS: the coefficient's sign).
    keep: DyadicProbability

    def __init__(self, epsilon: Decimal, domain: OpenDomain, rows: int, columns: int) -> None:
        super().__init__(epsilon)
        if not isinstance(domain, OpenDomain):
            raise ValueError(f"{self.wire_id} needs an open-domain metric ([metric] max_bytes)")
        self.domain = domain
        self.k, self.m = check_sketch_size(self.wire_id, rows, columns)

    # --- hashing ---

    def cell(self, row: int, value: str) -> int:
        """h_row(value) (value validated as the open domain requires)."""
        return sketch_hash(row, self.domain.encode(value), self.m)

    def cells(self, value: str) -> list[int]:
        """[h_0(value), ..., h_{k-1}(value)]."""
        data = self.domain.encode(value)
        return [sketch_hash(j, data, self.m) for j in range(self.k)]

    def hash_table(self, values: Iterable[str]) -> npt.NDArray[np.int64]:
        """(len(values), k) int64 table of every row's hash of every value."""
        import numpy as np

        table = [self.cells(v) for v in values]
        return np.asarray(table, dtype=np.int64).reshape(len(table), self.k)

    def batch_cells(
        self, values: Sequence[str], rng: np.random.Generator
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(rows J_i, cells h_{J_i}(s_i)) for a batch, hashing each distinct string once."""
        import numpy as np

        items = np.asarray(values, dtype=object).reshape(-1).tolist()
        distinct = list(dict.fromkeys(items))  # in order of first appearance
        row_of = {v: i for i, v in enumerate(distinct)}  # its row of the hash table
        inverse = np.fromiter(map(row_of.__getitem__, items), dtype=np.int64, count=len(items))
        table = self.hash_table(distinct)
        rows = rng.integers(0, self.k, size=len(items), dtype=np.int64)
        return rows, table[inverse, rows] if items else rows.copy()

    # --- statistic ---

    def new_statistic(self) -> SketchStatistic:
        return SketchStatistic(counts=[0] * (self.k * self.m), row_reports=[0] * self.k)

    def _check_statistic(self, statistic: SketchStatistic) -> None:
        if len(statistic.counts) != self.k * self.m or len(statistic.row_reports) != self.k:
            raise ValueError("statistic does not belong to this sketch's rows and columns")
        if statistic.n != sum(statistic.row_reports):
            raise ValueError("sketch statistic's report count disagrees with its rows")

    def _add_cells(self, statistic: SketchStatistic, cells: Any, rows: Any) -> None:
        """Add a (k·m) cell-count vector and a k row-count vector (numpy) in place."""
        self._check_statistic(statistic)
        statistic.counts = [a + int(b) for a, b in zip(statistic.counts, cells, strict=True)]
        statistic.row_reports = [
            a + int(b) for a, b in zip(statistic.row_reports, rows, strict=True)
        ]
        statistic.n += int(sum(int(b) for b in rows))

    # --- estimation ---

    def estimate(self, statistic: SketchStatistic) -> Estimate:
        """Refused: a sketch estimates candidate strings (`estimate_candidates`)."""
        raise CandidatesRequiredError(
            f"{self.wire_id} is a sketch over an open domain with no list of values: call "
            "estimate_candidates(statistic, candidates) (fedldp report --candidates FILE)"
        )

    @abstractmethod
    def cell_estimates(self, statistic: SketchStatistic) -> npt.NDArray[np.float64]:
        """(k, m) array a[j, l]: unbiased estimates of the reports of row j in cell l."""

    @abstractmethod
    def cell_noise(self, statistic: SketchStatistic) -> float:
        """E[Σ_{j,l} (a[j,l] - X[j,l])^2]: the cell estimates' summed noise variance."""

    @abstractmethod
    def noise_count_variance(self, n: int, count: Any) -> Any:
        """V_noise of the module docstring: Σ_i Var[Y_i | T], given N_d = count."""

    def count_variance(self, n: int, count: Any, other_pairs: Any) -> Any:
        """Exact Var[N̂_d] for N_d = count and P_{-d} = other_pairs (module docstring)."""
        scale = self.m / (self.m - 1)
        noise = scale**2 * self.noise_count_variance(n, count)
        return noise + self.collision_count_variance(n, count, other_pairs)

    def collision_count_variance(self, n: int, count: Any, other_pairs: Any) -> Any:
        """The collision term ((n - N_d) + P_{-d}/k) / (m - 1)."""
        return ((n - count) + other_pairs / self.k) / (self.m - 1)

    def variance(self, n: int, count: Any, other_pairs: Any) -> Any:
        """Exact Var[f̂_d] (a fraction of n): `count_variance` / n^2."""
        return self.count_variance(n, count, other_pairs) / n**2

    def pair_count_estimate(self, statistic: SketchStatistic) -> float:
        """P̂, unbiased for P = Σ_d N_d(N_d - 1), from the sketch's second moment.

        Σ_{j,l} X[j,l]^2 = n + Σ_j (pairs of row j's reports in one cell), whose
        expectation over the hash model is n + Σ_j n_j(n_j - 1)/m + (1 - 1/m) P/k;
        Σ a^2 - `cell_noise` is unbiased for Σ X^2.
        """
        import numpy as np

        a = self.cell_estimates(statistic)
        n = statistic.n
        square = float(np.square(a).sum()) - self.cell_noise(statistic)
        same_row = sum(r * (r - 1) for r in statistic.row_reports) / self.m
        return self.k * self.m / (self.m - 1) * (square - n - same_row)

    def candidate_cells(self, candidates: Sequence[str]) -> npt.NDArray[np.int64]:
        """(C, k) hash table of validated, distinct candidates (`check_candidates`)."""
        self.check_candidates(candidates)
        return self.hash_table(candidates)

    def check_candidates(self, candidates: Sequence[str]) -> None:
        """ValueError unless 1..MAX_CANDIDATES distinct strings of the open domain; the
        message names positions (1-based) and never a candidate's text."""
        if not 1 <= len(candidates) <= MAX_CANDIDATES:
            raise ValueError(f"give 1..{MAX_CANDIDATES} candidate strings, got {len(candidates)}")
        seen: dict[str, int] = {}
        for position, candidate in enumerate(candidates, start=1):
            try:
                self.domain.encode(candidate)
            except ValueError as exc:
                raise ValueError(f"candidate {position}: {exc}") from None
            if candidate in seen:
                raise ValueError(f"candidates {seen[candidate]} and {position} are the same string")
            seen[candidate] = position

    def estimate_candidates(
        self, statistic: SketchStatistic, candidates: Sequence[str]
    ) -> CandidateEstimate:
        """Unbiased frequency (fraction of reports) of each candidate, with its plug-in
        variance including the collision term (module docstring)."""
        import numpy as np

        self._check_statistic(statistic)
        n = statistic.n
        if n <= 0:
            raise ValueError("cannot estimate from zero reports")
        cells = self.candidate_cells(candidates)
        a = self.cell_estimates(statistic)
        support = a[np.arange(self.k)[None, :], cells].sum(axis=1)
        counts = self.m / (self.m - 1) * (support - n / self.m)
        pairs = max(0.0, self.pair_count_estimate(statistic))
        own = np.clip(counts, 0.0, float(n))
        others = np.maximum(0.0, pairs - np.maximum(0.0, own * (own - 1)))
        scale = self.m / (self.m - 1)
        noise = scale**2 * np.asarray(self.noise_count_variance(n, own), dtype=np.float64)
        collision = np.asarray(self.collision_count_variance(n, own, others), dtype=np.float64)
        noise = np.broadcast_to(noise, counts.shape) / n**2
        collision = collision / n**2
        return CandidateEstimate(
            n=n,
            values=counts / n,
            variances=noise + collision,
            noise_variances=np.array(noise, dtype=np.float64),
            collision_variances=collision,
            pair_count=pairs,
        )

    def merge_statistics(self, into: SketchStatistic, other: SketchStatistic) -> None:
        into.merge(other)


class CMS(Sketch):
    """Count Mean Sketch (Apple 2017, Algorithms 1 and 2): SketchRowPayload reports."""

    wire_id = "cms"
    _name = "cms"

    def __init__(self, epsilon: Decimal, domain: OpenDomain, rows: int, columns: int) -> None:
        super().__init__(epsilon, domain, rows, columns)
        # Apple 2017, Algorithm 1: each bit flipped w.p. 1/(1 + e^{ε/2}), rounded UP.
        self.flip = dyadic_from_exp(lambda h: 1 / (h + 1), half(epsilon), round_up=True)
        self.keep = DyadicProbability(PROB_ONE - self.flip.numerator)
        self.p_exact, self.q_exact = self.keep.exact, self.flip.exact
        self.p, self.q = float(self.keep), float(self.flip)
        # One OS read per report: the row (at most 8 bytes, rejection included
        # almost surely) and the flips (`bernoulli_read_bytes`).
        self._read_bytes = 8 + bernoulli_read_bytes(self.m)

    # --- device ---

    def perturb(self, value: str, *, rng: random.Random | None = None) -> SketchRowOutput:
        """One row's randomized one-hot vector (Apple 2017, Algorithm 1).

        Without `rng`, the report's random bits come from one read of the OS
        CSPRNG (`system_random(read_bytes)`), the same law as one read per draw.
        """
        data = self.domain.encode(value)
        r = rng if rng is not None else system_random(self._read_bytes)
        row = r.randrange(self.k)
        bits = bernoulli_bits(self.flip, self.m, r) ^ (1 << sketch_hash(row, data, self.m))
        return SketchRowOutput(row, bits.to_bytes(byte_length(self.m), "little"), self.m)

    def exact_probability(self, cells: Sequence[int], output: Output) -> Fraction:
        """P[perturb(s) == output] for a string s with these k cells, from the thresholds."""
        row, bits = self._check(output)
        expected = 1 << cells[row]
        flipped = (bits ^ expected).bit_count()
        return Fraction(1, self.k) * self.q_exact**flipped * self.p_exact ** (self.m - flipped)

    def perturb_batch(
        self, values: Sequence[str], rng: np.random.Generator
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
        """(rows, packed rows (n, ceil(m/8)) uint8), the same law as `perturb`."""
        from fedldp.client.mechanisms.unary import unary_bits_batch

        rows, cells = self.batch_cells(values, rng)
        return rows, unary_bits_batch(cells, self.m, self.keep, self.flip, rng)

    # --- collector ---

    def _check(self, output: Output) -> tuple[int, int]:
        if not isinstance(output, SketchRowOutput):
            raise OutputDomainError("WRONG_PAYLOAD_TYPE", "cms expects a sketch-row payload")
        if not 0 <= output.row < self.k:
            raise OutputDomainError("OUT_OF_DOMAIN", f"cms row outside [0, {self.k})")
        if output.length != self.m:
            raise OutputDomainError("WRONG_LENGTH", f"cms expects exactly {self.m} bits")
        if not isinstance(output.bits, bytes) or len(output.bits) != byte_length(self.m):
            raise OutputDomainError(
                "WRONG_LENGTH", f"cms expects exactly {byte_length(self.m)} packed bytes"
            )
        bits = int.from_bytes(output.bits, "little")
        if bits >> self.m:
            raise OutputDomainError("OUT_OF_DOMAIN", "cms: padding bits must be zero")
        return output.row, bits

    def check_output(self, output: Output) -> None:
        self._check(output)

    def accumulate(self, statistic: SketchStatistic, output: Output) -> None:
        row, bits = self._check(output)
        counts, base = statistic.counts, row * self.m
        while bits:
            low = bits & -bits
            counts[base + low.bit_length() - 1] += 1
            bits ^= low
        statistic.row_reports[row] += 1
        statistic.n += 1

    def accumulate_batch(self, statistic: SketchStatistic, outputs: Any) -> None:
        """Add (rows, packed rows) as from `perturb_batch`."""
        import numpy as np

        rows, packed = outputs
        rows = np.asarray(rows, dtype=np.int64)
        packed = np.asarray(packed, dtype=np.uint8)
        if packed.ndim != 2 or packed.shape != (rows.shape[0], byte_length(self.m)):
            raise OutputDomainError("WRONG_LENGTH", f"cms expects {self.m}-bit rows")
        if rows.size and (rows.min() < 0 or rows.max() >= self.k):
            raise OutputDomainError("OUT_OF_DOMAIN", f"cms row outside [0, {self.k})")
        cells = np.zeros((self.k, self.m), dtype=np.int64)
        for j in np.unique(rows).tolist():
            cells[j] = column_counts(packed[rows == j], self.m)
        self._add_cells(statistic, cells.reshape(-1), np.bincount(rows, minlength=self.k))

    # --- aggregator ---

    def cell_estimates(self, statistic: SketchStatistic) -> npt.NDArray[np.float64]:
        import numpy as np

        counts = np.asarray(statistic.counts, dtype=np.float64).reshape(self.k, self.m)
        per_row = np.asarray(statistic.row_reports, dtype=np.float64)[:, None]
        return (counts - self.q * per_row) / (self.p - self.q)

    def cell_noise(self, statistic: SketchStatistic) -> float:
        # Every bit of a report has variance p q (p + q = 1), over m cells.
        return self.m * statistic.n * self.p * self.q / (self.p - self.q) ** 2

    def noise_count_variance(self, n: int, count: Any) -> Any:
        return n * self.p * self.q / (self.p - self.q) ** 2


class HCMS(Sketch):
    """Hadamard Count Mean Sketch (Apple 2017, Algorithms 3 and 4): SketchBitPayload reports."""

    wire_id = "hcms"
    _name = "hcms"

    def __init__(self, epsilon: Decimal, domain: OpenDomain, rows: int, columns: int) -> None:
        super().__init__(epsilon, domain, rows, columns)
        # Apple 2017, Algorithm 3: keep the coefficient w.p. e^ε/(1 + e^ε), rounded DOWN.
        self.keep = dyadic_from_exp(lambda e: e / (e + 1), epsilon)
        self.p_exact = self.keep.exact
        self.p = float(self.keep)
        #: c = 1/(2p - 1): E[c · b] = the true coefficient (Apple's c_ε for the realized p).
        self.c = 1.0 / (2.0 * self.p - 1.0)

    @staticmethod
    def coefficient(cell: int, column: int) -> bool:
        """H[cell][column] = +1 (True) or -1 (False), Sylvester order."""
        return (cell & column).bit_count() % 2 == 0

    def perturb(self, value: str, *, rng: random.Random | None = None) -> SketchBitOutput:
        data = self.domain.encode(value)
        r = rng if rng is not None else system_random()
        row = r.randrange(self.k)
        column = r.randrange(self.m)
        kept = self.keep.draw(r)
        truth = self.coefficient(sketch_hash(row, data, self.m), column)
        return SketchBitOutput(row, column, truth == kept)

    def exact_probability(self, cells: Sequence[int], output: Output) -> Fraction:
        """P[perturb(s) == output] for a string s with these k cells, from the threshold."""
        self.check_output(output)
        assert isinstance(output, SketchBitOutput)
        truth = self.coefficient(cells[output.row], output.column)
        side = self.p_exact if output.bit == truth else 1 - self.p_exact
        return side / (self.k * self.m)

    def perturb_batch(
        self, values: Sequence[str], rng: np.random.Generator
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """(rows, columns, bits), the same law as `perturb`."""
        import numpy as np

        rows, cells = self.batch_cells(values, rng)
        columns = np.asarray(rng.integers(0, self.m, size=rows.shape[0]), dtype=np.int64)
        kept = self.keep.draw_batch(rows.shape[0], rng)
        folded = cells & columns
        shift = 32
        while shift:
            folded ^= folded >> shift
            shift //= 2
        truth = (folded & 1) == 0
        return rows, columns, np.asarray(truth == kept, dtype=np.bool_)

    def check_output(self, output: Output) -> None:
        if not isinstance(output, SketchBitOutput):
            raise OutputDomainError("WRONG_PAYLOAD_TYPE", "hcms expects a sketch-bit payload")
        if not 0 <= output.row < self.k:
            raise OutputDomainError("OUT_OF_DOMAIN", f"hcms row outside [0, {self.k})")
        if not 0 <= output.column < self.m:
            raise OutputDomainError("OUT_OF_DOMAIN", f"hcms column outside [0, {self.m})")

    def accumulate(self, statistic: SketchStatistic, output: Output) -> None:
        self.check_output(output)
        assert isinstance(output, SketchBitOutput)
        statistic.counts[output.row * self.m + output.column] += 1 if output.bit else -1
        statistic.row_reports[output.row] += 1
        statistic.n += 1

    def accumulate_batch(self, statistic: SketchStatistic, outputs: Any) -> None:
        """Add (rows, columns, bits) as from `perturb_batch`."""
        import numpy as np

        rows, columns, bits = (np.asarray(x) for x in outputs)
        rows, columns = rows.astype(np.int64), columns.astype(np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.k):
            raise OutputDomainError("OUT_OF_DOMAIN", f"hcms row outside [0, {self.k})")
        if columns.size and (columns.min() < 0 or columns.max() >= self.m):
            raise OutputDomainError("OUT_OF_DOMAIN", f"hcms column outside [0, {self.m})")
        index = rows * self.m + columns
        size = self.k * self.m
        plus = np.bincount(index[bits.astype(bool)], minlength=size)
        total = np.bincount(index, minlength=size)
        self._add_cells(statistic, 2 * plus - total, np.bincount(rows, minlength=self.k))

    def cell_estimates(self, statistic: SketchStatistic) -> npt.NDArray[np.float64]:
        import numpy as np
        from fedldp.client.mechanisms.hadamard import fwht

        signed = np.asarray(statistic.counts, dtype=np.float64).reshape(self.k, self.m)
        # Apple 2017, Algorithm 4: c · (row of signed sums) x H; H is symmetric.
        return np.stack([self.c * fwht(row) for row in signed]) if self.k else signed

    def cell_noise(self, statistic: SketchStatistic) -> float:
        # Var[a[j, l] | X] = n_j c^2 - X[j, l]; summed over l: m n_j c^2 - n_j.
        return statistic.n * (self.m * self.c**2 - 1)

    def noise_count_variance(self, n: int, count: Any) -> Any:
        return n * self.c**2 - count - (n - count) / self.m


def open_metric(wire_id: str, metric: object) -> OpenDomain:
    """The OpenDomain of an open-domain metric, or a clear error."""
    if not isinstance(metric, OpenDomain):
        raise ValueError(f"{wire_id} needs an open-domain metric ([metric] max_bytes = N)")
    return metric


def build_sketch(
    wire_id: str, epsilon: Decimal, metric: object, params: Mapping[str, str]
) -> Sketch:
    """The registry's factory body for "cms" and "hcms"."""
    domain = open_metric(wire_id, metric)
    rows, columns = parse_sketch_params(wire_id, params)
    cls: type[Sketch] = CMS if wire_id == "cms" else HCMS
    return cls(epsilon, domain, rows, columns)


__all__ = [
    "CMS",
    "DEFAULT_COLUMNS",
    "DEFAULT_ROWS",
    "HASH_TAG",
    "HCMS",
    "MAX_CANDIDATES",
    "MAX_CELLS",
    "CandidateEstimate",
    "CandidatesRequiredError",
    "Sketch",
    "SketchStatistic",
    "build_sketch",
    "sketch_hash",
    "sketch_params",
]
