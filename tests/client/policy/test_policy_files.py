"""Key files, the trust folder and the collector's policy folder."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from fedldp.authoring import (
    Authority,
    generate_key,
    load_private_key,
    write_envelope,
    write_private_key,
    write_public_key,
)
from fedldp.client.policy import (
    AudienceMismatchError,
    ConflictingPolicyError,
    ExpiredPolicyError,
    InvalidPolicyError,
    KeyFileError,
    RootRotationError,
    TrustStore,
    UnknownKeyError,
    key_id_of,
    load_policy_folder,
    load_public_key,
    load_trust_folder,
    read_envelope,
)
from fedldp.v1 import policy_pb2

DAY = 86400


def test_private_key_file_is_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    key = generate_key()
    old = os.umask(0)
    try:
        path = write_private_key(key, tmp_path / "k.key")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key_id_of(load_private_key(path).public_key()) == key_id_of(key.public_key())
    with pytest.raises(FileExistsError):
        write_private_key(key, path)


def test_encrypted_private_key(tmp_path: Path) -> None:
    key = generate_key()
    path = write_private_key(key, tmp_path / "k.key", passphrase=b"pw")
    assert b"ENCRYPTED" in path.read_bytes()
    load_private_key(path, passphrase=b"pw")
    with pytest.raises(KeyFileError, match="passphrase"):
        load_private_key(path)
    with pytest.raises(KeyFileError):
        load_private_key(path, passphrase=b"wrong")


def test_public_key_files(tmp_path: Path) -> None:
    key = generate_key()
    path = write_public_key(key.public_key(), tmp_path / "k.pub")
    assert key_id_of(load_public_key(path)) == key_id_of(key.public_key())
    private = write_private_key(key, tmp_path / "k.key")
    with pytest.raises(KeyFileError, match="private key"):
        load_public_key(private)
    (tmp_path / "junk.pub").write_text("not a key")
    with pytest.raises(KeyFileError):
        load_public_key(tmp_path / "junk.pub")


def test_envelope_files_round_trip_exact_bytes(
    tmp_path: Path, envelope: policy_pb2.SignedEnvelope
) -> None:
    path = write_envelope(envelope, tmp_path / "new" / "folder" / "p.policy")
    assert read_envelope(path).payload == envelope.payload
    assert not list(path.parent.glob("*.tmp"))
    (tmp_path / "junk.policy").write_bytes(b"\xff\xff\xff")
    with pytest.raises(InvalidPolicyError):
        read_envelope(tmp_path / "junk.policy")


def _trust_folder(tmp_path: Path, authority: Authority) -> Path:
    folder = tmp_path / "trust"
    (folder / "pinned").mkdir(parents=True)
    write_public_key(authority.root_public_keys[0], folder / "pinned" / "root.pub")
    write_envelope(authority.root_envelope, folder / "1.root")
    return folder


def test_trust_folder(tmp_path: Path, authority: Authority, now: int) -> None:
    folder = _trust_folder(tmp_path, authority)
    trust = load_trust_folder(folder, now=now)
    assert trust.root_version == 1
    assert trust.policy_key_ids() == [authority.policy_key_id]
    (folder / "pinned" / "root.pub").unlink()
    with pytest.raises(RootRotationError, match="pinned"):
        load_trust_folder(folder, now=now)


def _sign(authority: Authority, now: int, **overrides: object) -> policy_pb2.SignedEnvelope:
    fields: dict[str, object] = {
        "policy_id": "homepage",
        "metric": "browser.homepage",
        "labels": ["a", "b", "c"],
        "epsilon": "1",
        "epsilon_cap": "3",
        "window_seconds": DAY,
        "now": now,
        "audience": ["prod-eu"],
    }
    fields.update(overrides)
    return authority.sign(authority.categorical_policy(**fields))  # type: ignore[arg-type]


def test_policy_folder(tmp_path: Path, authority: Authority, trust: TrustStore, now: int) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    write_envelope(_sign(authority, now), folder / "homepage-v1.policy")
    write_envelope(_sign(authority, now, version=2), folder / "homepage-v2.policy")
    write_envelope(_sign(authority, now, policy_id="other"), folder / "other.policy")
    write_envelope(
        _sign(authority, now - 40 * DAY, policy_id="old"), folder / "old.policy"
    )  # expired
    write_envelope(
        _sign(authority, now, policy_id="us", audience=["prod-us"]), folder / "us.policy"
    )
    stranger = Authority.generate(now=now)
    write_envelope(_sign(stranger, now, policy_id="rogue"), folder / "rogue.policy")
    (folder / "junk.policy").write_bytes(b"\x00garbage")
    write_envelope(_sign(authority, now, policy_id="gone"), folder / "gone.policy.retired")
    (folder / "README.txt").write_text("ignored")

    accepted, refused = load_policy_folder(folder, trust, now=now, audience="prod-eu")
    assert [(p.policy_id, p.version) for p in accepted] == [
        ("homepage", 1),
        ("homepage", 2),
        ("other", 1),
    ]
    reasons = {path.name: type(error) for path, error in refused}
    assert reasons == {
        "old.policy": ExpiredPolicyError,
        "us.policy": AudienceMismatchError,
        "rogue.policy": UnknownKeyError,
        "junk.policy": InvalidPolicyError,
    }

    # Retire one policy entirely and one version of another.
    (folder / "retired").write_text("# retired policies\nother\nhomepage 1  # superseded\n")
    accepted, _ = load_policy_folder(folder, trust, now=now, audience="prod-eu")
    assert [(p.policy_id, p.version) for p in accepted] == [("homepage", 2)]

    # A malformed retired list refuses everything rather than serving a retired policy.
    (folder / "retired").write_text("homepage one\n")
    accepted, refused = load_policy_folder(folder, trust, now=now, audience="prod-eu")
    assert accepted == []
    assert all(isinstance(error, InvalidPolicyError) for _, error in refused)


def test_conflicting_versions_are_both_refused(
    tmp_path: Path, authority: Authority, trust: TrustStore, now: int
) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    write_envelope(_sign(authority, now), folder / "a.policy")
    write_envelope(_sign(authority, now, epsilon="0.5"), folder / "b.policy")
    accepted, refused = load_policy_folder(folder, trust, now=now, audience="prod-eu")
    assert accepted == []
    assert sorted(path.name for path, _ in refused) == ["a.policy", "b.policy"]
    assert all(isinstance(error, ConflictingPolicyError) for _, error in refused)
    # The same bytes twice is not a conflict.
    write_envelope(read_envelope(folder / "a.policy"), folder / "b.policy")
    accepted, refused = load_policy_folder(folder, trust, now=now, audience="prod-eu")
    assert len(accepted) == 1 and refused == []
