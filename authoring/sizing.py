"""`auto` sizing of a count-mean sketch (CMS, HCMS) at authoring: rows k and columns m.

A sketch's estimate of a string's count has two variance parts
(`fedldp.client.mechanisms.sketch`, module docstring, and docs/mechanisms.md,
"Sketches"): the mechanism's noise, which depends on n and ε only, and the
collision term ((n - N_d) + P_{-d}/k) / (m - 1), which does not shrink with ε.
With the default 64 × 1,024 the collision term dominates at n = 10^6 for ε ≥ 4,
and top-20 recall stops near 0.85 whatever ε (`python -m bench.sketches
--curve`). So the size is chosen from what the author expects:

* `expected_reports` n: reports per budget window (the estimate's n);
* `same_string_probability` s: the chance that two reports carry the same
  string, Σ_d f_d^2 (default `DEFAULT_SAME_STRING`; a running deployment's report
  shows P̂/n^2, the sketch's own estimate); it sets P_{-d} ≈ s n^2;
* `collision_share` ρ: the largest fraction of the noise variance the collision
  term may add (default `DEFAULT_COLLISION_SHARE`, 0.1: standard errors within 5 %
  of a collision-free sketch);
* `max_cells`: the largest k·m (default `DEFAULT_MAX_CELLS`; the statistic holds
  k·m counters per window and collector shard, up to `MAX_CELLS`).

Rule, with the mechanism's own variance formulas (`Sketch.noise_count_variance`,
`Sketch.collision_count_variance`, evaluated at N_d = 0, a string nobody holds):
among m a power of two in [`MIN_COLUMNS`, `MAX_COLUMNS`] and the least k in
[1, `MAX_ROWS`] meeting collision ≤ ρ · (m/(m-1))^2 V_noise, take the smallest
k·m within `max_cells` (ties: the larger m). When no size meets ρ, take the size
within `max_cells` with the smallest collision-to-noise ratio and say so. The
chosen "rows" and "columns" are written into the policy's params and signed, as
every sketch size is (`state_sketch_params`); the sizing inputs are authoring
only and not in the signed policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from fedldp.client.mechanisms.base import OpenDomain
from fedldp.client.mechanisms.sketch import (
    MAX_CELLS,
    MAX_COLUMNS,
    MAX_ROWS,
    MIN_COLUMNS,
    Sketch,
    build_sketch,
)

#: Default Σ f_d^2: Zipf(1.1) over 10,000 strings has 0.027 (bench/sketches.py's data).
DEFAULT_SAME_STRING = Decimal("0.03")
#: Default largest share of the noise variance the collision term may add.
DEFAULT_COLLISION_SHARE = Decimal("0.1")
#: Default largest k·m the sizing may choose (256 Ki counters per window and shard).
DEFAULT_MAX_CELLS = 1 << 18
#: Keys of the [mechanism.sizing] table.
SIZING_KEYS = frozenset(
    {"expected_reports", "same_string_probability", "collision_share", "max_cells"}
)


@dataclass(frozen=True)
class SketchSize:
    """The chosen (rows k, columns m), the two variance parts of a count at N_d = 0 (in
    reports^2), and whether the collision share met the target."""

    rows: int
    columns: int
    noise_variance: float
    collision_variance: float
    target: float
    met: bool
    n: int
    same_string: float

    @property
    def collision_ratio(self) -> float:
        """Collision variance / noise variance."""
        return self.collision_variance / self.noise_variance

    def explain(self, wire_id: str, epsilon: Decimal) -> list[str]:
        """What `fedldp policy sign` prints: the size and why."""
        sd = math.sqrt(self.noise_variance + self.collision_variance)
        head = (
            f"sketch size (auto): rows k = {self.rows}, columns m = {self.columns} "
            f"({self.rows * self.columns:,} counters) for {wire_id} at ε = {epsilon}, "
            f"n = {self.n:,} reports per window, Σf² = {self.same_string:g}"
        )
        why = (
            f"why: collisions add {self.collision_ratio:.1%} to the noise variance "
            f"(target ≤ {self.target:.0%}); standard error of a count ≈ {sd:,.0f} reports "
            f"(noise alone {math.sqrt(self.noise_variance):,.0f})"
        )
        if self.met:
            return [head, why + "; the smallest size that meets the target"]
        return [
            head,
            why + "; NOT met within max_cells: the size with the least collision share "
            "(raise [mechanism.sizing] max_cells up to 1048576, or expect wider intervals)",
        ]


def _variances(
    wire_id: str, epsilon: Decimal, domain: OpenDomain, rows: int, columns: int, n: int, s: float
) -> tuple[float, float]:
    """(noise, collision) variance of a count at N_d = 0 for a (rows, columns) sketch."""
    mech: Sketch = build_sketch(
        wire_id, epsilon, domain, {"rows": str(rows), "columns": str(columns)}
    )
    scale = columns / (columns - 1)
    noise = float(scale**2 * mech.noise_count_variance(n, 0))
    collision = float(mech.collision_count_variance(n, 0, s * n * n))
    return noise, collision


def auto_size(
    wire_id: str,
    epsilon: Decimal,
    domain: OpenDomain,
    *,
    expected_reports: int,
    same_string: Decimal = DEFAULT_SAME_STRING,
    collision_share: Decimal = DEFAULT_COLLISION_SHARE,
    max_cells: int = DEFAULT_MAX_CELLS,
) -> SketchSize:
    """The (rows, columns) of the module docstring's rule; ValueError for bad inputs."""
    if expected_reports < 1 or not 0 <= same_string <= 1 or not collision_share > 0:
        raise ValueError(
            "expected_reports >= 1, 0 <= same_string_probability <= 1 and collision_share > 0"
        )
    if not MIN_COLUMNS <= max_cells <= MAX_CELLS:
        raise ValueError(f"max_cells must be in [{MIN_COLUMNS}, {MAX_CELLS}]")
    n, s, rho = expected_reports, float(same_string), float(collision_share)
    best: tuple[tuple[float, int, int], SketchSize] | None = None
    fallback: tuple[tuple[float, int], SketchSize] | None = None
    m = MIN_COLUMNS
    while m <= min(MAX_COLUMNS, max_cells):
        k_max = min(MAX_ROWS, max_cells // m)
        noise, _ = _variances(wire_id, epsilon, domain, 1, m, n, s)
        room = (m - 1) * rho * noise - n  # what P_{-d}/k may add and still meet ρ
        k = 1 if s * n * n == 0 else (math.ceil(s * n * n / room) if room > 0 else k_max + 1)
        k = max(k, 1)
        if k <= k_max:
            size = _size(wire_id, epsilon, domain, k, m, n, s, rho)
            key = (float(k * m), -m, k)
            if best is None or key < best[0]:
                best = (key, size)
        widest = _size(wire_id, epsilon, domain, k_max, m, n, s, rho)
        if fallback is None or (widest.collision_ratio, -m) < fallback[0]:
            fallback = ((widest.collision_ratio, -m), widest)
        m *= 2
    assert fallback is not None
    return best[1] if best is not None else fallback[1]


def _size(
    wire_id: str,
    epsilon: Decimal,
    domain: OpenDomain,
    rows: int,
    columns: int,
    n: int,
    s: float,
    rho: float,
) -> SketchSize:
    noise, collision = _variances(wire_id, epsilon, domain, rows, columns, n, s)
    return SketchSize(rows, columns, noise, collision, rho, collision <= rho * noise, n, s)


def sizing_inputs(table: Mapping[str, object], problems: list[str]) -> dict[str, object] | None:
    """The validated keyword arguments of `auto_size` from a [mechanism.sizing] table
    (None, with the problems appended, when any is invalid)."""
    unknown = sorted(set(table) - SIZING_KEYS)
    if unknown:
        problems.append(f"mechanism.sizing: unknown keys {unknown}; allowed {sorted(SIZING_KEYS)}")
        return None
    out: dict[str, object] = {}
    for key in ("expected_reports", "max_cells"):
        value = table.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"mechanism.sizing.{key} must be a positive integer")
            return None
        out[key] = value
    if "expected_reports" not in out:
        problems.append("mechanism.sizing needs expected_reports (reports per budget window)")
        return None
    for key, name in (("same_string_probability", "same_string"), ("collision_share", None)):
        value = table.get(key)
        if value is None:
            continue
        try:
            if not isinstance(value, str):
                raise InvalidOperation
            out[name or key] = Decimal(value)
        except InvalidOperation:
            problems.append(f'mechanism.sizing.{key} must be a decimal string, e.g. "0.05"')
            return None
    return out
