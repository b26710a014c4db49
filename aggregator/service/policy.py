"""The release policy: every central cap the service applies, from one operator file.

Format (TOML, operator-owned, inside the trusted boundary)::

    version = 3                      # a positive integer, raised on every change
    [[cap]]
    dataset = "visits"
    purpose = "quarterly-report"
    epsilon = "1.0"                  # plain decimal strings
    delta = "0.000001"

The file's SHA-256 is recorded: logged when the service starts and returned in
every ReleaseResponse (`policy_sha256`), so each release names the exact policy
it ran under. `apply` writes each cap into the ledger as the central cap of
(subject = "<service id>/<dataset>", purpose): the ledger then refuses any
reservation beyond it (collector/ledger/store.py, `reserve`). Analysts share
the cap of a (dataset, purpose): two analysts with the same purpose draw on
one budget. A request never carries a cap (proto/fedldp/v1/release.proto).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from fedldp.aggregator.service.catalog import CatalogError, plain_decimal, toml_loads


class CapLedger(Protocol):
    """What applying a policy needs from the ledger."""

    def set_central_cap(
        self, subject: str, purpose: str, *, epsilon_cap: Decimal, delta_cap: Decimal
    ) -> None: ...


@dataclass(frozen=True)
class Cap:
    """The (ε, δ) cap of one (dataset, purpose)."""

    dataset: str
    purpose: str
    epsilon: Decimal
    delta: Decimal


@dataclass(frozen=True)
class ReleasePolicy:
    """Caps by (dataset, purpose), the policy's version and its file digest."""

    version: int
    caps: dict[tuple[str, str], Cap]
    sha256: str

    def apply(self, ledger: CapLedger, service_id: str) -> None:
        """Set every cap in the ledger under the service's own subjects."""
        for cap in self.caps.values():
            ledger.set_central_cap(
                ledger_subject(service_id, cap.dataset),
                cap.purpose,
                epsilon_cap=cap.epsilon,
                delta_cap=cap.delta,
            )


def ledger_subject(service_id: str, dataset: str) -> str:
    """The ledger subject the service charges for `dataset` (never an analyst's name)."""
    return f"{service_id}/{dataset}"


def load_release_policy(path: Path) -> ReleasePolicy:
    """Parse a release policy file (module docstring); CatalogError when malformed."""
    try:
        raw = path.read_bytes()
        data = toml_loads(raw.decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise CatalogError(f"cannot read release policy {path}: {exc}") from None
    try:
        return ReleasePolicy(_version(data), _caps(data), hashlib.sha256(raw).hexdigest())
    except (TypeError, ValueError, KeyError) as exc:
        raise CatalogError(f"release policy {path}: {exc}") from None


def _version(data: dict[str, Any]) -> int:
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError("version must be a positive integer")
    unknown = set(data) - {"version", "cap"}
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)}")
    return version


def _caps(data: dict[str, Any]) -> dict[tuple[str, str], Cap]:
    caps: dict[tuple[str, str], Cap] = {}
    for entry in data.get("cap", []):
        spec = dict(entry)
        if set(spec) != {"dataset", "purpose", "epsilon", "delta"}:
            raise ValueError("each [[cap]] has exactly dataset, purpose, epsilon, delta")
        cap = Cap(
            str(spec["dataset"]),
            str(spec["purpose"]),
            plain_decimal(spec["epsilon"], "epsilon"),
            plain_decimal(spec["delta"], "delta"),
        )
        if cap.epsilon < 0 or cap.delta < 0 or cap.delta >= 1:
            raise ValueError("a cap needs epsilon >= 0 and 0 <= delta < 1")
        key = (cap.dataset, cap.purpose)
        if key in caps:
            raise ValueError(f"two caps for dataset {cap.dataset}, purpose {cap.purpose}")
        caps[key] = cap
    return caps
