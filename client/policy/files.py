"""Files: key files, envelope files, the trust folder and the policy folder.

Formats (see docs/policies.md):

* public key: PEM SubjectPublicKeyInfo Ed25519;
* envelope (``*.policy``, ``*.root``): the serialized `fedldp.v1.SignedEnvelope`
  protobuf bytes, exactly as signed and as served over gRPC;
* trust folder: ``pinned/*.pem`` (or ``*.pub``), the pinned root public keys, and
  ``*.root`` root envelopes; roots are applied in increasing version order from the
  one the pinned keys signed, by the same rules as on a device;
* policy folder: ``*.policy`` envelopes, plus an optional ``retired`` file listing
  retired policies, one per line: ``POLICY_ID`` (every version) or
  ``POLICY_ID VERSION``; ``#`` starts a comment. Renaming a file to
  ``*.policy.retired`` also retires it (it is no longer loaded).

Reading files is the only I/O here (devices read, never write: writing keys and
envelopes, and private keys altogether, belong to `fedldp.authoring.key_files`);
verification itself stays a pure function.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fedldp.client.policy.envelope import MAX_PAYLOAD_BYTES, ROOT_PAYLOAD_TYPE
from fedldp.client.policy.errors import (
    ConflictingPolicyError,
    InvalidPolicyError,
    PolicyError,
    RootRotationError,
)
from fedldp.client.policy.trust import TrustStore
from fedldp.client.policy.verify import VerifiedPolicy, verify_policy
from fedldp.v1 import policy_pb2
from google.protobuf.message import DecodeError

RETIRED_FILE = "retired"
_MAX_ENVELOPE_FILE_BYTES = MAX_PAYLOAD_BYTES + 64 * 1024


class KeyFileError(ValueError):
    """A key file is missing, malformed, of the wrong type, or wrongly encrypted."""


# --- keys ---


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """Read a PEM SubjectPublicKeyInfo Ed25519 public key (a private key file also works)."""
    path = Path(path)
    data = path.read_bytes()
    if b"PRIVATE KEY" in data:
        raise KeyFileError(f"{path} holds a private key; pass the public key file (.pub) instead")
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise KeyFileError(f"{path} is not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} is not an Ed25519 public key")
    return key


# --- envelopes ---


def read_envelope(path: str | Path) -> policy_pb2.SignedEnvelope:
    """Read a serialized SignedEnvelope. Raises InvalidPolicyError if unreadable."""
    path = Path(path)
    size = path.stat().st_size
    if size > _MAX_ENVELOPE_FILE_BYTES:
        raise InvalidPolicyError([f"{path.name} is {size} bytes, larger than any valid envelope"])
    if size == 0:
        raise InvalidPolicyError([f"{path.name} is empty"], subject="envelope file")
    try:
        return policy_pb2.SignedEnvelope.FromString(path.read_bytes())
    except DecodeError as exc:
        raise InvalidPolicyError(
            [f"{path.name} is not a serialized fedldp.v1.SignedEnvelope ({exc})"],
            subject="envelope file",
        ) from None


# --- trust ---


def _natural_key(path: Path) -> tuple[int, str]:
    digits = "".join(ch for ch in path.stem if ch.isdigit())
    return (int(digits) if digits else 0, path.name)


def load_trust(
    pinned_keys: Sequence[Ed25519PublicKey],
    roots: Iterable[policy_pb2.SignedEnvelope],
    *,
    now: int,
) -> TrustStore:
    """A trust store from pinned root keys and a set of root envelopes (any order).

    The first root accepted is one the pinned keys sign (the lowest such one
    that verifies); the rest are applied by the TUF rotation rule until none
    applies. Raises RootRotationError if no root is signed by the pinned keys.
    """
    pending = list(roots)
    trust: TrustStore | None = None
    errors: list[str] = []
    for index, envelope in enumerate(pending):
        try:
            candidate = TrustStore.from_pinned_root(envelope, pinned_keys, now=now)
        except PolicyError as exc:
            errors.append(str(exc))
            continue
        if trust is None or candidate.root_version < trust.root_version:
            trust, first = candidate, index
    if trust is None:
        raise RootRotationError(
            "no root envelope is signed by the pinned root keys: "
            + ("; ".join(errors) if errors else "no roots given")
        )
    rest = [envelope for index, envelope in enumerate(pending) if index != first]
    progress = True
    while progress and rest:
        progress = False
        for envelope in list(rest):
            try:
                trust.update_root(envelope, now=now)
            except PolicyError:
                continue
            rest.remove(envelope)
            progress = True
    return trust


def load_trust_folder(path: str | Path, *, now: int) -> TrustStore:
    """A trust store from a trust folder: ``pinned/*.pem|*.pub`` and ``*.root`` files."""
    folder = Path(path)
    pinned_dir = folder / "pinned"
    key_files = sorted([*pinned_dir.glob("*.pem"), *pinned_dir.glob("*.pub")])
    if not key_files:
        raise RootRotationError(
            f"{pinned_dir} has no pinned root public keys (*.pem or *.pub); copy the root "
            "public key there"
        )
    pinned = [load_public_key(p) for p in key_files]
    roots = [read_envelope(p) for p in sorted(folder.glob("*.root"), key=_natural_key)]
    for root in roots:
        if root.payload_type != ROOT_PAYLOAD_TYPE:
            raise RootRotationError(
                f"a *.root file in {folder} holds payload type {root.payload_type!r}"
            )
    return load_trust(pinned, roots, now=now)


# --- the collector's policy folder ---


def _read_retired(folder: Path) -> tuple[set[str], set[tuple[str, int]]]:
    whole: set[str] = set()
    versions: set[tuple[str, int]] = set()
    path = folder / RETIRED_FILE
    if not path.exists():
        return whole, versions
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) == 1:
            whole.add(parts[0])
        elif len(parts) == 2 and parts[1].isdigit():
            versions.add((parts[0], int(parts[1])))
        else:
            raise InvalidPolicyError(
                [f"{path.name} line {number}: write POLICY_ID or POLICY_ID VERSION"],
                subject=f"retired list {path}",
            )
    return whole, versions


def load_policy_folder(
    path: str | Path,
    trust: TrustStore,
    *,
    now: int,
    audience: str | None,
) -> tuple[list[VerifiedPolicy], list[tuple[Path, PolicyError]]]:
    """Verify every ``*.policy`` envelope in `path` for a collector deployment.

    Returns the accepted policies (sorted by policy id, version) and, for every
    file refused, its path and the PolicyError saying why. Retired policies (see
    the module docstring) are left out silently. Two files with the same
    (policy id, version) but different bytes are both refused
    (ConflictingPolicyError): a collector must never guess which one devices hold.
    Several versions of one policy may be active at once (during a rollout).
    A malformed ``retired`` file refuses everything (an InvalidPolicyError per
    file), because serving a policy its operator meant to retire is worse.
    """
    folder = Path(path)
    accepted: list[tuple[Path, VerifiedPolicy]] = []
    refused: list[tuple[Path, PolicyError]] = []
    files = sorted(folder.glob("*.policy"))
    try:
        retired_ids, retired_versions = _read_retired(folder)
    except InvalidPolicyError as exc:
        return [], [(file, exc) for file in files]
    for file in files:
        try:
            verified = verify_policy(read_envelope(file), trust, now=now, audience=audience)
        except PolicyError as exc:
            refused.append((file, exc))
            continue
        if verified.policy_id in retired_ids or (
            (verified.policy_id, verified.version) in retired_versions
        ):
            continue
        accepted.append((file, verified))
    by_key: dict[tuple[str, int], list[tuple[Path, VerifiedPolicy]]] = {}
    for file, verified in accepted:
        by_key.setdefault((verified.policy_id, verified.version), []).append((file, verified))
    result: list[VerifiedPolicy] = []
    for (policy_id, version), entries in sorted(by_key.items()):
        digests = {verified.digest for _, verified in entries}
        if len(digests) > 1:
            names = ", ".join(file.name for file, _ in entries)
            for file, _ in entries:
                refused.append(
                    (
                        file,
                        ConflictingPolicyError(
                            f"policy {policy_id} v{version} appears with different contents in "
                            f"{names}; keep one file and publish changes as a new version"
                        ),
                    )
                )
            continue
        result.append(entries[0][1])
    return result, refused
