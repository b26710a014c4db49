"""The mechanism registry, keyed by the stable wire id in policies and ledger rows.

Registering an id twice raises; building an unknown id raises. Ids are never
reused for a different mechanism (see the compatibility rules in policy.proto).
"auto" is not an id: resolve it with `auto.resolve` before signing a policy.

Registered ids and their policy params (strings, plain notation):

    grr, oue, sue, hr               categorical, no params
    olh                             categorical, optional "g" (a prime)
    ss                              categorical, optional "d" (subset size)
    rappor-grr, rappor-oue,         categorical, required "epsilon_permanent"
    rappor-sue                      (memoized; see memo.py)
    loloha                          categorical, required "epsilon_permanent", optional
                                    "g" (a prime; memoized per hash value, see loloha.py)
    dbitflip                        numeric (lo, hi), required "epsilon_permanent" and
                                    "buckets", optional "d" (memoized; see dbitflip.py)
    duchi                           numeric (lo, hi), no params
    piecewise, hybrid               numeric (lo, hi), optional "levels" and "cells"
                                    (grid size; see numeric.py)
    sw                              numeric (lo, hi), optional "levels" and "cells"
                                    (Square Wave, for the distribution; see square_wave.py)
    multi-split, multi-sample       multi-attribute (a MultiMetric), no params; each
                                    attribute names its own mechanism (see multi.py)
    pem                             open domain (max_bytes), optional "step_bits",
                                    "start_bits", "groups", "g" (stated at authoring;
                                    see pem.py)
    cms, hcms                       open domain (strings), optional "rows" and
                                    "columns" (sketch size; see sketch.py)

Retired ids (`RETIRED_IDS`) stay reserved: they are never registered again,
and building one raises `RetiredMechanismError` naming the replacement.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from decimal import Decimal

from fedldp.client.mechanisms._common import (
    categorical_metric,
    decimal_param,
    int_param,
    no_params,
    numeric_metric,
    only_params,
)
from fedldp.client.mechanisms.base import Mechanism, MetricArg, MultiMetric

#: Builds a mechanism from (epsilon, metric description, params). `metric` is a
#: categorical domain size (int) or a numeric range (lo, hi) as Decimals.
Factory = Callable[[Decimal, MetricArg, Mapping[str, str]], Mechanism]  # type: ignore[type-arg]

_REGISTRY: dict[str, Factory] = {}


#: Retired wire ids, reserved forever, and why (the message names the replacement).
#: laplace emitted t + Lap(2/ε) as a double: its bits leak the input (Mironov,
#: CCS 2012) and any finite double was a possible output, so one report could
#: carry unbounded weight; piecewise and hybrid dominate it at every ε (Wang et
#: al., ICDE 2019, Section III-D).
RETIRED_IDS: dict[str, str] = {
    "laplace": (
        "mechanism 'laplace' is retired: its floating-point outputs leak the input "
        "(Mironov, CCS 2012) and are unbounded; sign a new version of the policy with "
        "'hybrid' (or 'piecewise'), which has lower variance at every epsilon"
    ),
}


class UnknownMechanismError(KeyError):
    """No mechanism is registered under this wire id."""


class RetiredMechanismError(UnknownMechanismError):
    """The wire id belonged to a mechanism that was retired; the message names the replacement."""


def register(wire_id: str, factory: Factory) -> None:
    """Register `factory` under `wire_id`; a duplicate id raises ValueError."""
    if wire_id in _REGISTRY:
        raise ValueError(f"mechanism id {wire_id!r} is already registered")
    if wire_id in RETIRED_IDS:
        raise ValueError(f"mechanism id {wire_id!r} is retired and reserved; choose another id")
    _REGISTRY[wire_id] = factory


def registered_ids() -> list[str]:
    """All registered wire ids, sorted."""
    return sorted(_REGISTRY)


def create(
    wire_id: str,
    epsilon: Decimal,
    metric: MetricArg,
    params: Mapping[str, str] | None = None,
) -> Mechanism:  # type: ignore[type-arg]
    """Build the mechanism `wire_id` from validated policy parameters."""
    if wire_id in RETIRED_IDS:
        raise RetiredMechanismError(RETIRED_IDS[wire_id])
    try:
        factory = _REGISTRY[wire_id]
    except KeyError:
        hint = ""
        if wire_id == "auto":
            hint = " ('auto' must be resolved with auto.resolve before signing)"
        raise UnknownMechanismError(
            f"unknown mechanism id {wire_id!r}{hint}; known: {', '.join(registered_ids())}"
        ) from None
    return factory(epsilon, metric, params or {})


def _categorical_factory(wire_id: str, module: str, name: str, param: str | None = None) -> Factory:
    """Factory for class `name` of `fedldp.client.mechanisms.<module>` (imported on first
    use), built as cls(epsilon, k) or, with `param`, cls(epsilon, k, optional int param)."""

    def factory(epsilon: Decimal, metric: MetricArg, params: Mapping[str, str]) -> Mechanism:  # type: ignore[type-arg]
        cls = getattr(importlib.import_module(f"fedldp.client.mechanisms.{module}"), name)
        k = categorical_metric(wire_id, metric)
        if param is None:
            no_params(wire_id, params)
            extra: tuple[int | None, ...] = ()
        else:
            only_params(wire_id, params, {param})
            extra = (int_param(wire_id, params, param),)
        mechanism: Mechanism = cls(epsilon, k, *extra)  # type: ignore[type-arg]
        return mechanism

    return factory


def _memo_factory(wire_id: str) -> Factory:
    def factory(epsilon: Decimal, metric: MetricArg, params: Mapping[str, str]) -> Mechanism:  # type: ignore[type-arg]
        from fedldp.client.mechanisms.memo import RapporGRR, RapporOUE, RapporSUE

        k = categorical_metric(wire_id, metric)
        only_params(wire_id, params, {"epsilon_permanent"})
        permanent = decimal_param(wire_id, params, "epsilon_permanent")
        if permanent is None:
            raise ValueError(f"{wire_id} needs parameter 'epsilon_permanent' (lifetime epsilon)")
        classes: dict[str, type[RapporGRR | RapporOUE | RapporSUE]] = {
            "rappor-grr": RapporGRR,
            "rappor-oue": RapporOUE,
            "rappor-sue": RapporSUE,
        }
        return classes[wire_id](epsilon, k, permanent)

    return factory


def _required_permanent(wire_id: str, params: Mapping[str, str]) -> Decimal:
    """The required "epsilon_permanent" of a memoized mechanism."""
    permanent = decimal_param(wire_id, params, "epsilon_permanent")
    if permanent is None:
        raise ValueError(f"{wire_id} needs parameter 'epsilon_permanent' (lifetime epsilon)")
    return permanent


def _loloha_factory(epsilon: Decimal, metric: MetricArg, params: Mapping[str, str]) -> Mechanism:  # type: ignore[type-arg]
    from fedldp.client.mechanisms.loloha import Loloha

    k = categorical_metric("loloha", metric)
    only_params("loloha", params, {"epsilon_permanent", "g"})
    return Loloha(
        epsilon, k, _required_permanent("loloha", params), int_param("loloha", params, "g")
    )


def _dbitflip_factory(epsilon: Decimal, metric: MetricArg, params: Mapping[str, str]) -> Mechanism:  # type: ignore[type-arg]
    from fedldp.client.mechanisms.dbitflip import DBitFlip

    lo, hi = numeric_metric("dbitflip", metric)
    only_params("dbitflip", params, {"epsilon_permanent", "buckets", "d"})
    buckets = int_param("dbitflip", params, "buckets")
    if buckets is None:
        raise ValueError("dbitflip needs parameter 'buckets' (the number of buckets of the range)")
    permanent = _required_permanent("dbitflip", params)
    return DBitFlip(epsilon, lo, hi, buckets, permanent, int_param("dbitflip", params, "d"))


def _numeric_factory(wire_id: str) -> Factory:
    def factory(epsilon: Decimal, metric: MetricArg, params: Mapping[str, str]) -> Mechanism:  # type: ignore[type-arg]
        from fedldp.client.mechanisms.numeric import Duchi, Hybrid, Piecewise, parse_grid
        from fedldp.client.mechanisms.square_wave import SquareWave

        lo, hi = numeric_metric(wire_id, metric)
        if wire_id == "duchi":
            no_params(wire_id, params)
            return Duchi(epsilon, lo, hi)
        only_params(wire_id, params, {"levels", "cells"})
        levels, cells = parse_grid(wire_id, epsilon, dict(params))
        grid_classes: dict[str, type[Piecewise | Hybrid | SquareWave]] = {
            "piecewise": Piecewise,
            "hybrid": Hybrid,
            "sw": SquareWave,
        }
        return grid_classes[wire_id](epsilon, lo, hi, levels, cells)

    return factory


def _sketch_factory(wire_id: str) -> Factory:
    def factory(epsilon: Decimal, metric: MetricArg, params: Mapping[str, str]) -> Mechanism:  # type: ignore[type-arg]
        from fedldp.client.mechanisms.sketch import build_sketch

        return build_sketch(wire_id, epsilon, metric, params)

    return factory


def _pem_factory(epsilon: Decimal, metric: MetricArg, params: Mapping[str, str]) -> Mechanism:  # type: ignore[type-arg]
    from fedldp.client.mechanisms.base import OpenDomain
    from fedldp.client.mechanisms.pem import PEM

    if not isinstance(metric, OpenDomain):
        raise ValueError("pem needs an open-domain metric ([metric] max_bytes = N)")
    only_params("pem", params, {"step_bits", "start_bits", "groups", "g"})
    options = {name: int_param("pem", params, name) for name in ("step_bits", "start_bits")}
    return PEM(
        epsilon,
        metric,
        **{name: value for name, value in options.items() if value is not None},
        groups=int_param("pem", params, "groups"),
        g=int_param("pem", params, "g"),
    )


register("grr", _categorical_factory("grr", "grr", "GRR"))
register("oue", _categorical_factory("oue", "unary", "OUE"))
register("sue", _categorical_factory("sue", "unary", "SUE"))
register("olh", _categorical_factory("olh", "olh", "OLH", param="g"))
register("hr", _categorical_factory("hr", "hadamard", "HadamardResponse"))
register("ss", _categorical_factory("ss", "subset", "SubsetSelection", param="d"))
for _memo_id in ("rappor-grr", "rappor-oue", "rappor-sue"):
    register(_memo_id, _memo_factory(_memo_id))
register("loloha", _loloha_factory)
register("dbitflip", _dbitflip_factory)
for _numeric_id in ("duchi", "piecewise", "hybrid", "sw"):
    register(_numeric_id, _numeric_factory(_numeric_id))


def _multi_factory(wire_id: str) -> Factory:
    def factory(epsilon: Decimal, metric: MetricArg, params: Mapping[str, str]) -> Mechanism:  # type: ignore[type-arg]
        from fedldp.client.mechanisms.multi import MultiSample, MultiSplit

        if not isinstance(metric, MultiMetric):
            raise ValueError(f"{wire_id} needs a multi-attribute metric")
        no_params(wire_id, params)
        return (MultiSplit if wire_id == "multi-split" else MultiSample)(epsilon, metric)

    return factory


for _multi_id in ("multi-split", "multi-sample"):
    register(_multi_id, _multi_factory(_multi_id))
register("pem", _pem_factory)
for _sketch_id in ("cms", "hcms"):
    register(_sketch_id, _sketch_factory(_sketch_id))
