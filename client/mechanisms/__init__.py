"""LDP mechanisms: one definition each, behind a registry keyed by wire id.

`create(wire_id, epsilon, metric, params)` builds any registered mechanism;
`resolve` / `choose_frequency_oracle` turn "auto" into a concrete id. Importing
this package never imports numpy: single-value paths are pure Python, batch and
estimation paths import numpy lazily. See docs/mechanisms.md.
"""

from fedldp.client.mechanisms.auto import choose_frequency_oracle, resolve
from fedldp.client.mechanisms.base import (
    AttributeSpec,
    BitVectorOutput,
    CategoryOutput,
    CountStatistic,
    Estimate,
    GroupHashedOutput,
    HashedOutput,
    IndexBitOutput,
    IndexBitsOutput,
    Mechanism,
    MetricArg,
    MomentStatistic,
    MultiMetric,
    MultiOutput,
    NumericOutput,
    OpenDomain,
    Output,
    OutputDomainError,
    SketchBitOutput,
    SketchRowOutput,
)
from fedldp.client.mechanisms.memo import Memoized, MemoState
from fedldp.client.mechanisms.oracle import domain_index
from fedldp.client.mechanisms.registry import (
    RetiredMechanismError,
    UnknownMechanismError,
    create,
    register,
    registered_ids,
)

__all__ = [
    "AttributeSpec",
    "BitVectorOutput",
    "CategoryOutput",
    "CountStatistic",
    "Estimate",
    "GroupHashedOutput",
    "HashedOutput",
    "IndexBitOutput",
    "IndexBitsOutput",
    "Mechanism",
    "MemoState",
    "Memoized",
    "MetricArg",
    "MomentStatistic",
    "MultiMetric",
    "MultiOutput",
    "NumericOutput",
    "OpenDomain",
    "Output",
    "OutputDomainError",
    "RetiredMechanismError",
    "SketchBitOutput",
    "SketchRowOutput",
    "UnknownMechanismError",
    "choose_frequency_oracle",
    "create",
    "domain_index",
    "register",
    "registered_ids",
    "resolve",
]
