"""`fedldp keys`: signing keys and root metadata (generate, init-root, rotate, id).

Private keys are PEM PKCS#8 files created with mode 0600 and never overwritten,
optionally encrypted with a passphrase read from an environment variable (never
from the command line, where it would land in shell history and `ps`).
Times are Unix seconds, ISO 8601 date-times with an offset (2027-01-01T00:00:00Z),
or offsets from --now such as +90d.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedldp.v1 import policy_pb2


F = TypeVar("F", bound=Callable[..., Any])

_KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def passphrase_from_env(variable: str | None) -> bytes | None:
    """The passphrase held in environment variable `variable` (None: no passphrase)."""
    if variable is None:
        return None
    value = os.environ.get(variable)
    if not value:
        raise click.UsageError(f"environment variable {variable} is not set or empty")
    return value.encode("utf-8")


def parse_when(text: str, *, now: int) -> int:
    """Unix seconds from "1798761600", "2027-01-01T00:00:00Z" or "+90d" (relative to now)."""
    from fedldp.authoring import parse_duration

    text = text.strip()
    if text.isdigit():
        return int(text)
    if text.startswith("+"):
        try:
            return now + parse_duration(text[1:])
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a time; use Unix seconds, 2027-01-01T00:00:00Z or +90d"
        ) from None
    if when.tzinfo is None:
        raise click.BadParameter(f"{text!r} has no UTC offset; append Z or +hh:mm")
    return int(when.timestamp())


def now_option(value: int | None) -> int:
    """--now if given (reproducible runs, tests), else the real clock."""
    return int(time.time()) if value is None else value


def load_keys(paths: tuple[str, ...], passphrase: bytes | None) -> list[Ed25519PrivateKey]:
    """Load private keys, turning file problems into a click error."""
    from fedldp.authoring import load_private_key
    from fedldp.client.policy import KeyFileError

    try:
        return [load_private_key(path, passphrase=passphrase) for path in paths]
    except (KeyFileError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


def public_key_or_id(text: str) -> str:
    """A key id given directly (64 hex digits) or read from a public key file."""
    from fedldp.client.policy import KeyFileError, key_id_of, load_public_key

    if re.fullmatch(r"[0-9a-f]{64}", text):
        return text
    try:
        return key_id_of(load_public_key(text))
    except (KeyFileError, OSError) as exc:
        raise click.BadParameter(
            f"{text}: not a key id (64 hex) nor a public key file ({exc})"
        ) from None


def _write_root(envelope: policy_pb2.SignedEnvelope, out: Path) -> None:
    from fedldp.authoring import write_envelope
    from fedldp.v1 import policy_pb2

    write_envelope(envelope, out)
    root = policy_pb2.Root.FromString(envelope.payload)
    click.echo(
        f"wrote {out}: root v{root.version}, {len(root.root_keys)} root key(s) "
        f"(threshold {root.root_threshold}), {len(root.policy_keys)} policy key(s), "
        f"{len(envelope.signatures)} signature(s)"
    )


def _signing_options(fn: F) -> F:
    """--passphrase-env VAR (for encrypted private keys) and --now (instead of the clock)."""
    fn = click.option(
        "--now", type=click.IntRange(min=0), help="Unix time to use instead of the clock."
    )(fn)
    return click.option(
        "--passphrase-env", metavar="VAR", help="Passphrase for encrypted private keys."
    )(fn)


@click.group(name="keys")
def keys() -> None:
    """Signing keys and root metadata for collection policies."""


@keys.command()
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for NAME.key (private, 0600) and NAME.pub (public).",
)
@click.option("--name", default="signing", show_default=True, help="Base name of the key files.")
@click.option(
    "--passphrase-env",
    metavar="VAR",
    help="Encrypt the private key with the passphrase in environment variable VAR.",
)
def generate(out_dir: str, name: str, passphrase_env: str | None) -> None:
    """Generate an Ed25519 key pair: OUT/NAME.key (PEM PKCS#8, mode 0600) and OUT/NAME.pub.

    Existing files are never overwritten. Prints the key id (SHA-256 of the raw
    public key), which roots and envelopes use to name the key.
    """
    from fedldp.authoring import generate_key, write_private_key, write_public_key
    from fedldp.client.policy import key_id_of

    if not _KEY_NAME.fullmatch(name):
        raise click.BadParameter("use letters, digits, '.', '_' and '-'", param_hint="--name")
    passphrase = passphrase_from_env(passphrase_env)
    folder = Path(out_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_path, public_path = folder / f"{name}.key", folder / f"{name}.pub"
    for path in (private_path, public_path):
        if path.exists():
            raise click.ClickException(f"{path} exists; choose another --name or folder")
    key = generate_key()
    write_private_key(key, private_path, passphrase=passphrase)
    write_public_key(key.public_key(), public_path)
    click.echo(f"private key: {private_path} (mode 0600{', encrypted' if passphrase else ''})")
    click.echo(f"public key:  {public_path}")
    click.echo(f"key id:      {key_id_of(key.public_key())}")


@keys.command(name="data-key")
@click.option(
    "--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Key file (0600)."
)
def data_key(out_path: str) -> None:
    """Generate a secret data-digest key (32 random bytes, hex, mode 0600; never overwrites).

    Receipts and ledger events bind protected data only through an HMAC under
    this key; keep it with the service, never publish it. Prints its public id.
    """
    from fedldp.aggregator.central.datakey import generate_data_key

    try:
        key = generate_data_key(out_path)
    except FileExistsError:
        raise click.ClickException(f"{out_path} exists; a key is never overwritten") from None
    click.echo(f"data-digest key: {out_path} (mode 0600, secret)")
    click.echo(f"key id:          {key.key_id}")


@keys.command(name="id")
@click.argument("key_file", type=click.Path(exists=True, dir_okay=False))
def key_id(key_file: str) -> None:
    """Print the key id of a public key file."""
    from fedldp.client.policy import KeyFileError, key_id_of, load_public_key

    try:
        click.echo(key_id_of(load_public_key(key_file)))
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None


@keys.command(name="init-root")
@click.option(
    "--root-key",
    "root_keys",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Root private key (repeat for several); all of them sign root v1.",
)
@click.option(
    "--threshold",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Root signatures needed to accept the next root version.",
)
@click.option(
    "--policy-key",
    "policy_keys",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Public key allowed to sign policies (repeat for several).",
)
@click.option(
    "--policy-key-expires",
    default="+365d",
    show_default=True,
    help="When the policy keys stop being trusted.",
)
@click.option(
    "--expires",
    default="+365d",
    show_default=True,
    help="When this root expires (rotate before then).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Root envelope to write (e.g. trust/1.root).",
)
@_signing_options
def init_root(
    root_keys: tuple[str, ...],
    threshold: int,
    policy_keys: tuple[str, ...],
    policy_key_expires: str,
    expires: str,
    out: str,
    passphrase_env: str | None,
    now: int | None,
) -> None:
    """Create root version 1: the root keys and the policy keys they trust.

    Devices pin the root public keys (the .pub files) and receive this envelope.
    """
    from fedldp.authoring import make_root
    from fedldp.client.policy import InvalidPolicyError, KeyFileError, load_public_key

    clock = now_option(now)
    signers = load_keys(root_keys, passphrase_from_env(passphrase_env))
    try:
        policy_publics = [load_public_key(p) for p in policy_keys]
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None
    key_expiry = parse_when(policy_key_expires, now=clock)
    try:
        envelope = make_root(
            version=1,
            root_keys=signers,
            policy_keys=[(key, key_expiry) for key in policy_publics],
            expires_at=parse_when(expires, now=clock),
            threshold=threshold,
            signers=signers,
        )
    except InvalidPolicyError as exc:
        raise click.ClickException(str(exc)) from None
    _write_root(envelope, Path(out))


@keys.command()
@click.option(
    "--current",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The current root envelope (version N).",
)
@click.option(
    "--sign",
    "sign_keys",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Private root key to sign with (repeat): a threshold of the current "
    "root keys AND a threshold of the new ones.",
)
@click.option(
    "--add-root-key",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Public key to add as a root key.",
)
@click.option(
    "--remove-root-key", multiple=True, help="Root key to remove: key id or public key file."
)
@click.option(
    "--threshold", type=click.IntRange(min=1), help="New root signature threshold (at least 1)."
)
@click.option(
    "--add-policy-key",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Public key to add as a policy key (or re-add to extend its expiry).",
)
@click.option(
    "--policy-key-expires",
    default="+365d",
    show_default=True,
    help="Expiry of the policy keys added.",
)
@click.option(
    "--remove-policy-key", multiple=True, help="Policy key to retire: key id or public key file."
)
@click.option("--expires", help="New root expiry (default: unchanged).")
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Root envelope to write (version N+1).",
)
@_signing_options
def rotate(
    current: str,
    sign_keys: tuple[str, ...],
    add_root_key: tuple[str, ...],
    remove_root_key: tuple[str, ...],
    threshold: int | None,
    add_policy_key: tuple[str, ...],
    policy_key_expires: str,
    remove_policy_key: tuple[str, ...],
    expires: str | None,
    out: str,
    passphrase_env: str | None,
    now: int | None,
) -> None:
    """Write root version N+1 from version N: add or remove root and policy keys.

    The new root is signed by the current root keys and the new ones (TUF rule);
    the result is checked the way a device checks it before it is written.
    Publish every version in order: devices that missed one walk the chain.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from google.protobuf.message import DecodeError

    from fedldp.authoring import next_root
    from fedldp.client.policy import (
        KeyFileError,
        PolicyError,
        TrustStore,
        load_public_key,
        read_envelope,
    )
    from fedldp.v1 import policy_pb2

    clock = now_option(now)
    try:
        current_envelope = read_envelope(current)
        current_root = policy_pb2.Root.FromString(current_envelope.payload)
        signers = load_keys(sign_keys, passphrase_from_env(passphrase_env))
        envelope = next_root(
            current_root,
            signers=signers,
            expires_at=None if expires is None else parse_when(expires, now=clock),
            add_root_keys=[load_public_key(p) for p in add_root_key],
            remove_root_keys=[public_key_or_id(k) for k in remove_root_key],
            threshold=threshold,
            add_policy_keys=[
                (load_public_key(p), parse_when(policy_key_expires, now=clock))
                for p in add_policy_key
            ],
            remove_policy_keys=[public_key_or_id(k) for k in remove_policy_key],
        )
        # Check it exactly as a device holding the current root would.
        device = TrustStore.from_pinned_root(
            current_envelope,
            [Ed25519PublicKey.from_public_bytes(k.ed25519) for k in current_root.root_keys],
            now=clock,
        )
        device.update_root(envelope, now=clock)
    except (PolicyError, KeyFileError, OSError, DecodeError) as exc:
        raise click.ClickException(str(exc)) from None
    _write_root(envelope, Path(out))
