"""The release policy: every central cap the service applies, signed by the operator.

Source format (TOML, written by the operator, then signed)::

    version = 3                      # a positive integer, raised on every change
    service_id = "release-service"   # optional (this default): the ledger subject prefix
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
composes with the old one (docs/release-service.md). `apply` also refuses a
policy that omits any cap the ledger records under its service id (a dropped
cap would no longer be enforced): every recorded cap must appear, at or below
its recorded value. The service id itself is part of the signed payload
(`service_id`, default "release-service"), so a second copy of every lifetime
cap under another id needs the operator's key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from fedldp.aggregator.central.signing import SignatureError, is_envelope, read_json, sign, verify
from fedldp.aggregator.service.catalog import CatalogError, plain_decimal, toml_loads
from fedldp.client.textfiles import read_utf8
from fedldp.collector.auth import check_subject

RELEASE_POLICY_TYPE = "application/vnd.fedldp.release-policy.v1+json"
DEFAULT_SERVICE_ID = "release-service"
_SERVICE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class ReleasePolicyError(CatalogError):
    """The release policy is malformed, unsigned, untrusted, or would raise a recorded cap."""


class CapLedger(Protocol):
    """What applying a policy needs from the ledger."""

    def central_cap(self, subject: str, purpose: str) -> tuple[Decimal, Decimal] | None:
        """The recorded (ε, δ) cap of (subject, purpose), or None when none is set
        (see `Ledger.central_cap`)."""
        ...

    def central_cap_keys(self, subject_prefix: str) -> list[tuple[str, str]]:
        """Every (subject, purpose) with a cap whose subject starts with
        `subject_prefix`, sorted (see `Ledger.central_cap_keys`)."""
        ...

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
    service_id: str = DEFAULT_SERVICE_ID

    def all_caps(self) -> Iterator[Cap]:
        """Every cap: the shared ones, then the analysts' own."""
        yield from self.caps.values()
        yield from self.analyst_caps.values()

    def apply(self, ledger: CapLedger, service_id: str | None = None) -> None:
        """Set every cap in the ledger under the service's own subjects.

        ReleasePolicyError, with nothing written, when `service_id` is not the
        policy's own, when a cap would exceed the one the ledger already records,
        or when the ledger records a cap under this service id that the policy
        omits (module docstring).
        """
        if service_id is not None and service_id != self.service_id:
            raise ReleasePolicyError(
                f"release policy v{self.version} is signed for service id {self.service_id!r}, "
                f"not {service_id!r}: the service id names the ledger subjects of every cap, "
                "so it is part of the signed policy"
            )
        service_id = self.service_id
        listed = {(c.subject(service_id), c.purpose) for c in self.all_caps()}
        for subject, purpose in ledger.central_cap_keys(service_id + "/"):
            if (subject, purpose) not in listed:
                raise ReleasePolicyError(
                    f"release policy v{self.version} omits the cap recorded in the ledger for "
                    f"subject {subject}, purpose {purpose}; a recorded cap can be lowered "
                    "(to 0 to close it) or kept, never dropped"
                )
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


def check_grants(policy: ReleasePolicy, granted: Callable[[str, str, str], bool]) -> None:
    """ReleasePolicyError naming each [[analyst_cap]] whose analyst the catalog does not
    grant that (dataset, purpose): such a cap would silently protect nobody.

    `granted(dataset, purpose, analyst)` is the catalog's grant test.
    """
    stray = [
        c.describe()
        for c in policy.analyst_caps.values()
        if not granted(c.dataset, c.purpose, c.analyst or "")
    ]
    if stray:
        raise ReleasePolicyError(
            f"release policy v{policy.version} caps an analyst the catalog does not grant "
            f"that purpose: {'; '.join(stray)} (subjects are case-sensitive)"
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
        data = toml_loads(
            read_utf8(path, "a release policy is a UTF-8 TOML file", ReleasePolicyError)
        )
    except ReleasePolicyError:
        raise
    except (OSError, ValueError) as exc:
        raise ReleasePolicyError(f"cannot read release policy {path}: {exc}") from None
    try:
        version, caps, analyst_caps = _parse(data)
        service_id = _service_id(data)
    except (TypeError, ValueError, KeyError) as exc:
        raise ReleasePolicyError(f"release policy {path}: {exc}") from None
    return {
        "version": version,
        "service_id": service_id,
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
        service_id = _service_id(payload)
    except SignatureError as exc:
        raise ReleasePolicyError(f"release policy {path}: {exc}") from None
    except (TypeError, ValueError, KeyError, binascii.Error) as exc:
        raise ReleasePolicyError(f"release policy {path}: {exc}") from None
    digest = hashlib.sha256(raw).hexdigest()
    return ReleasePolicy(version, caps, digest, analyst_caps, signer, service_id)


def _service_id(data: dict[str, Any]) -> str:
    """The policy's service id: a catalog-style id without '/' (default "release-service")."""
    value = data.get("service_id", DEFAULT_SERVICE_ID)
    if not isinstance(value, str) or not _SERVICE_ID_RE.fullmatch(value):
        raise ValueError("service_id must be 1-64 of A-Z a-z 0-9 . _ - (starting alphanumeric)")
    return value


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
    unknown = set(data) - {"version", "service_id", "cap", "analyst_cap"}
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
