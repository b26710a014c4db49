"""`fedldp report` on a policy of the retired laplace mechanism: a one-line error that
names the replacement (its stored rows, with unbounded float outputs, are not reported)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from fedldp.authoring import Authority, sign_envelope, write_envelope, write_public_key
from fedldp.client.policy.envelope import POLICY_PAYLOAD_TYPE
from fedldp.collector.ledger import open_ledger

from fedldp.cli_report import report as report_cmd


def test_report_on_a_laplace_policy_names_the_replacement(
    authority: Authority, now: int, tmp_path: Path
) -> None:
    policy = authority.numeric_policy(
        policy_id="old-latency",
        metric="net.latency_ms",
        lo="0",
        hi="100",
        mechanism="duchi",
        epsilon="1",
        epsilon_cap="4",
        window_seconds=86400,
        now=now - 60,
    )
    policy.mechanism.id = "laplace"  # as signed before laplace was retired
    envelope = sign_envelope(
        POLICY_PAYLOAD_TYPE, policy.SerializeToString(), [authority.policy_key]
    )
    trust, policies = tmp_path / "trust", tmp_path / "policies"
    (trust / "pinned").mkdir(parents=True)
    policies.mkdir()
    for i, key in enumerate(authority.root_public_keys):
        write_public_key(key, trust / "pinned" / f"root{i}.pem")
    write_envelope(authority.root_envelope, trust / "1.root")
    write_envelope(envelope, policies / "old.policy")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    open_ledger(url, shard="a").close()
    args = ["--policy", "old-latency", "--ledger", url, "--policies", str(policies)]
    result = CliRunner().invoke(report_cmd, [*args, "--trust", str(trust), "--at", str(now)])
    assert result.exit_code != 0
    assert "mechanism 'laplace' is retired" in result.output
    assert "hybrid" in result.output
    assert "Traceback" not in result.output
