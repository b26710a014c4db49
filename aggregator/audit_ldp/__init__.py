"""A black-box ε auditor for the local mechanisms (`fedldp verify mechanism`).

It runs the shipped randomizer (device path with the OS CSPRNG, and batch path)
on chosen neighbouring inputs and reports Clopper–Pearson lower bounds on ε at a
stated confidence, plus checks of the sampler against its declared law, and, for
memoized mechanisms, on two sequences of values that change. See `audit.py` for
the plan and the error control, `features.py` for the events, `longitudinal.py`
for the sequence test, `stats.py` for the bounds, and docs/mechanisms.md,
"Auditing a mechanism".
"""

from fedldp.aggregator.audit_ldp.audit import (
    DEFAULT_ALPHA,
    DEFAULT_DEVICE_SAMPLES,
    DEFAULT_SAMPLES,
    AuditReport,
    AuditSettings,
    EventResult,
    LawResult,
    MechanismSpec,
    audit_mechanism,
    audit_spec,
    resolve_spec,
)

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_DEVICE_SAMPLES",
    "DEFAULT_SAMPLES",
    "AuditReport",
    "AuditSettings",
    "EventResult",
    "LawResult",
    "MechanismSpec",
    "audit_mechanism",
    "audit_spec",
    "resolve_spec",
]
