"""`fedldp policy`: sign a policy TOML file, verify an envelope, show what it holds.

`sign` reads the human-writable TOML schema (docs/policies.md,
deploy/policies/example-policy.toml), validates it (every problem at once) and
writes the signed envelope (serialized `fedldp.v1.SignedEnvelope`). `verify`
runs exactly the device/collector verification. `show` decodes an envelope
without trusting it, with its digest and signing key ids.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fedldp.cli_common import decimal_option, trust_option
from fedldp.cli_keys import load_keys, now_option, passphrase_from_env

if TYPE_CHECKING:
    from fedldp.client.policy import TrustStore
    from fedldp.v1 import policy_pb2


@click.group(name="policy")
def policy() -> None:
    """Signed collection policies: sign, verify, show."""


@policy.command()
@click.argument("policy_file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--key",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Policy-signing private key (listed in the current root).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    help="Envelope to write, e.g. policies/browser-homepage-v3.policy.",
)
@click.option("--passphrase-env", metavar="VAR", help="Passphrase of an encrypted key.")
@click.option(
    "--previous",
    type=click.Path(exists=True, dir_okay=False),
    help="The last signed envelope of this policy id: refuse a version that changes its "
    "metric name or budget window, or does not raise the version number.",
)
def sign(
    policy_file: str, key: str, out: str, passphrase_env: str | None, previous: str | None
) -> None:
    """Validate POLICY_FILE (TOML) and write its signed envelope to --out.

    Every problem in the file is listed at once; nothing is written unless the
    policy is valid (and, with --previous, can follow that version: see
    docs/policies.md, "Versions and budgets").
    """
    from fedldp.authoring import load_policy_toml, sign_policy, successor_problems, write_envelope
    from fedldp.client.policy import InvalidPolicyError, key_id_of, policy_digest
    from fedldp.v1 import policy_pb2

    if not Path(out).parent.is_dir():
        raise click.BadParameter(
            f"folder {Path(out).parent} does not exist (create it first)", param_hint="--out"
        )
    (private_key,) = load_keys((key,), passphrase_from_env(passphrase_env))
    notes: list[str] = []
    try:
        message = load_policy_toml(policy_file, notes=notes)
    except InvalidPolicyError as exc:
        lines = "\n".join(f"  - {problem}" for problem in exc.problems)
        raise click.ClickException(f"{policy_file} is not a valid policy:\n{lines}") from None
    if previous is not None:
        problems = successor_problems(_previous_policy(previous), message)
        if problems:
            lines = "\n".join(f"  - {problem}" for problem in problems)
            raise click.ClickException(
                f"{policy_file} cannot follow {previous}:\n{lines}"
            ) from None
    try:
        envelope = sign_policy(message, private_key)
    except InvalidPolicyError as exc:
        lines = "\n".join(f"  - {problem}" for problem in exc.problems)
        raise click.ClickException(f"{policy_file} is not a valid policy:\n{lines}") from None
    write_envelope(envelope, out)
    message = policy_pb2.Policy.FromString(envelope.payload)
    click.echo(f"wrote {out}: policy {message.policy_id} v{message.version}")
    click.echo(f"digest: {policy_digest(envelope.payload).hex()}")
    click.echo(f"key id: {key_id_of(private_key.public_key())}")
    for line in notes:  # what authoring chose for the author (a sketch's auto size: why)
        click.echo(line)
    for line in privacy_figures(message):
        click.echo(line)


def privacy_figures(message: policy_pb2.Policy) -> list[str]:
    """What the signed policy lets a subject lose, for the author to read before shipping.

    The per-report charge (the ledger's and the device guard's), how many reports
    one window admits and the worst-case loss per window over ANY values (changed
    or not): floor(cap / charge) · charge <= cap. For a memoized mechanism also the
    loss while one value never changes (at most ε∞) and the retired r* rule's
    charge, so the author sees what changing values cost (docs/mechanisms.md).
    """
    from fedldp.client.mechanisms.memo import Memoized
    from fedldp.client.mechanisms.memo_loss import JointLossTooCostlyError
    from fedldp.client.policy import policy_problems

    _, mechanism = policy_problems(message)
    if mechanism is None:
        return []
    charge = mechanism.report_charge
    cap = Decimal(message.budget.epsilon_cap)
    fits = int(cap // charge)
    lines = [
        f"charge: {charge} per report (epsilon {mechanism.epsilon}); a window of "
        f"{message.budget.window_seconds} s with cap {cap} admits {fits} report(s): "
        f"worst-case loss per window {fits * charge} over any values, changed or not"
    ]
    if isinstance(mechanism, Memoized):
        try:
            retired = str(mechanism.retired_report_charge)
        except JointLossTooCostlyError:
            retired = "too costly to compute"
        lines.append(
            f"memoized: while one value never changes its reports lose at most "
            f"epsilon_permanent {mechanism.epsilon_permanent} (RAPPOR's guarantee); each "
            f"report of a changing value can add "
            f"{mechanism.instantaneous_epsilon}, so every report is charged {charge} "
            f"(the retired r* rule charged {retired}); there is no lifetime cap"
        )
    return lines


def _previous_policy(path: str) -> policy_pb2.Policy:
    """The policy inside the envelope at `path` (an authoring check: the operator's own
    file, read without verifying its signature; collectors and devices verify)."""
    from google.protobuf.message import DecodeError

    from fedldp.client.policy import POLICY_PAYLOAD_TYPE, PolicyError, read_envelope
    from fedldp.v1 import policy_pb2

    try:
        envelope = read_envelope(path)
        if envelope.payload_type != POLICY_PAYLOAD_TYPE:
            raise click.ClickException(f"--previous {path} is not a policy envelope")
        return policy_pb2.Policy.FromString(envelope.payload)
    except (OSError, DecodeError, PolicyError) as exc:
        raise click.ClickException(f"cannot read --previous {path}: {exc}") from None


def _trust(
    trust_dir: str | None, roots: tuple[str, ...], pins: tuple[str, ...], now: int
) -> TrustStore:
    from fedldp.client.policy import (
        KeyFileError,
        PolicyError,
        load_public_key,
        load_trust,
        load_trust_folder,
        read_envelope,
    )

    try:
        if trust_dir is not None:
            return load_trust_folder(trust_dir, now=now)
        if not roots or not pins:
            raise click.UsageError("give --trust, or --root and --pin")
        return load_trust(
            [load_public_key(p) for p in pins], [read_envelope(r) for r in roots], now=now
        )
    except (PolicyError, KeyFileError, OSError) as exc:
        raise click.ClickException(f"cannot build the trust store: {exc}") from None


def _decimal(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Decimal | None:
    if value is None:
        return None
    parsed = decimal_option(value, f"--{_param.name or 'value'}".replace("_", "-"))
    if parsed <= 0:
        raise click.BadParameter("must be positive")
    return parsed


@policy.command()
@click.argument("envelope_file", type=click.Path(exists=True, dir_okay=False))
@trust_option(help="Trust folder: pinned/*.pem|*.pub root keys and *.root envelopes.")
@click.option(
    "--root",
    "roots",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Root envelope (repeat for the chain, any order).",
)
@click.option(
    "--pin",
    "pins",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Pinned root public key (repeat for several).",
)
@click.option(
    "--now", type=click.IntRange(min=0), help="Unix time to verify at (default: the clock)."
)
@click.option("--audience", help="Collector deployment name the policy must be addressed to.")
@click.option("--max-epsilon", callback=_decimal, help="Device maximum per-report epsilon.")
@click.option("--max-epsilon-cap", callback=_decimal, help="Device maximum epsilon per window.")
@click.option(
    "--highest-version",
    type=int,
    help="Highest version already accepted for this policy id (rollback check).",
)
def verify(
    envelope_file: str,
    trust_dir: str | None,
    roots: tuple[str, ...],
    pins: tuple[str, ...],
    now: int | None,
    audience: str | None,
    max_epsilon: Decimal | None,
    max_epsilon_cap: Decimal | None,
    highest_version: int | None,
) -> None:
    """Verify ENVELOPE_FILE as a device or collector would; exit 1 if refused."""
    from google.protobuf.message import DecodeError

    from fedldp.client.policy import PolicyError, read_envelope, verify_policy
    from fedldp.v1 import policy_pb2

    clock = now_option(now)
    trust = _trust(trust_dir, roots, pins, clock)
    try:
        envelope = read_envelope(envelope_file)
        highest: dict[str, int] | None = None
        if highest_version is not None:
            unverified_id = policy_pb2.Policy.FromString(envelope.payload).policy_id
            highest = {unverified_id: highest_version}
        verified = verify_policy(
            envelope,
            trust,
            now=clock,
            highest_versions=highest,
            max_epsilon=max_epsilon,
            max_epsilon_cap=max_epsilon_cap,
            audience=audience,
        )
    except (PolicyError, DecodeError) as exc:
        click.echo(f"REFUSED ({type(exc).__name__}): {exc}", err=True)
        raise SystemExit(1) from None
    click.echo(
        f"OK: policy {verified.policy_id} v{verified.version}, metric {verified.metric_name}, "
        f"mechanism {verified.mechanism_id} epsilon {verified.epsilon} per report, "
        f"charge {verified.charge} per report, "
        f"cap {verified.epsilon_cap} per {verified.window_seconds} s, "
        f"valid [{verified.not_before}, {verified.expires_at})"
    )
    click.echo(f"digest: {verified.digest.hex()}")
    click.echo(f"key id: {verified.key_id} (trusted by root v{trust.root_version})")


def describe_envelope(envelope: policy_pb2.SignedEnvelope) -> dict[str, Any]:
    """A JSON-ready description of an envelope, decoded WITHOUT verification."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError

    from fedldp.client.policy import (
        POLICY_PAYLOAD_TYPE,
        ROOT_PAYLOAD_TYPE,
        policy_digest,
        policy_problems,
    )
    from fedldp.v1 import policy_pb2

    info: dict[str, Any] = {
        "verified": False,
        "payload_type": envelope.payload_type,
        "payload_bytes": len(envelope.payload),
        "digest": policy_digest(envelope.payload).hex(),
        "signatures": [{"key_id": s.key_id, "sig_bytes": len(s.sig)} for s in envelope.signatures],
    }
    kinds: dict[str, type[policy_pb2.Policy] | type[policy_pb2.Root]] = {
        POLICY_PAYLOAD_TYPE: policy_pb2.Policy,
        ROOT_PAYLOAD_TYPE: policy_pb2.Root,
    }
    kind = kinds.get(envelope.payload_type)
    if kind is None:
        info["error"] = "unknown payload type; not decoded"
        return info
    try:
        message = kind.FromString(envelope.payload)
    except DecodeError as exc:
        info["error"] = f"payload does not decode: {exc}"
        return info
    decoded = json_format.MessageToDict(message, preserving_proto_field_name=True)
    if isinstance(message, policy_pb2.Policy) and message.metric.HasField("categorical"):
        decoded["metric"]["categorical"]["digest"] = message.metric.categorical.digest.hex()
    if isinstance(message, policy_pb2.Policy) and message.metric.HasField("multi"):
        attributes = decoded["metric"]["multi"].get("attributes", [])
        for entry, attribute in zip(attributes, message.metric.multi.attributes, strict=True):
            if attribute.HasField("categorical"):
                entry["categorical"]["digest"] = attribute.categorical.digest.hex()
    if isinstance(message, policy_pb2.Policy):
        _, mechanism = policy_problems(message)
        if mechanism is not None:  # what a report costs, from the content alone
            info["epsilon_per_report"] = str(mechanism.epsilon)
            info["charge_per_report"] = str(mechanism.report_charge)
    if isinstance(message, policy_pb2.Root):
        for role in ("root_keys", "policy_keys"):
            for entry, raw in zip(decoded.get(role, []), getattr(message, role), strict=True):
                entry["ed25519"] = raw.ed25519.hex()
    info["decoded"] = decoded
    return info


@policy.command()
@click.argument("envelope_file", type=click.Path(exists=True, dir_okay=False))
def show(envelope_file: str) -> None:
    """Decode ENVELOPE_FILE (policy or root) as JSON, with its digest and key ids.

    Nothing is verified (use `fedldp policy verify` for that); the output says so.
    """
    from fedldp.client.policy import PolicyError, read_envelope

    try:
        envelope = read_envelope(envelope_file)
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(describe_envelope(envelope), indent=2, ensure_ascii=False))
