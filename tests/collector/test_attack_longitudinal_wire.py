"""Independent attack on the longitudinal wire and the retired-rule migration.

Wire: every off-domain loloha / dbitflip payload, parsed from the exact bytes a
device could send, is refused by the mechanism's check with a precise reason.
Migration: `fedldp ledger reconcile --policies` must list every subject window
charged below the sound figure.
"""

from __future__ import annotations

import hashlib
import secrets
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from collector_testkit import ChargedUnderRetiredRule, Deployment
from fedldp.authoring import write_envelope
from fedldp.authoring.signing import sign_envelope
from fedldp.client.mechanisms import (
    CategoryOutput,
    HashedOutput,
    IndexBitsOutput,
    OutputDomainError,
    create,
)
from fedldp.client.policy.envelope import POLICY_PAYLOAD_TYPE
from fedldp.client.wire import fill_payload, output_from_report
from fedldp.collector.ledger import ACCEPTED, CheckedReport, open_ledger
from fedldp.collector.ledger.charge_audit import ChargeGroup, sound_charges, undercharged
from fedldp.v1 import collector_pb2, policy_pb2

from fedldp.cli import main


def _dbitflip(d: int, buckets: int = 5) -> Any:
    """A dbitflip mechanism over [0, 1] (ε1 = 1, ε∞ = 2)."""
    return create(
        "dbitflip",
        Decimal(1),
        (Decimal(0), Decimal(1)),
        {"epsilon_permanent": "2", "buckets": str(buckets), "d": str(d)},
    )


def _reason(mechanism: Any, output: Any) -> str | None:
    """The OutputDomainError reason of `output` after a wire round trip (None: accepted)."""
    report = collector_pb2.Report()
    fill_payload(report, output)
    parsed = collector_pb2.Report.FromString(report.SerializeToString())
    try:
        mechanism.check_output(output_from_report(parsed))
    except OutputDomainError as exc:
        return str(exc.reason)
    return None


@pytest.mark.parametrize(
    ("indices", "bits", "reason"),
    [
        ((0, 2), b"\x03", None),
        ((0,), b"\x01", "WRONG_LENGTH"),
        ((0, 1, 2), b"\x01", "WRONG_LENGTH"),
        ((), b"\x00", "WRONG_LENGTH"),
        ((2, 0), b"\x00", "OUT_OF_DOMAIN"),
        ((1, 1), b"\x00", "OUT_OF_DOMAIN"),
        ((0, 5), b"\x00", "OUT_OF_DOMAIN"),
        ((0, 2**32 - 1), b"\x00", "OUT_OF_DOMAIN"),
        ((0, 2), b"", "WRONG_LENGTH"),
        ((0, 2), b"\x00\x00", "WRONG_LENGTH"),
        ((0, 2), b"\x04", "OUT_OF_DOMAIN"),
        ((0, 2), b"\x80", "OUT_OF_DOMAIN"),
    ],
)
def test_dbitflip_wire_refuses_every_off_domain_payload(
    indices: tuple[int, ...], bits: bytes, reason: str | None
) -> None:
    """d = 2 of 5 buckets: count, order, duplicates, range, byte count and padding."""
    assert _reason(_dbitflip(2), IndexBitsOutput(indices, bits)) == reason


def test_dbitflip_d_equals_buckets_accepts_only_the_full_index_set() -> None:
    """d = k = 9: only (0..8), 2 bytes, the top 7 padding bits zero."""
    mech = _dbitflip(9, buckets=9)
    full = tuple(range(9))
    assert _reason(mech, IndexBitsOutput(full, b"\xff\x01")) is None
    assert _reason(mech, IndexBitsOutput(full, b"\xff\x03")) == "OUT_OF_DOMAIN"
    assert _reason(mech, IndexBitsOutput(full, b"\xff")) == "WRONG_LENGTH"


def test_dbitflip_wrong_payload_type_is_refused() -> None:
    """A category payload for a dbitflip policy."""
    assert _reason(_dbitflip(1), CategoryOutput(0)) == "WRONG_PAYLOAD_TYPE"


def test_loloha_wire_refuses_seed_and_value_out_of_range() -> None:
    """loloha k = 5, g = 3: m = 2, seeds in [0, 27), values in [0, 3)."""
    mech: Any = create("loloha", Decimal(1), 5, {"epsilon_permanent": "2", "g": "3"})
    assert mech.seed_space == 27
    assert _reason(mech, HashedOutput(26, 2)) is None
    assert _reason(mech, HashedOutput(27, 0)) == "OUT_OF_DOMAIN"
    assert _reason(mech, HashedOutput(2**64 - 1, 0)) == "OUT_OF_DOMAIN"
    assert _reason(mech, HashedOutput(0, 3)) == "OUT_OF_DOMAIN"
    assert _reason(mech, IndexBitsOutput((0,), b"\x00")) == "WRONG_PAYLOAD_TYPE"


def _old_policy_with_equal_epsilons(deployment: Deployment) -> policy_pb2.SignedEnvelope:
    """A rappor-grr policy an old authoring signed with ε1 = ε∞ = 2 (valid then)."""
    env = deployment.add_categorical(
        "memo-equal",
        labels=[f"v{i}" for i in range(4)],
        epsilon="1",
        epsilon_cap="100",
        mechanism="rappor-grr",
        params={"epsilon_permanent": "2"},
        memo_charging=policy_pb2.MEMO_CHARGING_INSTANTANEOUS,
    )
    policy = policy_pb2.Policy.FromString(env.payload)
    policy.mechanism.epsilon = "2"
    # Signed as an old signer would (today's sign_policy refuses ε1 = ε∞).
    return sign_envelope(
        POLICY_PAYLOAD_TYPE, policy.SerializeToString(), [deployment.authority.policy_key]
    )


def test_reconcile_lists_reports_of_an_old_policy_whose_sound_charge_is_infinite(
    deployment: Deployment,
) -> None:
    """Old rappor-grr k = 4, ε1 = ε∞ = 2, charged under the retired rule.

    The policy was valid before this release (ε1 = ε∞ was allowed; the CHANGELOG
    says it is refused now). Its instantaneous step is deterministic, so its reports
    lose an unbounded amount once a value changes (docs: "ε1 = ε∞ is refused ...
    unbounded loss"). A subject with 3 reports charged 2 each (6 in the ledger):
    `sound_charges` drops the payload (the mechanism no longer builds:
    InfiniteSequenceLossError), so `undercharged` and `reconcile --policies` print
    nothing for it — the worst-charged subjects of all are the ones it misses.
    Expected: a RETIRED-RULE (or other) line naming subject=ada for policy memo-equal.
    """
    env = _old_policy_with_equal_epsilons(deployment)
    digest = hashlib.sha256(env.payload).digest()
    groups = [ChargeGroup("ada", "memo-equal", 1, digest, 0, Decimal(2), 3)]
    found = undercharged(groups, sound_charges([env.payload]))
    assert [f.subject for f in found] == ["ada"]


def test_reconcile_reads_retired_files_and_never_rewrites(
    deployment: Deployment, sqlite_url: str, tmp_path: Path, now: int
) -> None:
    """Two versions, v1 in `*.policy.retired`, reports split over both, one window.

    v1 and v2 (rappor-grr k = 64, ε1 = 0.5, ε∞ = 2, sound charge 2.192184) both
    charged the retired r* = 0.738803 by a stand-in old collector: 2 + 1 reports
    → spent 2.216409, sound 6.576552, one RETIRED-RULE line; a `retired` list and
    a README in the folder are ignored; the ledger is unchanged.
    """
    v1, v2 = (
        deployment.add_categorical(
            "memo-split",
            version=version,
            labels=[f"v{i}" for i in range(64)],
            epsilon="0.5",
            epsilon_cap="9",
            mechanism="rappor-grr",
            params={"epsilon_permanent": "2"},
            memo_charging=policy_pb2.MEMO_CHARGING_JOINT,
        )
        for version in (1, 2)
    )
    led = open_ledger(sqlite_url, shard="shard-a")
    try:
        for env, count in ((v1, 2), (v2, 1)):
            policy = deployment.verified(env)
            old: Any = ChargedUnderRetiredRule(policy)
            batch = [
                CheckedReport(
                    secrets.token_bytes(16),
                    old,
                    CategoryOutput(i),
                    hashlib.sha256(secrets.token_bytes(8)).digest(),
                    0,
                )
                for i in range(count)
            ]
            assert led.submit("ada", batch, now=now) == [ACCEPTED] * count
        window = deployment.verified(v1).window_start(now)
        before = led.spent("ada", "memo-split", window)
    finally:
        led.close()
    assert before == Decimal("2.216409")
    folder = tmp_path / "policies"
    folder.mkdir()
    write_envelope(v1, folder / "memo-split-v1.policy.retired")
    write_envelope(v2, folder / "memo-split-v2.policy")
    (folder / "retired").write_text("memo-split 1\n")
    (folder / "README.md").write_text("not a policy\n")
    result = CliRunner().invoke(
        main, ["ledger", "reconcile", "--ledger", sqlite_url, "--policies", str(folder)]
    )
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("RETIRED-RULE")]
    assert lines == [
        f"RETIRED-RULE subject=ada policy=memo-split window={window}: 3 report(s) charged "
        "2.216409 under the retired r* rule; the sound rule's figure is 6.576552 "
        "(not in the ledger: 4.360143 more)"
    ]
    led = open_ledger(sqlite_url, shard="shard-a")
    try:
        assert led.spent("ada", "memo-split", window) == before
    finally:
        led.close()
