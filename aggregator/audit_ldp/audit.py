"""Black-box ε audit of one mechanism: plan the tests, sample, bound, judge.

`audit_mechanism(mech, domain, settings)` runs the shipped randomizer on chosen
neighbouring inputs and returns an `AuditReport`:

* inputs — categorical: values 0, 1 and k-1, all pairs; open strings of up to
  L bytes (PEM): "a", "b" and "a" followed by L - 1 "z" (differing at the first
  byte, or only after it), all pairs; a sketch (CMS, HCMS): two fixed strings
  whose sketch cells differ in as many rows as possible (`open_inputs`);
  numeric [lo, hi]: lo,
  the middle, hi, the double after the middle and the double after lo, paired
  as (lo, hi), (lo, mid), (mid, hi), (mid, mid+1ulp), (lo, lo+1ulp);
* for each path (device, batch), input pair and feature (`features.py`): an event
  chosen on the first half of the samples, and its ε lower bound on the second
  half (`stats.py`);
* for each path and input, the law checks of `laws.py` (the sampler against
  the law the mechanism declares). A sampler whose law is not the declared one
  fails even when it is *less* revealing than claimed (e.g. GRR randomizing at
  ε/2 while declaring ε).

Error control (Bonferroni): with m = the number of CP bounds plus law tests
planned, each is run at level α/m, so a correct mechanism FAILS with probability
at most α = 1 - confidence (default α = 1e-6) whatever its parameters.

Claim. A memoized mechanism (one with `new_memo()`, `sampling.is_memoized`) is
audited on T reports of one value sharing one permanent response (the SDK's memo
path), as one joint output, and, for T >= 2, on pairs of SEQUENCES of T values
that change (`longitudinal.py`: same against changed once, alternating and all
distinct), both against what the ledger charges for T reports: T ·
report_charge. Other mechanisms: one report against ε (T independent reports
compose sequentially and are not audited). The sequence tests count in m.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np
from fedldp.aggregator.audit_ldp import longitudinal, stats
from fedldp.aggregator.audit_ldp.features import Feature, features_for
from fedldp.aggregator.audit_ldp.laws import LawTest, law_tests
from fedldp.aggregator.audit_ldp.sampling import (
    Reports,
    is_memoized,
    output_kind,
    sample_batch,
    sample_device,
)
from fedldp.client.mechanisms.base import (
    MAX_OPEN_DOMAIN_BYTES,
    AttributeSpec,
    Mechanism,
    MultiMetric,
    OpenDomain,
)
from fedldp.client.mechanisms.multi import MULTI_IDS
from fedldp.client.mechanisms.registry import UnknownMechanismError, create
from fedldp.client.mechanisms.sketch import SKETCH_MECHANISMS, Sketch

if TYPE_CHECKING:
    import numpy.typing as npt

#: Default confidence of every reported lower bound and verdict: 1 - 1e-6.
DEFAULT_ALPHA = 1e-6
#: Default reports per input on the batch path (half choose events, half bound them).
DEFAULT_SAMPLES = 400_000
#: Default reports per input on the device path (one `perturb` call each).
DEFAULT_DEVICE_SAMPLES = 40_000
PATHS = ("device", "batch")

#: Parameter of the memoized mechanisms: the permanent response's ε∞.
PERMANENT_PARAM = "epsilon_permanent"
#: Open domain of the open-domain mechanisms when the caller gives none.
DEFAULT_OPEN_DOMAIN = OpenDomain(4)
#: Build errors that only say a candidate (domain kind, ε∞) was the wrong guess.
_WRONG_GUESS = (
    "categorical metric",
    "numeric metric",
    "open-domain metric",
    "takes no parameters",
    "does not take",
    "needs parameter",
)
#: The audited strings of an open domain: FIRST, and the first SECOND_STEM + i
#: (i < OPEN_SEARCH) whose sketch cells differ from FIRST's in every row (else
#: in the most rows): the rows where they differ are where a leak would show.
OPEN_FIRST = "fedldp-audit-x"
OPEN_SECOND_STEM = "fedldp-audit-y"
OPEN_SEARCH = 1000


@dataclass(frozen=True)
class MechanismSpec:
    """What a policy says about a mechanism: wire id, ε, domain (k, [lo, hi], the
    attributes of a multi-attribute metric, or an open domain), params."""

    wire_id: str
    epsilon: Decimal
    domain: int | tuple[Decimal, Decimal] | MultiMetric | OpenDomain
    params: Mapping[str, str] = field(default_factory=dict)

    def build(self) -> Mechanism:  # type: ignore[type-arg]
        """The registered mechanism, validated as the policy signer would."""
        return create(self.wire_id, self.epsilon, self.domain, self.params)


def resolve_spec(
    wire_id: str,
    epsilon: Decimal,
    k: int,
    numeric_range: tuple[Decimal, Decimal],
    params: Mapping[str, str],
    epsilon_permanent: Decimal,
    open_domain: OpenDomain = DEFAULT_OPEN_DOMAIN,
) -> MechanismSpec:
    """The spec of `wire_id` at ε: a categorical domain k, the numeric range or the open
    domain (a sketch, CMS or HCMS: max_bytes = MAX_OPEN_DOMAIN_BYTES, so that its
    audited strings fit), whichever the mechanism takes, with `epsilon_permanent`
    added for a memoized mechanism.

    Raises ValueError with the mechanism's own message when no candidate builds
    (an unknown id: its registry message). A multi-attribute mechanism is audited
    over `audit_multi_metric(k, numeric_range)`.
    """
    if wire_id in MULTI_IDS:
        spec = MechanismSpec(wire_id, epsilon, audit_multi_metric(k, numeric_range), dict(params))
        spec.build()  # its own message (e.g. "takes no parameters")
        return spec
    with_permanent = {**params, PERMANENT_PARAM: str(epsilon_permanent)}
    candidates: list[MechanismSpec] = [
        MechanismSpec(wire_id, epsilon, k, dict(params)),
        MechanismSpec(wire_id, epsilon, k, with_permanent),
        MechanismSpec(wire_id, epsilon, numeric_range, dict(params)),
        MechanismSpec(wire_id, epsilon, numeric_range, with_permanent),
        # a bucketed numeric memoized mechanism (dbitflip): k buckets unless given
        MechanismSpec(wire_id, epsilon, numeric_range, {"buckets": str(k), **with_permanent}),
        MechanismSpec(
            wire_id,
            epsilon,
            OpenDomain(MAX_OPEN_DOMAIN_BYTES) if wire_id in SKETCH_MECHANISMS else open_domain,
            dict(params),
        ),
    ]
    errors: list[str] = []
    for spec in candidates:
        try:
            spec.build()
        except UnknownMechanismError as exc:
            raise ValueError(str(exc.args[0])) from None
        except (ValueError, TypeError) as exc:
            errors.append(str(exc))
            continue
        return spec
    specific = [e for e in errors if not any(w in e for w in _WRONG_GUESS)]
    raise ValueError((specific or errors)[0])


def audit_multi_metric(k: int, numeric_range: tuple[Decimal, Decimal]) -> MultiMetric:
    """The metric a multi-attribute mechanism is audited over: a categorical attribute
    "c" of k values under grr and a numeric attribute "x" on the range under piecewise
    (default grid at the attribute's ε)."""
    return MultiMetric(
        (
            AttributeSpec("c", tuple(str(i) for i in range(k)), None, "grr"),
            AttributeSpec("x", None, numeric_range, "piecewise"),
        )
    )


@dataclass(frozen=True)
class AuditSettings:
    """How much to sample and at what confidence."""

    samples: int = DEFAULT_SAMPLES
    device_samples: int = DEFAULT_DEVICE_SAMPLES
    alpha: float = DEFAULT_ALPHA
    #: T: reports per simulated user for memoized mechanisms (others: 1).
    reports: int = 1
    paths: tuple[str, ...] = PATHS
    #: Seed of the batch path's numpy Generator (None: fresh OS entropy).
    seed: int | None = None
    #: The device path's randomness: None is the OS CSPRNG (what devices run);
    #: tests pass a seeded random.Random to be reproducible.
    device_rng: random.Random | None = None
    #: Run the longitudinal test (two sequences of T values, `longitudinal.py`) on
    #: memoized mechanisms when T >= 2.
    sequences: bool = True

    def __post_init__(self) -> None:
        if self.samples < 2 or self.device_samples < 2:
            raise ValueError("samples must be at least 2 per input (two halves)")
        if not 0.0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), got {self.alpha}")
        if not 1 <= self.reports <= 8:
            raise ValueError(f"reports (T) must be in [1, 8], got {self.reports}")
        if not self.paths or any(p not in PATHS for p in self.paths):
            raise ValueError(f"paths must be a non-empty subset of {PATHS}")


@dataclass(frozen=True)
class EventResult:
    """One event's ε lower bound (on the fresh half) for one path, pair and feature."""

    path: str
    pair: tuple[str, str]
    feature: str
    hits: int
    misses: int
    n: int
    epsilon_lb: float
    #: True for the longitudinal test: `pair` names two sequences of values.
    sequences: bool = False


@dataclass(frozen=True)
class LawResult:
    """One law check: the sampler against the declared law, on one input."""

    path: str
    input: str
    test: str
    p_value: float
    passed: bool


@dataclass(frozen=True)
class AuditReport:
    """Everything one audit found; `passed` is the verdict."""

    wire_id: str
    epsilon: Decimal
    reports: int
    claim: Decimal
    alpha: float
    tests: int
    events: tuple[EventResult, ...]
    laws: tuple[LawResult, ...]
    notes: tuple[str, ...]
    #: Seconds the audit took (sampling, bounds and law checks).
    wall_s: float = 0.0

    def epsilon_lb(self, path: str | None = None, sequences: bool | None = None) -> float:
        """Largest lower bound, at least 0, over the events of `path` (None: all) and
        of the longitudinal test (`sequences` True), of one value (False) or both (None)."""
        bounds = [
            e.epsilon_lb
            for e in self.events
            if (path is None or e.path == path) and (sequences is None or e.sequences == sequences)
        ]
        return max([0.0, *bounds])

    def has_sequences(self, path: str | None = None) -> bool:
        """Whether the longitudinal test ran (on `path`, or on any path)."""
        return any(e.sequences and (path is None or e.path == path) for e in self.events)

    def best_event(self) -> EventResult | None:
        """The event with the largest lower bound."""
        return max(self.events, key=lambda e: e.epsilon_lb, default=None)

    @property
    def law_passed(self) -> bool:
        """Whether every law check passed."""
        return all(law.passed for law in self.laws)

    @property
    def passed(self) -> bool:
        """No lower bound above the claim, and no law mismatch."""
        return self.epsilon_lb() <= float(self.claim) and self.law_passed


@dataclass(frozen=True)
class _Plan:
    kind: str
    inputs: list[tuple[str, Any]]
    pairs: list[tuple[int, int]]
    features: tuple[Feature, ...]
    reports: int
    paths: tuple[str, ...]
    #: Per input, the tests of its reports against the declared law.
    law_tests: list[list[LawTest]]
    notes: tuple[str, ...]
    #: The longitudinal test (memoized mechanisms, T >= 2; else empty).
    sequences: _SequencePlan | None = None

    @property
    def tests(self) -> int:
        events = len(self.pairs) * len(self.features) * 2
        total = len(self.paths) * (events + sum(len(t) for t in self.law_tests))
        return total + (self.sequences.tests if self.sequences else 0)


@dataclass(frozen=True)
class _SequencePlan:
    """The longitudinal test: sequences, pairs of them, their features, paths."""

    sequences: list[longitudinal.Sequence]
    pairs: list[tuple[int, int]]
    #: Per pair, its features.
    features: list[tuple[longitudinal.SequenceFeature, ...]]
    paths: tuple[str, ...]

    @property
    def tests(self) -> int:
        return len(self.paths) * 2 * sum(len(f) for f in self.features)


def _sequence_plan(
    mech: Any, domain: Any, kind: str, settings: AuditSettings, notes: list[str]
) -> _SequencePlan | None:
    """The longitudinal test of a memoized mechanism (None when T < 2 or not asked)."""
    if not settings.sequences or settings.reports < 2:
        return None
    try:
        seqs, pairs = longitudinal.sequence_pairs(domain, settings.reports)
    except ValueError as exc:
        notes.append(f"no sequence test: {exc}")
        return None
    paths = tuple(p for p in settings.paths if p == "device" or longitudinal.has_batch_path(mech))
    if "batch" in settings.paths and "batch" not in paths:
        notes.append("sequence test on the device path only (no batch path for sequences)")
    if not paths:
        return None
    features = [longitudinal.sequence_features(kind, mech, seqs[i], seqs[j]) for i, j in pairs]
    return _SequencePlan(seqs, pairs, features, paths)


def open_inputs(mech: Any) -> list[tuple[str, Any]]:
    """The two audited strings of a sketch (see OPEN_FIRST)."""
    first = mech.cells(OPEN_FIRST)

    def differing(candidate: str) -> int:
        return sum(a != b for a, b in zip(first, mech.cells(candidate), strict=True))

    best = max(
        (f"{OPEN_SECOND_STEM}{i}" for i in range(OPEN_SEARCH)),
        key=lambda c: (differing(c) == mech.k, differing(c)),
    )
    return [(OPEN_FIRST, OPEN_FIRST), (best, best)]


def _all_pairs(inputs: list[tuple[str, Any]]) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(inputs)) for j in range(i + 1, len(inputs))]


def _inputs(
    domain: int | tuple[Decimal, Decimal] | MultiMetric | OpenDomain,
    mech: Any,
) -> tuple[list[tuple[str, Any]], list[tuple[int, int]]]:
    if isinstance(domain, OpenDomain) and isinstance(mech, Sketch):
        return open_inputs(mech), [(0, 1)]
    if isinstance(domain, MultiMetric):
        # Every attribute at its low end, at its high end, and only the first one high.
        low = tuple(0 if a.labels is not None else float(a.metric[0]) for a in domain.attributes)  # type: ignore[index]
        high = tuple(
            len(a.labels) - 1 if a.labels is not None else float(a.metric[1])  # type: ignore[index]
            for a in domain.attributes
        )
        first = (high[0], *low[1:])
        return [("low", low), ("high", high), ("first high", first)], [(0, 1), (0, 2), (1, 2)]
    if isinstance(domain, int):
        values = sorted({0, 1, domain - 1})
        inputs: list[tuple[str, Any]] = [(str(v), v) for v in values]
        return inputs, _all_pairs(inputs)
    if isinstance(domain, OpenDomain):
        texts = list(dict.fromkeys(["a", "b", "a" + "z" * (domain.max_bytes - 1)]))
        inputs = [(repr(t), t) for t in texts]
        return inputs, _all_pairs(inputs)
    lo, hi = float(domain[0]), float(domain[1])
    mid = float((domain[0] + domain[1]) / 2)
    inputs = [
        ("lo", lo),
        ("mid", mid),
        ("hi", hi),
        ("mid+1ulp", math.nextafter(mid, hi)),
        ("lo+1ulp", math.nextafter(lo, hi)),
    ]
    return inputs, [(0, 2), (0, 1), (1, 2), (1, 3), (0, 4)]


def _plan(mech: Mechanism, domain: Any, settings: AuditSettings) -> _Plan:  # type: ignore[type-arg]
    inputs, pairs = _inputs(domain, mech)
    kind = output_kind(mech, inputs[0][1])
    memoized = is_memoized(mech)
    reports = settings.reports if memoized else 1
    notes: list[str] = []
    laws = [law_tests(mech, kind, inputs, x) for _, x in inputs]
    if kind == "joint":
        notes.append(
            "multi-attribute: the joint report over all attributes is audited against ε; "
            "each attribute's law is checked by auditing its mechanism on its own"
        )
    elif not any(laws):
        notes.append("no law check: the mechanism declares no law the auditor can test")
    sequences = _sequence_plan(mech, domain, kind, settings, notes) if memoized else None
    return _Plan(
        kind=kind,
        inputs=inputs,
        pairs=pairs,
        features=features_for(kind, reports),
        reports=reports,
        paths=settings.paths,
        law_tests=laws,
        notes=tuple(notes),
        sequences=sequences,
    )


def _sample(mech: Mechanism, plan: _Plan, path: str, settings: AuditSettings) -> list[Reports]:  # type: ignore[type-arg]
    if path == "device":
        users = settings.device_samples
        return [
            sample_device(mech, plan.kind, value, users, plan.reports, settings.device_rng)
            for _, value in plan.inputs
        ]
    generator = np.random.default_rng(settings.seed)
    return [
        sample_batch(mech, plan.kind, value, settings.samples, plan.reports, generator)
        for _, value in plan.inputs
    ]


def _events(
    mech: Mechanism,  # type: ignore[type-arg]
    plan: _Plan,
    path: str,
    samples: list[Reports],
    level: float,
) -> list[EventResult]:
    half = samples[0].n // 2
    select = [s.rows(0, half) for s in samples]
    fresh = [s.rows(half, 2 * half) for s in samples]
    cache: dict[tuple[int, int, int, int, bool], npt.NDArray[np.int64]] = {}
    histograms: dict[tuple[int, int, int, int], stats.Histogram] = {}

    def keys(f: int, source: int, i: int, j: int, fresh_half: bool) -> npt.NDArray[np.int64]:
        """Feature f of input `source`'s reports, for the pair (x_i, x_j)."""
        feature = plan.features[f]
        pair = (i, j) if feature.pairwise else (-1, -1)
        slot = (f, source, *pair, fresh_half)
        if slot not in cache:
            data = (fresh if fresh_half else select)[source]
            cache[slot] = feature.keys(data, plan.inputs[i][1], plan.inputs[j][1], mech)
        return cache[slot]

    def selection(f: int, source: int, i: int, j: int) -> stats.Histogram:
        """The histogram of `keys` on the selection half (computed once per slot)."""
        pair = (i, j) if plan.features[f].pairwise else (-1, -1)
        slot = (f, source, *pair)
        if slot not in histograms:
            histograms[slot] = stats.histogram(keys(f, source, i, j, False))
        return histograms[slot]

    results = []
    for i, j in plan.pairs:
        for f, feature in enumerate(plan.features):
            event = stats.select_event(selection(f, i, i, j), selection(f, j, i, j), level)
            bound = stats.bound_event(event, keys(f, i, i, j, True), keys(f, j, i, j, True), level)
            results.append(
                EventResult(
                    path=path,
                    pair=(plan.inputs[i][0], plan.inputs[j][0]),
                    feature=feature.name,
                    hits=bound.hits,
                    misses=bound.misses,
                    n=bound.n,
                    epsilon_lb=bound.epsilon_lb,
                )
            )
    return results


def _sequence_events(
    mech: Any, plan: _SequencePlan, path: str, settings: AuditSettings, level: float
) -> list[EventResult]:
    """Sample every sequence on `path`, then choose and bound each pair's events."""
    kind = output_kind(mech, plan.sequences[0].values[0])
    if path == "device":
        samples = [
            longitudinal.sample_device(
                mech, kind, seq, settings.device_samples, settings.device_rng
            )
            for seq in plan.sequences
        ]
    else:
        generator = np.random.default_rng(settings.seed)
        samples = [
            longitudinal.sample_batch(mech, kind, seq, settings.samples, generator)
            for seq in plan.sequences
        ]
    half = samples[0].n // 2
    results = []
    for (i, j), features in zip(plan.pairs, plan.features, strict=True):
        x_sel, y_sel = samples[i].rows(0, half), samples[j].rows(0, half)
        x_est, y_est = samples[i].rows(half, 2 * half), samples[j].rows(half, 2 * half)
        for feature in features:
            keys = feature.fitted(x_sel, y_sel)  # learnt on the selection half only
            event = stats.select_event(
                stats.histogram(keys(x_sel)), stats.histogram(keys(y_sel)), level
            )
            bound = stats.bound_event(event, keys(x_est), keys(y_est), level)
            results.append(
                EventResult(
                    path=path,
                    pair=(plan.sequences[i].label, plan.sequences[j].label),
                    feature=feature.name,
                    hits=bound.hits,
                    misses=bound.misses,
                    n=bound.n,
                    epsilon_lb=bound.epsilon_lb,
                    sequences=True,
                )
            )
    return results


def _laws(plan: _Plan, path: str, samples: list[Reports], level: float) -> list[LawResult]:
    results = []
    for (label, _), tests, reports in zip(plan.inputs, plan.law_tests, samples, strict=True):
        for test in tests:
            p_value = test.p_value(reports)
            results.append(LawResult(path, label, test.name, p_value, p_value >= level))
    return results


def claim_for(mech: Any, reports: int) -> Decimal:
    """What the ledger charges for `reports` reports of one subject: a memoized
    mechanism's `lifetime_epsilon(T)` when it has one (a mechanism whose charge stops
    at a proven lifetime bound says so there), else T · report_charge."""
    lifetime = getattr(mech, "lifetime_epsilon", None)
    if reports > 1 and callable(lifetime):
        return Decimal(lifetime(reports))
    return Decimal(mech.report_charge) * reports


def audit_mechanism(
    mech: Mechanism,  # type: ignore[type-arg]
    domain: int | tuple[Decimal, Decimal] | MultiMetric | OpenDomain,
    settings: AuditSettings | None = None,
) -> AuditReport:
    """Audit `mech` (built for `domain`: k, the numeric range (lo, hi) or an open domain)."""
    settings = settings or AuditSettings()
    start = time.perf_counter()
    plan = _plan(mech, domain, settings)
    level = settings.alpha / plan.tests
    events: list[EventResult] = []
    laws: list[LawResult] = []
    for path in plan.paths:
        samples = _sample(mech, plan, path, settings)
        events.extend(_events(mech, plan, path, samples, level))
        laws.extend(_laws(plan, path, samples, level))
        del samples
        if plan.sequences is not None and path in plan.sequences.paths:
            events.extend(_sequence_events(mech, plan.sequences, path, settings, level))
    return AuditReport(
        wire_id=mech.wire_id,
        epsilon=mech.epsilon,
        reports=plan.reports,
        claim=claim_for(mech, plan.reports),
        alpha=settings.alpha,
        tests=plan.tests,
        events=tuple(events),
        laws=tuple(laws),
        notes=plan.notes,
        wall_s=time.perf_counter() - start,
    )


def audit_spec(spec: MechanismSpec, settings: AuditSettings | None = None) -> AuditReport:
    """Build the registered mechanism of `spec` and audit it."""
    return audit_mechanism(spec.build(), spec.domain, settings)
