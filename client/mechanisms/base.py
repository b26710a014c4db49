"""The mechanism contract shared by the device, the collector and the aggregator.

A mechanism is one immutable object built from validated parameters taken from a
signed policy. It holds, side by side and written once:

* the randomizer (`perturb`, device side; `perturb_batch`, simulation side),
* its privacy cost (`epsilon`, exact decimal, one report's loss) and what the
  ledger charges per report (`report_charge`, `epsilon` unless memoized),
* the output-domain check the collector runs on every report (`check_output`),
* the additive sufficient statistic (`new_statistic`, `accumulate`),
* the unbiased estimator and its exact variance (`estimate`).

The aggregator never re-derives a mechanism's probabilities: it calls these.

Randomness is an argument. Device code passes nothing and gets the OS CSPRNG
(`secrets.SystemRandom`); tests and simulations pass a seeded `random.Random`
(single values) or `numpy.random.Generator` (batches). The single-value paths must
import and run without numpy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, Union

if TYPE_CHECKING:  # numpy is only needed on batch / estimation paths
    import numpy as np
    import numpy.typing as npt


# --- Outputs: what a randomizer emits; exactly the payload kinds of the wire contract ---


@dataclass(frozen=True, slots=True)
class CategoryOutput:
    """An index in the mechanism's output range (wire: CategoryPayload)."""

    index: int


@dataclass(frozen=True, slots=True)
class BitVectorOutput:
    """`length` bits packed little-endian in each byte (wire: BitVectorPayload)."""

    bits: bytes
    length: int


@dataclass(frozen=True, slots=True)
class HashedOutput:
    """A hash seed and a perturbed hash value (wire: HashedPayload)."""

    seed: int
    value: int


@dataclass(frozen=True, slots=True)
class NumericOutput:
    """A perturbed real number (wire: NumericPayload)."""

    value: float


@dataclass(frozen=True, slots=True)
class IndexBitOutput:
    """An index and one bit (wire: IndexBitPayload), e.g. Hadamard response."""

    index: int
    bit: bool


@dataclass(frozen=True, slots=True)
class SketchRowOutput:
    """A sketch row and its perturbed one-hot column vector (wire: SketchRowPayload, CMS)."""

    row: int
    bits: bytes
    length: int


@dataclass(frozen=True, slots=True)
class SketchBitOutput:
    """A sketch row, a Hadamard coefficient and one perturbed bit (wire: SketchBitPayload, HCMS)."""

    row: int
    column: int
    bit: bool


@dataclass(frozen=True, slots=True)
class GroupHashedOutput:
    """A user group, a hash key and a perturbed hash value (wire: GroupHashedPayload, PEM)."""

    group: int
    key: bytes
    value: int


@dataclass(frozen=True, slots=True)
class IndexBitsOutput:
    """Distinct increasing indices and one bit per index, bit p of `bits` (packed
    little-endian) for indices[p] (wire: IndexBitsPayload, dBitFlipPM)."""

    indices: tuple[int, ...]
    bits: bytes


#: The outputs an attribute of a multi-attribute metric may emit (wire: AttributePayload).
AttributeOutput = Union[  # noqa: UP007
    CategoryOutput, BitVectorOutput, HashedOutput, NumericOutput, IndexBitOutput
]


@dataclass(frozen=True, slots=True)
class MultiOutput:
    """A multi-attribute report (wire: MultiPayload): (attribute index, its output) pairs."""

    parts: tuple[tuple[int, AttributeOutput], ...]


@dataclass(frozen=True, slots=True)
class SealedOutput:
    """A payload sealed to the analyzer of a shuffle-model policy (wire: SealedPayload).

    Not a mechanism's output: the collector charges and stores it without reading it;
    only the analyzer opens it (`fedldp.client.sealed.open_sealed`, docs/shuffle.md).
    """

    ciphertext: bytes
    key_id: str


Output = Union[  # noqa: UP007
    CategoryOutput,
    BitVectorOutput,
    HashedOutput,
    NumericOutput,
    IndexBitOutput,
    SketchRowOutput,
    SketchBitOutput,
    GroupHashedOutput,
    MultiOutput,
    IndexBitsOutput,
    SealedOutput,
]


#: Longest string an open-domain metric may declare (policy OpenDomain.max_bytes).
MAX_OPEN_DOMAIN_BYTES = 64


@dataclass(frozen=True, slots=True)
class OpenDomain:
    """An open string domain (policy `Metric.open`): any str of 1..max_bytes UTF-8
    bytes with no NUL character. `1 <= max_bytes <= MAX_OPEN_DOMAIN_BYTES`."""

    max_bytes: int

    def __post_init__(self) -> None:
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int):
            raise TypeError("OpenDomain.max_bytes must be an int")
        if not 1 <= self.max_bytes <= MAX_OPEN_DOMAIN_BYTES:
            raise ValueError(
                f"an open domain's max_bytes must be 1..{MAX_OPEN_DOMAIN_BYTES}, "
                f"got {self.max_bytes}"
            )

    def encode(self, value: str) -> bytes:
        """The UTF-8 bytes of `value`, or ValueError (never echoing it) when it is not
        a str of 1..max_bytes bytes without NUL."""
        if not isinstance(value, str):
            raise ValueError(f"an open-domain value must be a str, not {type(value).__name__}")
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                "an open-domain value must be valid Unicode (no lone surrogates)"
            ) from None
        if not data:
            raise ValueError("an open-domain value must not be empty")
        if len(data) > self.max_bytes:  # the message says nothing about the value
            raise ValueError(
                f"an open-domain value is longer than max_bytes ({self.max_bytes} UTF-8 bytes)"
            )
        if b"\x00" in data:
            raise ValueError("an open-domain value must not contain a NUL character")
        return data


@dataclass(frozen=True, slots=True)
class AttributeSpec:
    """One attribute of a multi-attribute metric (policy `Attribute`), validated.

    Exactly one of `labels` (categorical, k = len(labels)) and `numeric_range`
    (lo, hi) is set. `mechanism_id` and `params` are the attribute's own
    MechanismSpec; its epsilon is derived by the multi-attribute mechanism
    (fedldp.client.mechanisms.multi).
    """

    name: str
    labels: tuple[str, ...] | None
    numeric_range: tuple[Decimal, Decimal] | None
    mechanism_id: str
    params: tuple[tuple[str, str], ...] = ()

    @property
    def metric(self) -> int | tuple[Decimal, Decimal]:
        """The attribute mechanism's metric argument: k, or (lo, hi)."""
        if self.labels is not None:
            return len(self.labels)
        if self.numeric_range is None:
            raise ValueError(f"attribute {self.name!r} has neither labels nor a numeric range")
        return self.numeric_range


@dataclass(frozen=True, slots=True)
class MultiMetric:
    """A multi-attribute metric (policy `Metric.multi`): its attributes, in policy order."""

    attributes: tuple[AttributeSpec, ...]


#: What a mechanism is built over: a categorical domain size k, a numeric range
#: (lo, hi), an open string domain, or the attributes of a multi-attribute metric.
MetricArg = Union[int, tuple[Decimal, Decimal], OpenDomain, MultiMetric]  # noqa: UP007


class OutputDomainError(ValueError):
    """A report's payload is not a possible output of the mechanism.

    `reason` is the name of a `fedldp.v1.RejectReason` value without its prefix
    (e.g. "OUT_OF_DOMAIN", "WRONG_LENGTH", "WRONG_PAYLOAD_TYPE", "NON_FINITE").
    The message never contains the payload itself.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def system_random(read_bytes: int = 0) -> random.Random:
    """The device's randomness: the OS CSPRNG behind the `random.Random` API.

    `read_bytes` 0: `secrets.SystemRandom` (one OS read per draw). Above 0: a
    `OneReadRandom` that reads that many bytes from the OS CSPRNG at once and
    serves the draws of one report from them (more only in the rare case the
    report needs more); the same law, fewer system calls.
    """
    if read_bytes > 0:
        return OneReadRandom(read_bytes)
    return secrets.SystemRandom()


#: The OS CSPRNG read (a module attribute so tests can feed a known byte stream).
_urandom = os.urandom
#: 2**-53, as in CPython's random module.
_RECIP_BPF = 2.0**-53


class OneReadRandom(random.SystemRandom):
    """OS CSPRNG bytes read ahead in one call, consumed in order by one report's draws.

    Each draw turns the next bytes into a number exactly as `random.SystemRandom`
    turns a fresh ``os.urandom`` read into one (``getrandbits(k)``: the
    big-endian integer of ceil(k/8) bytes shifted right to k bits; ``random()``:
    7 bytes shifted to 53 bits times 2**-53; ``randbytes(n)``: n bytes), so the
    same byte stream gives the same draws (tested): only the number of system
    calls changes, not the law. When the bytes run out, another read of at least
    the same size follows (`reads` counts them). Meant for one report on one
    thread and then dropped: the bytes are never reused and a fork does not
    inherit pending ones (a new object per report).
    """

    def __init__(self, read_bytes: int) -> None:
        """Read `read_bytes` bytes from the OS CSPRNG now (one call)."""
        super().__init__()
        self._block = max(1, read_bytes)
        self._buffer = memoryview(_urandom(self._block))
        self._offset = 0
        #: OS reads made so far (1 unless a report needed more than `read_bytes`).
        self.reads = 1

    def _take(self, n: int) -> memoryview:
        end = self._offset + n
        if end > len(self._buffer):
            rest = bytes(self._buffer[self._offset :])
            self._buffer = memoryview(rest + _urandom(max(n, self._block)))
            self.reads += 1
            self._offset, end = 0, n
        chunk = self._buffer[self._offset : end]
        self._offset = end
        return chunk

    def getrandbits(self, k: int) -> int:
        """k uniform bits from the next ceil(k/8) bytes (as `SystemRandom.getrandbits`)."""
        if k < 0:
            raise ValueError("number of bits must be non-negative")
        numbytes = (k + 7) // 8
        return int.from_bytes(self._take(numbytes), "big") >> (numbytes * 8 - k)

    def random(self) -> float:
        """A float in [0, 1) from the next 7 bytes (as `SystemRandom.random`)."""
        return (int.from_bytes(self._take(7), "big") >> 3) * _RECIP_BPF

    def randbytes(self, n: int) -> bytes:
        """The next n bytes."""
        return bytes(self._take(n))


StatT = TypeVar("StatT")
ValueT = TypeVar("ValueT")


@dataclass(frozen=True)
class Estimate:
    """An unbiased estimate and its exact variance, per output coordinate.

    For a frequency oracle: `values[v]` estimates the fraction of users holding v
    and `variances[v]` is the exact variance of that estimate (including the
    frequency-dependent term, evaluated at the estimate unless the caller supplies
    the truth). For a numeric mechanism: one coordinate, the mean.
    """

    n: int
    values: npt.NDArray[np.float64]
    variances: npt.NDArray[np.float64]


@dataclass
class CountStatistic:
    """Additive counts per coordinate (output index or support), and the number of reports.

    Partial statistics from several collectors merge by addition (`merge`).
    """

    counts: list[int]
    n: int = 0

    def merge(self, other: CountStatistic) -> None:
        """Add another partial statistic (e.g. another collector's) in place."""
        if len(other.counts) != len(self.counts):
            raise ValueError("cannot merge statistics of different domain sizes")
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.n += other.n


#: Fixed-point scales of `MomentStatistic`'s exact sums. Every finite double is
#: num / 2**k with k <= 1074, so x * 2**1074 and x**2 * 2**2148 are integers.
SUM_SCALE_BITS = 1074
SQUARE_SCALE_BITS = 2 * SUM_SCALE_BITS


def _scaled(value: float) -> tuple[int, int]:
    """(value * 2**SUM_SCALE_BITS, value**2 * 2**SQUARE_SCALE_BITS), both exact integers."""
    numerator, denominator = value.as_integer_ratio()
    shift = SUM_SCALE_BITS - (denominator.bit_length() - 1)
    return numerator << shift, (numerator * numerator) << (2 * shift)


@dataclass
class MomentStatistic:
    """Additive sums of a numeric mechanism's outputs: count, sum and sum of squares.

    Outputs are in the mechanism's normalized unit (see `fedldp.client.mechanisms.numeric`).
    The sums are kept exactly, as integers in fixed point (`SUM_SCALE_BITS`,
    `SQUARE_SCALE_BITS`), so adding reports or merging partial statistics in any
    order, on any collector, gives bit-identical results; `total` and `total_sq`
    are their correctly rounded float values.
    """

    n: int = 0
    sum_scaled: int = 0
    sum_sq_scaled: int = 0

    def add(self, value: float) -> None:
        """Add one finite output exactly."""
        scaled, scaled_sq = _scaled(value)
        self.n += 1
        self.sum_scaled += scaled
        self.sum_sq_scaled += scaled_sq

    def add_many(self, values: Iterable[float]) -> None:
        """Add finite outputs exactly (a Python loop: exactness over speed)."""
        listed = list(values)
        self.add_counted(listed, [1] * len(listed))

    def add_counted(self, values: Iterable[float], counts: Iterable[int]) -> None:
        """Add each finite output `values[i]` `counts[i]` times, exactly: the same sums as
        `add_many` over the repeated outputs (integer sums do not depend on the order)."""
        total = total_sq = count = 0
        for value, times in zip(values, counts, strict=True):
            scaled, scaled_sq = _scaled(value)
            total += scaled * times
            total_sq += scaled_sq * times
            count += times
        self.n += count
        self.sum_scaled += total
        self.sum_sq_scaled += total_sq

    @property
    def total(self) -> float:
        """The sum of the outputs, correctly rounded."""
        return self.sum_scaled / (1 << SUM_SCALE_BITS)

    @property
    def total_sq(self) -> float:
        """The sum of the squared outputs, correctly rounded."""
        return self.sum_sq_scaled / (1 << SQUARE_SCALE_BITS)

    def merge(self, other: MomentStatistic) -> None:
        """Add another partial statistic in place (exact)."""
        self.n += other.n
        self.sum_scaled += other.sum_scaled
        self.sum_sq_scaled += other.sum_sq_scaled


class Mechanism(ABC, Generic[ValueT, StatT]):
    """Base of every registered mechanism. Subclasses are frozen after __init__."""

    #: Stable wire id; the registry key, the policy's MechanismSpec.id, ledger rows.
    wire_id: ClassVar[str]

    def __init__(self, epsilon: Decimal) -> None:
        if not isinstance(epsilon, Decimal):
            raise TypeError("epsilon must be a decimal.Decimal (exact), not a float")
        if not epsilon.is_finite() or epsilon <= 0:
            raise ValueError(f"epsilon must be finite and positive, got {epsilon}")
        self._epsilon = epsilon

    @property
    def epsilon(self) -> Decimal:
        """The privacy loss of one report, exact."""
        return self._epsilon

    @property
    def report_charge(self) -> Decimal:
        """What the ledger and the device guard charge per report, exact.

        At least the loss any set of this mechanism's reports adds per report:
        `epsilon` for mechanisms whose reports are independent given the values
        (sequential composition); memoized mechanisms override it (memo.py).
        """
        return self._epsilon

    @abstractmethod
    def perturb(self, value: ValueT, *, rng: random.Random | None = None) -> Output:
        """Randomize one true value. `rng=None` means the OS CSPRNG."""

    @abstractmethod
    def check_output(self, output: Output) -> None:
        """Raise OutputDomainError unless `output` is a possible output."""

    @abstractmethod
    def new_statistic(self) -> StatT:
        """An empty additive sufficient statistic."""

    @abstractmethod
    def accumulate(self, statistic: StatT, output: Output) -> None:
        """Add one checked report to `statistic` in place."""

    @abstractmethod
    def estimate(self, statistic: StatT) -> Estimate:
        """The unbiased estimate and its exact variance from a statistic."""

    # --- Optional fast paths (numpy); every registered mechanism implements them ---

    def perturb_batch(self, values: Any, rng: np.random.Generator) -> Any:
        """Vectorized `perturb` for simulation and benchmarks (same distribution).

        The batch output layout is mechanism-specific and documented by each
        mechanism; `accumulate_batch` takes exactly that layout.
        """
        raise NotImplementedError(f"{type(self).__name__} has no batch path")

    def accumulate_batch(self, statistic: StatT, outputs: Any) -> None:
        """Add a batch of outputs (as returned by `perturb_batch`) to `statistic`."""
        raise NotImplementedError(f"{type(self).__name__} has no batch path")

    def merge_statistics(self, into: StatT, other: StatT) -> None:
        """Add partial statistic `other` into `into` (statistics are additive)."""
        into.merge(other)  # type: ignore[attr-defined]

    def statistic_to_json(self, statistic: StatT) -> str:
        """Serialize a statistic for storage (the collector's statistics table).

        The default covers dataclass statistics whose fields are JSON values
        (ints, lists of ints, decimal strings). Exact: no float rounding may enter
        anything that is merged; a mechanism with other fields overrides this.
        """
        # Shallow (the fields are JSON values already): dataclasses.asdict would
        # deep-copy every list, and this runs once per statistics row per commit.
        fields = {f.name: getattr(statistic, f.name) for f in dataclasses.fields(statistic)}  # type: ignore[arg-type]
        return json.dumps(fields, separators=(",", ":"))

    def statistic_from_json(self, text: str) -> StatT:
        """Inverse of `statistic_to_json`."""
        statistic = self.new_statistic()
        for name, value in json.loads(text).items():
            setattr(statistic, name, value)
        return statistic

    # --- Append-only storage, for statistics that grow with the reports ---

    #: True when the collector stores this mechanism's statistic as append-only chunk
    #: rows, one per commit (`statistic_chunk`), instead of rewriting one JSON row per
    #: commit: a statistic whose size grows with the reports (pem keeps every report)
    #: would make every commit cost as much as the whole window.
    chunked_statistic: ClassVar[bool] = False

    def statistic_chunk(self, statistic: StatT) -> bytes:
        """`statistic` as one chunk (only when `chunked_statistic`): bytes such that the
        concatenation of any chunks, in any order, is the chunk of their merged
        statistic (`statistic_from_chunks` reads it)."""
        raise NotImplementedError(f"{type(self).__name__} keeps its statistic as JSON")

    def statistic_from_chunks(self, data: bytes) -> StatT:
        """The statistic of concatenated chunks (`statistic_chunk`); ValueError, naming
        no value from `data`, when it is not a whole number of this mechanism's
        records or holds one that no report produces."""
        raise NotImplementedError(f"{type(self).__name__} keeps its statistic as JSON")

    def chunk_count(self, data: bytes) -> int:
        """How many reports concatenated chunks hold (ValueError when `data` is not a
        whole number of records)."""
        raise NotImplementedError(f"{type(self).__name__} keeps its statistic as JSON")
