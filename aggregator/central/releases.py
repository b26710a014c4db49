"""Central DP releases over consolidated data: count, sum, mean, choice, histogram, quantile.

Every release follows the same order, enforced by this module and by the
reservation lifecycle it shares with DP-SGD training (reservations.py):

1. validate the request (bounds, ε, δ, mechanism) - bad input changes nothing;
2. claim (ε, δ) in the ledger by (subject, purpose) with the caller's
   idempotency key and a fresh owner token (`Ledger.reserve`; the cap comes
   from the ledger, never from the caller); an exhausted budget raises
   `CentralBudgetExhaustedError` before any data is read;
3. record durably that the data is being opened (`Ledger.open_data`) - before
   the first byte is read; the claim of step 2 commits this mark in its own
   transaction (`Ledger.reserve(open_data=True)`: nothing can fail between the
   two), except through a ledger view that must still be able to cancel the
   claim (the service's analyst-cap hold), which opens separately;
4. only then call `load()` to read the protected data, compute the true
   aggregate exactly (decimal arithmetic on clipped values), round it to the
   noise lattice and add exact integer noise (`noise.py`);
5. settle the reservation with the spent (ε, δ) and one event per noise draw
   (kind, parameters, the released output) so that composition can be
   recomputed from the ledger alone and a retry can return the same output;
6. return the noised value. The true aggregate is never logged, stored or
   returned, and an exception never carries it.

Refund rule: only a failure before step 3 committed (nothing was read)
cancels the reservation. From step 3 on, any outcome - success, a data error
such as a non-numeric value, KeyboardInterrupt - settles it as spent, the full
reserved (ε, δ): a data-dependent failure is itself an output. A crash leaves
it open (charged) until an operator settles it (`fedldp ledger reservations`).

Retrying with the same idempotency key returns the original release, charged
once, without reading the data again; while the first run still holds the
key, a retry raises `ReleaseInProgressError`; a key whose run failed after
reading raises `ReleaseFailedError`, a cancelled one `ReleaseCancelledError`.

Neighbouring datasets differ by adding or removing one record (unbounded DP).
Sensitivities: count 1; sum of values clipped to [L, U]: max(|L|, |U|); mean
= M + noisy Σ(x − M) / noisy count, M = (L + U)/2, the centred sum's
sensitivity (U − L)/2, with ε (and δ) split equally (basic composition;
`private_mean`);
the exponential mechanism's utility is the count of each candidate (Δu = 1).
With a per-unit contribution bound k (`contribution_bound`, for data where one
privacy unit owns up to k records and the caller has already kept at most k
records per unit), neighbours differ by a whole unit: every sensitivity above
is multiplied by k (Dwork and Roth 2014, Section 2.3, group privacy of size k
replaced by the exact bound on the unit's records).

Secure noise: the clipped sum is rounded to the lattice γℤ (round half up,
which commutes with integer shifts, so the lattice sensitivity is ⌈Δ/γ⌉),
then exact discrete Laplace or discrete Gaussian noise (CKS20) in lattice
units is added and the result multiplied by γ as an exact Decimal: the
released value is always a multiple of γ, whatever the true value, which is
what defeats Mironov's (2012) least-significant-bit attack on float noise.
"""

from __future__ import annotations

import enum
import json
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, Inexact, InvalidOperation, localcontext
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypedDict

from fedldp.aggregator.central import quantile as qm
from fedldp.aggregator.central.calibration import (
    GaussianCalibration,
    calibrate_discrete_gaussian,
    gaussian_sigma,
)
from fedldp.aggregator.central.datakey import KeyedDigest
from fedldp.aggregator.central.noise import discrete_gaussian, discrete_laplace, geometric
from fedldp.aggregator.central.reservations import CentralLedger, Reservation, ReservationAsk
from fedldp.client.mechanisms.base import system_random

if TYPE_CHECKING:
    from typing_extensions import Unpack


class NoiseMechanism(str, enum.Enum):
    """Additive noise for count, sum and mean."""

    LAPLACE = "laplace"
    GAUSSIAN = "gaussian"


class ReleaseError(Exception):
    """Base of central-release errors (besides the ledger's own)."""


class ReleaseCancelledError(ReleaseError):
    """The idempotency key names a cancelled release; retry with a new key."""


class ReleaseConflictError(ReleaseError):
    """The idempotency key was used for a different query."""


class ReleaseInProgressError(ReleaseError):
    """Another run holds the reservation of this idempotency key; it is not computed twice."""


class ReleaseFailedError(ReleaseError):
    """The run of this idempotency key failed after reading data: charged, nothing released."""


#: Lease of a release's claim: a release reads its data and settles within seconds.
RELEASE_LEASE_SECONDS = 600


class _RequiredRequestFields(TypedDict):
    subject: str
    purpose: str
    idempotency_key: str
    now: int


class RequestFields(_RequiredRequestFields, total=False):
    """The keyword arguments of `ReleaseRequest`, which every release function takes."""

    rng: random.Random | None
    data_digest: Callable[[], KeyedDigest] | None
    contribution_bound: int
    query: Mapping[str, str] | None
    receipt_key_id: str


@dataclass(frozen=True)
class ReleaseRequest:
    """What every central release shares, whatever its query: who is charged, under
    which idempotency key and clock, how its randomness is drawn and recorded, how
    its data is bound in receipts, and the per-unit contribution bound.

    `subject`, `purpose`: the central budget charged (its cap is the ledger's).
    `idempotency_key`: a retry with it returns the first run's output, charged once.
    `now`: the ledger clock (epoch seconds) of the reservation and its transitions.
    `rng`: None draws from the OS CSPRNG (recorded as "os-csprng"); a caller's
    generator is recorded as "seeded". `data_digest()`, called after the data
    was read, returns the keyed digest stored in every event (datakey.py).
    `contribution_bound` k: records one privacy unit may own; each query checks
    it (a positive int) in its own order of checks, before anything is reserved.
    `query`: the caller's own query parameters (a column, q, ...), recorded in
    the reservation's metadata as "query.<name>" (`_with_query`).
    `receipt_key_id`: the key id of the only key that may sign this release's
    receipt, bound in its reservation (`Ledger.reserve`); "" when none is signed.
    """

    subject: str
    purpose: str
    idempotency_key: str
    now: int
    rng: random.Random | None = None
    data_digest: Callable[[], KeyedDigest] | None = None
    contribution_bound: int = 1
    query: Mapping[str, str] | None = None
    receipt_key_id: str = ""

    @property
    def randomness(self) -> str:
        """The randomness source recorded in the release's events."""
        return "os-csprng" if self.rng is None else "seeded"

    def generator(self) -> random.Random:
        """The generator noise is drawn from: the caller's, or the OS CSPRNG."""
        return self.rng if self.rng is not None else system_random()


@dataclass(frozen=True)
class CentralRelease:
    """A released value and how it was protected. Never holds the true aggregate.

    `value` is the noised release (a Decimal multiple of `granularity`, or the
    chosen label for a private choice). `noise_scale` is the Laplace scale or
    Gaussian σ in value units; `calibration` states which bound was applied.
    """

    kind: str
    value: Decimal | str
    mechanism: str
    epsilon: Decimal
    delta: Decimal
    sensitivity: Decimal
    granularity: Decimal
    noise_scale: float
    calibration: str
    reservation_id: str
    parts: Mapping[str, Decimal] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (decimals as exact strings)."""
        return {
            "kind": self.kind,
            "value": str(self.value),
            "mechanism": self.mechanism,
            "epsilon": str(self.epsilon),
            "delta": str(self.delta),
            "sensitivity": str(self.sensitivity),
            "granularity": str(self.granularity),
            "noise_scale": self.noise_scale,
            "calibration": self.calibration,
            "reservation_id": self.reservation_id,
            "parts": {k: str(v) for k, v in self.parts.items()},
        }


@dataclass(frozen=True)
class Bounded:
    """The bounded true aggregate an engine computed (aggregator/engines), which `load()`
    may return instead of the records: the engine already kept at most k records per
    unit and clipped every value, so only these few numbers leave it.

    `count`: records (a count) or non-NULL values (a sum, a mean); `total`: the sum
    of the clipped values; `counts`: records per categorical value (histogram,
    choice); `cells`: the quantile grid's (on, between) record counts
    (quantile.cells). The release function's `compute` alone sees it.
    """

    count: int = 0
    total: Decimal = Decimal(0)
    counts: Mapping[str, int] | None = None
    cells: tuple[Sequence[int], Sequence[int]] | None = None


def _records(loaded: Iterable[object] | Bounded) -> int:
    """How many records `load()` gave (an engine's bounded count, or by counting)."""
    if isinstance(loaded, Bounded):
        return loaded.count
    return sum(1 for _ in loaded)


def _value_counts(loaded: Iterable[object] | Bounded) -> Iterable[tuple[str, int]]:
    """(value, records) pairs of categorical records (repeated pairs add up)."""
    if isinstance(loaded, Bounded):
        return (loaded.counts or {}).items()
    return ((str(record), 1) for record in loaded)


# --- exact helpers ---


def _to_decimal(value: object) -> Decimal:
    """An exact Decimal from an int, Decimal, str or float (floats convert exactly)."""
    if isinstance(value, bool):
        raise TypeError("booleans are not numeric data")
    if isinstance(value, Decimal):
        d = value
    elif isinstance(value, int | float | str):
        try:
            d = Decimal(value)
        except InvalidOperation:
            raise ValueError("data contains a value that is not a number") from None
    else:
        raise TypeError("data values must be int, float, str or Decimal")
    if not d.is_finite():
        raise ValueError("data contains a non-finite value")
    return d


def _round_half_up(x: Fraction) -> int:
    """floor(x + 1/2): monotone and shift-equivariant, so |Δ rounded| ≤ ⌈|Δ|⌉."""
    return math.floor(x + Fraction(1, 2))


def _lattice_sensitivity(sensitivity: Decimal, granularity: Decimal) -> int:
    return math.ceil(Fraction(sensitivity) / Fraction(granularity))


def _default_granularity(scale: float) -> Decimal:
    """A power of ten 10³-10⁴ times finer than the noise scale (output precision)."""
    return Decimal(1).scaleb(math.floor(math.log10(scale)) - 3)


def _check_budget(mechanism: NoiseMechanism, epsilon: Decimal, delta: Decimal) -> None:
    if not isinstance(epsilon, Decimal) or not isinstance(delta, Decimal):
        raise TypeError("epsilon and delta must be decimal.Decimal (exact)")
    if not epsilon.is_finite() or epsilon <= 0:
        raise ValueError("epsilon must be finite and positive")
    if mechanism is NoiseMechanism.LAPLACE and delta != 0:
        raise ValueError("the Laplace mechanism is pure DP: pass delta=0")
    if mechanism is NoiseMechanism.GAUSSIAN and not 0 < delta < 1:
        raise ValueError("the Gaussian mechanism needs 0 < delta < 1")


@dataclass(frozen=True)
class _NoisePlan:
    """Calibrated noise for one additive query, in lattice units."""

    mechanism: NoiseMechanism
    epsilon: Decimal
    delta: Decimal
    sensitivity: Decimal
    granularity: Decimal
    lattice_sensitivity: int
    lattice_scale: Fraction  # Laplace scale t, or σ² for the Gaussian
    noise_scale: float  # value units: Laplace b or Gaussian σ
    calibration: str

    def event(self, name: str) -> dict[str, object]:
        """The ledger event for one draw of this noise (parameters, no data)."""
        base: dict[str, object] = {
            "query": name,
            "epsilon": str(self.epsilon),
            "delta": str(self.delta),
            "sensitivity": str(self.sensitivity),
            "granularity": str(self.granularity),
            "lattice_sensitivity": self.lattice_sensitivity,
            "calibration": self.calibration,
        }
        if self.mechanism is NoiseMechanism.LAPLACE:
            base["kind"] = "discrete_laplace"
            base["scale"] = str(self.lattice_scale)
        else:
            base["kind"] = "discrete_gaussian"
            sigma = math.sqrt(float(self.lattice_scale))
            base["sigma"] = sigma
            base["noise_multiplier"] = sigma / self.lattice_sensitivity
        return base

    def noised(self, true_value: Decimal, rng: random.Random) -> Decimal:
        """Round `true_value` to the lattice, add exact noise, scale back (exact)."""
        lattice = _round_half_up(Fraction(true_value) / Fraction(self.granularity))
        if self.mechanism is NoiseMechanism.LAPLACE:
            noise = discrete_laplace(self.lattice_scale, rng)
        else:
            noise = discrete_gaussian(self.lattice_scale, rng)
        return Decimal(lattice + noise) * self.granularity


def plan_noise(
    mechanism: NoiseMechanism | str,
    *,
    epsilon: Decimal,
    delta: Decimal,
    sensitivity: Decimal,
    granularity: Decimal | None = None,
    calibration: GaussianCalibration | str = GaussianCalibration.ANALYTIC,
) -> _NoisePlan:
    """Calibrate lattice noise for an additive query of `sensitivity` (value units)."""
    mech = NoiseMechanism(mechanism)
    _check_budget(mech, epsilon, delta)
    if not isinstance(sensitivity, Decimal) or sensitivity <= 0:
        raise ValueError("sensitivity must be a positive Decimal")
    eps = float(epsilon)
    if granularity is None:
        rough = (
            float(sensitivity) / eps
            if mech is NoiseMechanism.LAPLACE
            else gaussian_sigma(float(sensitivity), eps, float(delta), calibration)
        )
        granularity = _default_granularity(rough)
    if not isinstance(granularity, Decimal) or not granularity.is_finite() or granularity <= 0:
        raise ValueError("granularity must be a positive Decimal")
    lat = _lattice_sensitivity(sensitivity, granularity)
    if mech is NoiseMechanism.LAPLACE:
        scale = Fraction(lat) / Fraction(epsilon)  # Δ/ε, exact rational
        return _NoisePlan(
            mech,
            epsilon,
            delta,
            sensitivity,
            granularity,
            lat,
            scale,
            float(scale) * float(granularity),
            "laplace: b = Δ/ε (pure ε-DP)",
        )
    cal = calibrate_discrete_gaussian(lat, eps, float(delta), calibration)
    sigma2 = Fraction(cal.sigma) ** 2
    how = (
        "analytic Gaussian (Balle and Wang 2018), valid for every ε"
        if cal.calibration is GaussianCalibration.ANALYTIC
        else "classic Gaussian bound (Dwork and Roth 2014, Thm A.1), valid for ε < 1"
    )
    return _NoisePlan(
        mech,
        epsilon,
        delta,
        sensitivity,
        granularity,
        lat,
        sigma2,
        cal.sigma * float(granularity),
        how + f"; discrete Gaussian δ(ε) = {cal.delta_achieved:.3g}",
    )


# --- the release engine ---


def _replay(
    ledger: CentralLedger, metadata: Mapping[str, str], subject: str, purpose: str
) -> Callable[[Any], tuple[str, list[Mapping[str, object]]]]:
    """The releases' answer for a key another run claimed (`Reservation.claim`'s
    `when_taken`): that run's published output, or a refusal saying why there is none."""

    def answer(reservation: Any) -> tuple[str, list[Mapping[str, object]]]:
        prior_meta = dict(getattr(reservation, "metadata", None) or {})
        if prior_meta and prior_meta != dict(metadata):
            raise ReleaseConflictError(
                "this idempotency key was used for a different query; use a new key"
            )
        rid = str(reservation.id)
        if reservation.status == "cancelled":
            raise ReleaseCancelledError(
                "the release with this idempotency key was cancelled before it read any "
                "data; retry with a new key"
            )
        if reservation.status == "reserved":
            raise ReleaseInProgressError(
                f"another run holds this idempotency key (reservation {rid}, lease until "
                f"{reservation.lease_expires_at}); it is never released twice: retry later "
                "for its result"
            )
        one = getattr(ledger, "release_events", None)  # this release's row only
        events = (
            [e.event for e in one(rid)[1]]
            if one is not None
            else [
                e.event for e in ledger.central_events(subject, purpose) if e.reservation_id == rid
            ]
        )
        if not events:
            raise ReleaseFailedError(
                f"the release with this idempotency key (reservation {rid}) failed after "
                f"reading the data ({reservation.close_reason}); its budget is spent and "
                "nothing was released"
            )
        return rid, events

    return answer


def _run_release(
    ledger: CentralLedger,
    request: ReleaseRequest,
    *,
    epsilon: Decimal,
    delta: Decimal,
    metadata: Mapping[str, str],
    compute: Callable[[], list[dict[str, object]]],
    randomness: str,
) -> tuple[str, list[Mapping[str, object]]]:
    """Claim, mark the data opened, compute (reading data), settle; (reservation id, events).

    A failure at any step after the claim, a failed final settle included, closes
    the reservation by the refund rule (`Reservation.close_failed`).

    The reservation's lifecycle and the refund rule are reservations.py's (every
    transition stamped `request.now`); a key another run claimed is never computed
    again: its published output is returned, or the call is refused (`_replay`).
    `randomness` (`ReleaseRequest.randomness`) is stored in every event, so a
    receipt's randomness comes from the ledger's record. `request.data_digest()`,
    called after `compute`, must return a `KeyedDigest` (datakey.py: an HMAC
    under the secret data-digest key, never a plain hash of the data); its MAC
    and key id are stored in every event.
    """
    subject, purpose, now = request.subject, request.purpose, request.now
    metadata = _with_query(metadata, request.query)
    ask = ReservationAsk(
        subject=subject,
        purpose=purpose,
        epsilon=epsilon,
        delta=delta,
        idempotency_key=request.idempotency_key,
        metadata=metadata,
        lease_seconds=RELEASE_LEASE_SECONDS,
        receipt_key_id=request.receipt_key_id,
        open_at_claim=True,  # nothing between claim and read: one commit for both
    )
    held = Reservation.claim(
        ledger, ask, clock=lambda: now, when_taken=_replay(ledger, metadata, subject, purpose)
    )
    if not isinstance(held, Reservation):
        return held
    try:
        held.open_data()
        events = compute()
        for event in events:
            event["randomness"] = randomness
        if request.data_digest is not None:  # the keyed data binding, for signed receipts
            _bind_data(events, request.data_digest())
        held.settle(epsilon, delta, events)
    except BaseException as exc:
        # Any failure, the final settle's included: cancelled if nothing was read,
        # else settled in full as spent with nothing released.
        held.close_failed(exc)
        raise
    return held.reservation_id, list(events)


def _bind_data(events: list[dict[str, object]], digest: object) -> None:
    """Store a keyed data digest in every event; a plain hash is refused (datakey.py)."""
    if not isinstance(digest, KeyedDigest):
        raise TypeError(
            "data_digest must return a datakey.KeyedDigest (HMAC under the data-digest key): "
            "a plain hash of protected data is never published"
        )
    for event in events:
        event["data_hmac_sha256"] = digest.mac
        event["data_key_id"] = digest.key_id


def _output(events: Sequence[Mapping[str, object]], query: str) -> Decimal:
    for e in events:
        if e.get("query") == query:
            return Decimal(str(e["output"]))
    raise ReleaseError(f"the ledger holds no output for part {query!r} of this release")


def _clipped_sum(
    values: Iterable[object] | Bounded, lower: Decimal, upper: Decimal
) -> tuple[Decimal, int]:
    if isinstance(values, Bounded):
        return values.total, values.count
    total = Decimal(0)
    count = 0
    for v in values:
        d = _to_decimal(v)
        total += min(max(d, lower), upper)
        count += 1
    return total, count


def _bound(contribution_bound: int) -> int:
    """The per-unit contribution bound k, a positive int."""
    if isinstance(contribution_bound, bool) or not isinstance(contribution_bound, int):
        raise TypeError("contribution_bound must be an int")
    if contribution_bound < 1:
        raise ValueError("contribution_bound must be at least 1")
    return contribution_bound


def _check_bounds(lower: Decimal, upper: Decimal) -> Decimal:
    if not isinstance(lower, Decimal) or not isinstance(upper, Decimal):
        raise TypeError("clipping bounds must be decimal.Decimal (exact)")
    if not (lower.is_finite() and upper.is_finite()) or not lower < upper:
        raise ValueError("clipping bounds must be finite with lower < upper")
    return max(abs(lower), abs(upper))


def _meta(kind: str, mechanism: str, **extra: object) -> dict[str, str]:
    out = {"kind": kind, "mechanism": mechanism}
    out.update({k: str(v) for k, v in extra.items()})
    return out


def _with_query(meta: Mapping[str, str], query: Mapping[str, str] | None) -> dict[str, str]:
    """`meta` plus the caller's query parameters (column, q, ...) under "query.<name>".

    They are part of the reservation's metadata, so an idempotency key reused
    with any differing parameter is a conflict (ReleaseConflictError), and the
    receipt (built from the ledger) says what was asked.
    """
    out = dict(meta)
    out.update({f"query.{k}": str(v) for k, v in sorted((query or {}).items())})
    return out


def exact_half(value: Decimal, name: str = "value") -> Decimal:
    """value / 2, exactly (a finite decimal's half has at most one more digit).

    The default 28-digit context would round a half of a longer decimal, up as
    often as down, so noise could be calibrated to more ε than the ledger charges.
    """
    if not value.is_finite():
        raise ValueError(f"{name} must be a finite decimal")
    with localcontext() as ctx:
        ctx.prec = len(value.as_tuple().digits) + 2
        ctx.traps[Inexact] = True  # a guard: never raised for a finite decimal
        return value / 2


def _bounded_meta(kind: str, plan: _NoisePlan, lower: Decimal, upper: Decimal) -> dict[str, str]:
    """Metadata of a release over values clipped to [lower, upper] (sum, mean)."""
    return _meta(
        kind,
        plan.mechanism.value,
        lower=lower,
        upper=upper,
        granularity=plan.granularity,
        calibration=plan.calibration,
    )


def _one_query_release(
    ledger: CentralLedger,
    plan: _NoisePlan,
    query: str,
    true_value: Callable[[], Decimal],
    request: ReleaseRequest,
    metadata: Mapping[str, str],
) -> CentralRelease:
    """Charge `plan`'s (ε, δ), then release `true_value()` (read only after the reservation)
    with one draw of `plan`'s noise; a retry returns the output the ledger kept."""
    r = request.generator()

    def compute() -> list[dict[str, object]]:
        value = true_value()
        event = plan.event(query)
        event["output"] = str(plan.noised(value, r))
        return [event]

    rid, events = _run_release(
        ledger,
        request,
        epsilon=plan.epsilon,
        delta=plan.delta,
        metadata=metadata,
        compute=compute,
        randomness=request.randomness,
    )
    return CentralRelease(
        query,
        _output(events, query),
        plan.mechanism.value,
        plan.epsilon,
        plan.delta,
        plan.sensitivity,
        plan.granularity,
        plan.noise_scale,
        plan.calibration,
        rid,
    )


def private_count(
    ledger: CentralLedger,
    *,
    epsilon: Decimal,
    load: Callable[[], Iterable[object] | Bounded],
    mechanism: NoiseMechanism | str = NoiseMechanism.LAPLACE,
    delta: Decimal = Decimal(0),
    calibration: GaussianCalibration | str = GaussianCalibration.ANALYTIC,
    **fields: Unpack[RequestFields],
) -> CentralRelease:
    """A noised count of the records `load()` yields (sensitivity k, granularity 1).

    `fields`: the `ReleaseRequest` (who is charged, key, clock, rng, data digest, k).
    """
    request = ReleaseRequest(**fields)
    plan = plan_noise(
        mechanism,
        epsilon=epsilon,
        delta=delta,
        sensitivity=Decimal(_bound(request.contribution_bound)),
        granularity=Decimal(1),
        calibration=calibration,
    )
    return _one_query_release(
        ledger,
        plan,
        "count",
        lambda: Decimal(_records(load())),
        request,
        _meta("count", plan.mechanism.value, calibration=plan.calibration),
    )


def private_sum(
    ledger: CentralLedger,
    *,
    epsilon: Decimal,
    load: Callable[[], Iterable[object] | Bounded],
    lower: Decimal,
    upper: Decimal,
    mechanism: NoiseMechanism | str = NoiseMechanism.LAPLACE,
    delta: Decimal = Decimal(0),
    granularity: Decimal | None = None,
    calibration: GaussianCalibration | str = GaussianCalibration.ANALYTIC,
    **fields: Unpack[RequestFields],
) -> CentralRelease:
    """A noised sum of values clipped to [lower, upper]; sensitivity k·max(|lower|, |upper|).

    `fields`: the `ReleaseRequest` (who is charged, key, clock, rng, data digest, k).
    """
    request = ReleaseRequest(**fields)
    sens = _check_bounds(lower, upper) * _bound(request.contribution_bound)
    plan = plan_noise(
        mechanism,
        epsilon=epsilon,
        delta=delta,
        sensitivity=sens,
        granularity=granularity,
        calibration=calibration,
    )
    return _one_query_release(
        ledger,
        plan,
        "sum",
        lambda: _clipped_sum(load(), lower, upper)[0],
        request,
        _bounded_meta("sum", plan, lower, upper),
    )


def centre_of(lower: Decimal, upper: Decimal) -> Decimal:
    """The midpoint (lower + upper) / 2 of the clipping bounds, exactly."""
    return exact_half(lower + upper, "lower + upper")


def mean_of(
    noisy_sum: Decimal, noisy_count: Decimal, lower: Decimal, upper: Decimal, *, centred: bool
) -> Decimal:
    """The released mean from its two noisy parts (post-processing, one copy for the
    releases, grouped tables and receipt verification): the midpoint when the noisy
    count is below 1, else clipped into [lower, upper] either the centred form
    midpoint + noisy Σ(x − midpoint) / noisy count, or (`centred=False`, the form of
    releases recorded before it) noisy Σx / noisy count."""
    if noisy_count < 1:
        return (lower + upper) / 2
    ratio = noisy_sum / noisy_count
    return min(max(centre_of(lower, upper) + ratio if centred else ratio, lower), upper)


def private_mean(
    ledger: CentralLedger,
    *,
    epsilon: Decimal,
    load: Callable[[], Iterable[object] | Bounded],
    lower: Decimal,
    upper: Decimal,
    mechanism: NoiseMechanism | str = NoiseMechanism.LAPLACE,
    delta: Decimal = Decimal(0),
    granularity: Decimal | None = None,
    calibration: GaussianCalibration | str = GaussianCalibration.ANALYTIC,
    **fields: Unpack[RequestFields],
) -> CentralRelease:
    """midpoint + noised Σ(x − midpoint) / noised count, each part with half of (ε, δ);
    clipped into [lower, upper] (x: the values clipped to [lower, upper]).

    The centred sum (event "centred_sum", its midpoint recorded as "centre") has
    sensitivity k·(upper − lower)/2: one unit's k clipped values each move it by at
    most half the range, where a plain sum moves by max(|lower|, |upper|) (twice
    as much for bounds [0, U]). This is the mean of PipelineDP
    (`dp_computations.compute_dp_mean`: "normalized sum" around the middle of the
    bounds) and of Google's differential-privacy library (BoundedMean); the
    estimator is Li et al. 2016, "Differential Privacy: From Theory to Practice",
    Section 2.5.3 (noisy sum of values shifted by the midpoint over a noisy count).
    The count's sensitivity is k. The budget split, ε/2 and δ/2 per part
    (basic composition), is in each event. The ratio is post-processing; the
    result is clipped to the bounds and is the midpoint when the noised count is
    below 1 (`mean_of`). `parts` holds the two released parts (the noised centred
    sum and the noised count), which are public too.
    `fields`: the `ReleaseRequest` (who is charged, key, clock, rng, data digest, k).
    """
    request = ReleaseRequest(**fields)
    k = _bound(request.contribution_bound)
    _check_bounds(lower, upper)
    centre = centre_of(lower, upper)
    sens = exact_half(upper - lower, "upper - lower") * k
    half_eps, half_delta = exact_half(epsilon, "epsilon"), exact_half(delta, "delta")
    sum_plan = plan_noise(
        mechanism,
        epsilon=half_eps,
        delta=half_delta,
        sensitivity=sens,
        granularity=granularity,
        calibration=calibration,
    )
    count_plan = plan_noise(
        mechanism,
        epsilon=half_eps,
        delta=half_delta,
        sensitivity=Decimal(k),
        granularity=Decimal(1),
        calibration=calibration,
    )
    r = request.generator()

    def compute() -> list[dict[str, object]]:
        total, count = _clipped_sum(load(), lower, upper)
        e_sum = sum_plan.event("centred_sum")
        e_sum["centre"] = str(centre)
        e_sum["output"] = str(sum_plan.noised(total - centre * count, r))
        e_count = count_plan.event("count")
        e_count["output"] = str(count_plan.noised(Decimal(count), r))
        return [e_sum, e_count]

    rid, events = _run_release(
        ledger,
        request,
        epsilon=epsilon,
        delta=delta,
        metadata=_bounded_meta("mean", sum_plan, lower, upper),
        compute=compute,
        randomness=request.randomness,
    )
    centred = any(e.get("query") == "centred_sum" for e in events)  # a replay may be older
    noisy_sum = _output(events, "centred_sum" if centred else "sum")
    noisy_count = _output(events, "count")
    mean = mean_of(noisy_sum, noisy_count, lower, upper, centred=centred)
    return CentralRelease(
        "mean",
        mean,
        sum_plan.mechanism.value,
        epsilon,
        delta,
        sens,
        sum_plan.granularity,
        sum_plan.noise_scale,
        sum_plan.calibration,
        rid,
        parts={"centred_sum" if centred else "sum": noisy_sum, "count": noisy_count},
    )


def exponential_choice(
    utilities: Sequence[int], epsilon: Decimal, rng: random.Random, *, sensitivity: int = 1
) -> int:
    """Private choice with the exponential mechanism's guarantee, in data-independent work.

    Report-noisy-max with one-sided geometric noise: draw a uniform random
    priority order of the k candidates, then Z_i ~ one-sided geometric with
    P[Z_i ≥ z] = exp(−λz), λ = ε/(2Δu), for every candidate (exact, CKS20
    Algorithm 2 without its sign: noise.geometric), and return the candidate
    with the largest u_i + Z_i (ties to the earlier in the priority order).

    Privacy (the argument of Dwork and Roth 2014, Claim 3.9, for report-noisy-
    max; McKenna and Sheldon, "Permute-and-Flip", NeurIPS 2020, and Ding et
    al. 2021 show that report-noisy-max with exponential noise is permute-and-
    flip, ε-DP like the exponential mechanism, McSherry and Talwar 2007): fix
    the order and Z_j for j ≠ i; i wins iff Z_i ≥ T for an integer threshold T
    that moves by at most 2Δu between neighbours, and P[Z_i ≥ T] = e^{−λ
    max(T, 0)}, so the odds change by at most e^{2Δu·λ} = e^ε. Utilities must
    be integers. Every random draw is made before the utilities are looked at
    and depends on the generator alone, so the number of draws, and the work,
    are the same on neighbouring datasets (no data-dependent rejection loop).
    """
    if not utilities:
        raise ValueError("no candidates")
    if sensitivity < 1:
        raise ValueError("utility sensitivity must be a positive integer")
    if not all(isinstance(u, int) and not isinstance(u, bool) for u in utilities):
        raise TypeError("utilities must be integers")
    k = len(utilities)
    order = list(range(k))
    rng.shuffle(order)
    priority = {candidate: rank for rank, candidate in enumerate(order)}
    scale = Fraction(2 * sensitivity) / Fraction(epsilon)  # 1/λ
    noise = [geometric(scale, rng) for _ in range(k)]
    return max(range(k), key=lambda i: (utilities[i] + noise[i], -priority[i]))


def private_choice(
    ledger: CentralLedger,
    *,
    epsilon: Decimal,
    candidates: Sequence[str],
    load: Callable[[], Iterable[str] | Bounded],
    **fields: Unpack[RequestFields],
) -> CentralRelease:
    """Choose the (approximately) most frequent candidate with the exponential mechanism.

    Utility of a candidate = the number of records equal to it (Δu = k under
    add/remove of one unit of at most k records); records that are not
    candidates count for nothing. `fields`: the `ReleaseRequest`.
    """
    request = ReleaseRequest(**fields)
    k = _bound(request.contribution_bound)
    _check_budget(NoiseMechanism.LAPLACE, epsilon, Decimal(0))
    names = [str(c) for c in candidates]
    if not names or len(set(names)) != len(names):
        raise ValueError("candidates must be a non-empty list of distinct labels")
    index = {c: i for i, c in enumerate(names)}
    r = request.generator()

    def compute() -> list[dict[str, object]]:
        counts = [0] * len(names)
        for record, n in _value_counts(load()):
            i = index.get(record)
            if i is not None:
                counts[i] += n
        chosen = exponential_choice(counts, epsilon, r, sensitivity=k)
        return [
            {
                "kind": "exponential",
                "query": "choice",
                "epsilon": str(epsilon),
                "delta": "0",
                "utility_sensitivity": k,
                "candidates": len(names),
                "sampler": (
                    "report-noisy-max, one-sided geometric noise of scale "
                    "2*utility_sensitivity/epsilon"
                ),
                "output": names[chosen],
            }
        ]

    digest = json.dumps(names, separators=(",", ":"))
    rid, events = _run_release(
        ledger,
        request,
        epsilon=epsilon,
        delta=Decimal(0),
        metadata=_meta("choice", "exponential", candidates=digest),
        compute=compute,
        randomness=request.randomness,
    )
    chosen_label = next((str(e["output"]) for e in events if e.get("query") == "choice"), None)
    if chosen_label is None:
        raise ReleaseError("the ledger holds no output for this release")
    return CentralRelease(
        "choice",
        chosen_label,
        "exponential",
        epsilon,
        Decimal(0),
        Decimal(1),
        Decimal(1),
        float(2 * k / epsilon),
        f"exponential mechanism, utility = count (Δu = {k}), ε-DP",
        rid,
    )


def private_histogram(
    ledger: CentralLedger,
    *,
    epsilon: Decimal,
    domain: Sequence[str],
    load: Callable[[], Iterable[str] | Bounded],
    **fields: Unpack[RequestFields],
) -> CentralRelease:
    """Noised counts of every value of a declared `domain` (records outside it count nowhere).

    Discrete Laplace noise of scale k/ε on each bin: adding or removing one
    unit of at most k records changes the count vector by at most k in L1
    norm, so the whole vector is ε-DP (Dwork and Roth 2014, Section 3.3,
    Laplace mechanism on the histogram query; CKS20 Section 5 for the discrete
    Laplace). One ledger event of kind discrete_laplace with lattice
    sensitivity k records it; its output is the canonical JSON object
    {value: noised count}. Pure ε-DP only (delta 0). `fields`: the `ReleaseRequest`.
    """
    request = ReleaseRequest(**fields)
    k = _bound(request.contribution_bound)
    plan = plan_noise(
        NoiseMechanism.LAPLACE,
        epsilon=epsilon,
        delta=Decimal(0),
        sensitivity=Decimal(k),
        granularity=Decimal(1),
    )
    names = [str(c) for c in domain]
    if not names or len(set(names)) != len(names):
        raise ValueError("the domain must be a non-empty list of distinct values")
    r = request.generator()

    def compute() -> list[dict[str, object]]:
        counts = dict.fromkeys(names, 0)
        for key, n in _value_counts(load()):
            if key in counts:
                counts[key] += n
        noised = {name: str(plan.noised(Decimal(n), r)) for name, n in counts.items()}
        event = plan.event("histogram")
        event["bins"] = len(names)
        event["output"] = json.dumps(noised, sort_keys=True, separators=(",", ":"))
        return [event]

    digest = json.dumps(names, separators=(",", ":"))
    rid, events = _run_release(
        ledger,
        request,
        epsilon=epsilon,
        delta=Decimal(0),
        metadata=_meta("histogram", plan.mechanism.value, domain=digest),
        compute=compute,
        randomness=request.randomness,
    )
    output = next((str(e["output"]) for e in events if e.get("query") == "histogram"), None)
    if output is None:
        raise ReleaseError("the ledger holds no output for this release")
    parts = {name: Decimal(v) for name, v in json.loads(output).items()}
    return CentralRelease(
        "histogram",
        output,
        plan.mechanism.value,
        epsilon,
        Decimal(0),
        plan.sensitivity,
        plan.granularity,
        plan.noise_scale,
        plan.calibration,
        rid,
        parts=parts,
    )


def private_quantile(
    ledger: CentralLedger,
    *,
    epsilon: Decimal,
    quantile: Decimal,
    lower: Decimal,
    upper: Decimal,
    load: Callable[[], Iterable[object] | Bounded],
    **fields: Unpack[RequestFields],
) -> CentralRelease:
    """The q-quantile of values clipped to [lower, upper], by the exponential mechanism.

    Candidates are a fixed grid over the bounds and the utility is the rank
    score of fedldp.aggregator.central.quantile (Smith 2011, Section 3;
    OpenDP's candidate-scoring form), with Δu = k·max(Q, D − Q) for q = Q/D;
    the choice is `exponential_choice` (ε-DP, δ = 0). One ledger event of kind
    "exponential" (query "quantile") records ε, Δu, q, the grid and the output.
    `fields`: the `ReleaseRequest`.
    """
    request = ReleaseRequest(**fields)
    k = _bound(request.contribution_bound)
    _check_budget(NoiseMechanism.LAPLACE, epsilon, Decimal(0))
    _check_bounds(lower, upper)
    q = qm.quantile_fraction(quantile)
    sensitivity = qm.utility_sensitivity(q, k)
    grid = qm.candidates(lower, upper)
    step = qm.grid_step(lower, upper)
    r = request.generator()

    def compute() -> list[dict[str, object]]:
        loaded = load()
        if isinstance(loaded, Bounded) and loaded.cells is not None:
            utilities = qm.scores_from_cells(*loaded.cells, q)
        else:
            values = (_to_decimal(v) for v in loaded)  # type: ignore[union-attr]
            utilities = qm.scores(values, lower, upper, q)
        chosen = exponential_choice(utilities, epsilon, r, sensitivity=sensitivity)
        return [
            {
                "kind": "exponential",
                "query": "quantile",
                "epsilon": str(epsilon),
                "delta": "0",
                "utility_sensitivity": sensitivity,
                "candidates": len(grid),
                "quantile": str(quantile),
                "lower": str(lower),
                "upper": str(upper),
                "grid_step": str(step),
                "sampler": (
                    "report-noisy-max, one-sided geometric noise of scale "
                    "2*utility_sensitivity/epsilon"
                ),
                "output": str(grid[chosen]),
            }
        ]

    rid, events = _run_release(
        ledger,
        request,
        epsilon=epsilon,
        delta=Decimal(0),
        metadata=_meta(
            "quantile", "exponential", quantile=quantile, lower=lower, upper=upper, granularity=step
        ),
        compute=compute,
        randomness=request.randomness,
    )
    return CentralRelease(
        "quantile",
        _output(events, "quantile"),
        "exponential",
        epsilon,
        Decimal(0),
        Decimal(sensitivity),
        step,
        float(2 * sensitivity / epsilon),
        f"exponential mechanism over {len(grid)} grid candidates, rank utility "
        f"(Δu = {sensitivity}), ε-DP",
        rid,
    )
