"""LDP mechanisms: one definition each, behind a registry keyed by wire id."""

from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    Estimate,
    HashedOutput,
    IndexBitOutput,
    Mechanism,
    NumericOutput,
    Output,
    OutputDomainError,
)
from fedldp.client.mechanisms.registry import UnknownMechanismError, create, register, registered_ids

__all__ = [
    "BitVectorOutput",
    "CategoryOutput",
    "Estimate",
    "HashedOutput",
    "IndexBitOutput",
    "Mechanism",
    "NumericOutput",
    "Output",
    "OutputDomainError",
    "UnknownMechanismError",
    "create",
    "register",
    "registered_ids",
]
