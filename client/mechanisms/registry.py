"""The mechanism registry, keyed by the stable wire id in policies and ledger rows.

Registering an id twice raises; building an unknown id raises. Ids are never
reused for a different mechanism (see the compatibility rules in policy.proto).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal

from fedldp.client.mechanisms.base import Mechanism

#: Builds a mechanism from (epsilon, metric description, params). `metric` is a
#: categorical domain size (int) or a numeric range (lo, hi) as Decimals.
Factory = Callable[[Decimal, "int | tuple[Decimal, Decimal]", Mapping[str, str]], Mechanism]  # type: ignore[type-arg]

_REGISTRY: dict[str, Factory] = {}


class UnknownMechanismError(KeyError):
    """No mechanism is registered under this wire id."""


def register(wire_id: str, factory: Factory) -> None:
    """Register `factory` under `wire_id`; a duplicate id raises ValueError."""
    if wire_id in _REGISTRY:
        raise ValueError(f"mechanism id {wire_id!r} is already registered")
    _REGISTRY[wire_id] = factory


def registered_ids() -> list[str]:
    """All registered wire ids, sorted."""
    return sorted(_REGISTRY)


def create(
    wire_id: str,
    epsilon: Decimal,
    metric: int | tuple[Decimal, Decimal],
    params: Mapping[str, str] | None = None,
) -> Mechanism:  # type: ignore[type-arg]
    """Build the mechanism `wire_id` from validated policy parameters."""
    try:
        factory = _REGISTRY[wire_id]
    except KeyError:
        raise UnknownMechanismError(
            f"unknown mechanism id {wire_id!r}; known: {', '.join(registered_ids())}"
        ) from None
    return factory(epsilon, metric, params or {})


def _grr_factory(
    epsilon: Decimal, metric: int | tuple[Decimal, Decimal], params: Mapping[str, str]
) -> Mechanism:  # type: ignore[type-arg]
    from fedldp.client.mechanisms.grr import GRR

    if not isinstance(metric, int):
        raise ValueError("grr needs a categorical metric")
    if params:
        raise ValueError(f"grr takes no parameters, got {sorted(params)}")
    return GRR(epsilon, metric)


register("grr", _grr_factory)
