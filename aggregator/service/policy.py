"""The release policy: every central cap the service applies, signed by the operator.

Source format (TOML, written by the operator, then signed)::

    version = 3                      # a positive integer, raised on every change
    [[cap]]                          # the cap of a (dataset, purpose): shared
    dataset = "visits"
    purpose = "quarterly-report"
    epsilon = "1.0"                  # plain decimal strings
    delta = "0.000001"
    [[analyst_cap]]                  # optional: one analyst's own cap in that purpose
    dataset = "visits"
    purpose = "quarterly-report"
    analyst = "alice"
    epsilon = "0.25"
    delta = "0"

`fedldp release-service sign-policy FILE.toml --key KEY --out FILE.json` writes
a DSSE JSON envelope (aggregator/central/signing.py, the receipts' format:
Ed25519 over PAE(type, payload)) of payload type RELEASE_POLICY_TYPE whose
payload is the canonical JSON of the validated policy. The service loads only
a signed policy whose signer is one of its trusted release-policy keys
(`--policy-key`), and refuses to start otherwise (unsigned, tampered, unknown
key). `sha256` is the SHA-256 of the signed payload bytes: logged at start-up
and returned in every ReleaseResponse (`policy_sha256`).

Caps in the ledger. `apply` writes each cap as the central cap of (subject,
purpose): "<service id>/<dataset>" for a (dataset, purpose) cap, shared by
every analyst granted that purpose, and "<service id>/<dataset>/analyst:<name>"
for an analyst's own cap. A release by an analyst with an own cap is charged
against both (holds.py). Central caps are lifetime totals (no window), so the
ledger's rule for a policy's versions, "the smallest cap recorded for a window
applies", becomes: a policy may lower or keep a recorded cap, never raise it.
`apply` refuses a policy that would raise any recorded cap (checked for every
cap before any is written), whatever its version, so replaying an older signed
policy can never raise a cap either; new budget is a new purpose, which
composes with the old one (docs/release-service.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from fedldp.aggregator.central.signing import SignatureError, is_envelope, read_json, sign, verify
from fedldp.aggregator.service.catalog import CatalogError, plain_decimal, toml_loads
from fedldp.collector.auth import check_subject

RELEASE_POLICY_TYPE = "application/vnd.fedldp.release-policy.v1+json"


class ReleasePolicyError(CatalogError):
    """The release policy is malformed, unsigned, untrusted, or would raise a recorded cap."""


class CapLedger(Protocol):
    """What applying a policy needs from the ledger."""

    def central_cap(self, subject: str, purpose: str) -> tuple[Decimal, Decimal] | None: ...

    def set_central_cap(
        self, subject: str, purpose: str, *, epsilon_cap: Decimal, delta_cap: Decimal
    ) -> None:
        """See `Ledger.set_central_cap`."""
        ...


@dataclass(frozen=True)
class Cap:
    """The (ε, δ) cap of one (dataset, purpose), or of one analyst in it."""

    dataset: str
    purpose: str
    epsilon: Decimal
    delta: Decimal
    analyst: str | None = None

    def subject(self, service_id: str) -> str:
        """The ledger subject this cap is recorded under."""
        if self.analyst is None:
            return ledger_subject(service_id, self.dataset)
        return analyst_subject(service_id, self.dataset, self.analyst)

    def describe(self) -> str:
        """Which cap this is, for messages."""
        who = f", analyst {self.analyst}" if self.analyst else ""
        return f"dataset {self.dataset}, purpose {self.purpose}{who}"


@dataclass(frozen=True)
class ReleasePolicy:
    """Caps by (dataset, purpose) and by (dataset, purpose, analyst); version; digest."""

    version: int
    caps: dict[tuple[str, str], Cap]
    sha256: str
    analyst_caps: dict[tuple[str, str, str], Cap]
    signer: str = ""

    def all_caps(self) -> Iterator[Cap]:
        """Every cap: the shared ones, then the analysts' own."""
        yield from self.caps.values()
        yield from self.analyst_caps.values()

    def apply(self, ledger: CapLedger, service_id: str) -> None:
        """Set every cap in the ledger under the service's own subjects.

        ReleasePolicyError, with nothing written, when a cap would exceed the one
        the ledger already records (module docstring).
        """
        for cap in self.all_caps():
            recorded = ledger.central_cap(cap.subject(service_id), cap.purpose)
            if recorded is not None and (cap.epsilon > recorded[0] or cap.delta > recorded[1]):
                raise ReleasePolicyError(
                    f"release policy v{self.version} raises the cap of {cap.describe()} to "
                    f"eps={cap.epsilon} delta={cap.delta} above the recorded eps={recorded[0]} "
                    f"delta={recorded[1]}; caps are lifetime totals and can only be lowered or "
                    "kept (new budget is a new purpose)"
                )
        for cap in self.all_caps():
            ledger.set_central_cap(
                cap.subject(service_id),
                cap.purpose,
                epsilon_cap=cap.epsilon,
                delta_cap=cap.delta,
            )


def ledger_subject(service_id: str, dataset: str) -> str:
    """The ledger subject the service charges for `dataset` (never an analyst's name)."""
    return f"{service_id}/{dataset}"


def analyst_subject(service_id: str, dataset: str, analyst: str) -> str:
    """The ledger subject of one analyst's own cap on `dataset` (dataset ids have no '/')."""
    return f"{service_id}/{dataset}/analyst:{analyst}"


# --- the source file and its signed form ---


def policy_payload(path: Path) -> dict[str, Any]:
    """The validated, normalized payload of a policy source file (TOML)."""
    try:
        data = toml_loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReleasePolicyError(f"cannot read release policy {path}: {exc}") from None
    try:
        version, caps, analyst_caps = _parse(data)
    except (TypeError, ValueError, KeyError) as exc:
        raise ReleasePolicyError(f"release policy {path}: {exc}") from None
    return {
        "version": version,
        "cap": [_entry(c) for c in caps.values()],
        "analyst_cap": [_entry(c) for c in analyst_caps.values()],
    }


def sign_release_policy(path: Path, key: Ed25519PrivateKey) -> dict[str, Any]:
    """The DSSE envelope of the policy source `path`, signed by `key`."""
    return sign(RELEASE_POLICY_TYPE, policy_payload(path), key)


def load_release_policy(path: Path, trusted: Mapping[str, Ed25519PublicKey]) -> ReleasePolicy:
    """The signed policy at `path`, verified against `trusted` (key id -> public key).

    ReleasePolicyError (one line) when the file is not a signed policy, was
    altered after signing, is signed by no trusted key, or is malformed.
    """
    try:
        envelope = read_json(path)
    except (OSError, ValueError):
        envelope = None
    if not is_envelope(envelope):
        raise ReleasePolicyError(
            f"release policy {path} is not signed: sign it with `fedldp release-service "
            "sign-policy` and trust the signer with --policy-key"
        )
    try:
        payload, signer = verify(
            envelope,
            RELEASE_POLICY_TYPE,
            trusted,
            what="release policy",
            key_hint="pass the operator's release-policy public key with --policy-key",
        )
        raw = base64.b64decode(envelope["payload"], validate=True)
        version, caps, analyst_caps = _parse(payload)
    except SignatureError as exc:
        raise ReleasePolicyError(f"release policy {path}: {exc}") from None
    except (TypeError, ValueError, KeyError, binascii.Error) as exc:
        raise ReleasePolicyError(f"release policy {path}: {exc}") from None
    return ReleasePolicy(version, caps, hashlib.sha256(raw).hexdigest(), analyst_caps, signer)


def _entry(cap: Cap) -> dict[str, str]:
    out = {
        "dataset": cap.dataset,
        "purpose": cap.purpose,
        "epsilon": str(cap.epsilon),
        "delta": str(cap.delta),
    }
    if cap.analyst is not None:
        out["analyst"] = cap.analyst
    return out


def _parse(
    data: dict[str, Any],
) -> tuple[int, dict[tuple[str, str], Cap], dict[tuple[str, str, str], Cap]]:
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError("version must be a positive integer")
    unknown = set(data) - {"version", "cap", "analyst_cap"}
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)}")
    caps: dict[tuple[str, str], Cap] = {}
    for entry in data.get("cap", []):
        cap = _cap(dict(entry), analyst=False)
        if (cap.dataset, cap.purpose) in caps:
            raise ValueError(f"two caps for {cap.describe()}")
        caps[(cap.dataset, cap.purpose)] = cap
    analyst_caps: dict[tuple[str, str, str], Cap] = {}
    for entry in data.get("analyst_cap", []):
        cap = _cap(dict(entry), analyst=True)
        assert cap.analyst is not None
        if (cap.dataset, cap.purpose) not in caps:
            raise ValueError(f"an analyst cap needs a [[cap]] for its purpose: {cap.describe()}")
        if (cap.dataset, cap.purpose, cap.analyst) in analyst_caps:
            raise ValueError(f"two caps for {cap.describe()}")
        analyst_caps[(cap.dataset, cap.purpose, cap.analyst)] = cap
    return version, caps, analyst_caps


def _cap(spec: dict[str, Any], *, analyst: bool) -> Cap:
    keys = {"dataset", "purpose", "epsilon", "delta"} | ({"analyst"} if analyst else set())
    if set(spec) != keys:
        section = "[[analyst_cap]]" if analyst else "[[cap]]"
        raise ValueError(f"each {section} has exactly {', '.join(sorted(keys))}")
    cap = Cap(
        str(spec["dataset"]),
        str(spec["purpose"]),
        plain_decimal(spec["epsilon"], "epsilon"),
        plain_decimal(spec["delta"], "delta"),
        check_subject(str(spec["analyst"])) if analyst else None,
    )
    if cap.epsilon < 0 or cap.delta < 0 or cap.delta >= 1:
        raise ValueError("a cap needs epsilon >= 0 and 0 <= delta < 1")
    return cap
