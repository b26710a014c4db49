"""Open-domain strings end to end: `record("browser.new_word", "somestring")` on a device,
a CMS/HCMS report through the real collector (gRPC, SQLite ledger), and the analyst's
estimate of candidate strings, through the library and `fedldp report --candidates`.

The devices randomize with the OS CSPRNG (what ships); the one statistical check,
|f̂ - f| <= z σ at z for a two-sided 1e-6 level per candidate with Bonferroni over
the candidates, has a false-failure rate below 1e-6.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from statistics import NormalDist

import pytest
from click.testing import CliRunner
from fedldp.aggregator.estimation import FrequencyReport
from fedldp.aggregator.reports import CandidatesRequiredError, report_from_ledgers
from fedldp.client.outbox import Outbox
from fedldp.client.policy import VerifiedPolicy, verify_policy
from fedldp.client.sdk import BadValueError
from fedldp.v1 import collector_pb2, policy_pb2
from sdk_testkit import AUDIENCE, Deployment, ledger_rows, running_deployment

from fedldp.cli import main

#: What the device records: 300 x "somestring", 150 x "other", 150 distinct words.
WORDS = ["somestring"] * 300 + ["other"] * 150 + [f"tail-{i}" for i in range(150)]
CANDIDATES = ["somestring", "other", "never-recorded"]
TRUTH = [300 / 600, 150 / 600, 0.0]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def sign_open_policy(deployment: Deployment, mechanism: str) -> policy_pb2.SignedEnvelope:
    policy = deployment.authority.open_policy(
        policy_id=f"new-words-{mechanism}",
        metric="browser.new_word",
        max_bytes=32,
        mechanism=mechanism,
        params={"rows": "16", "columns": "256"},
        epsilon="4",
        epsilon_cap="100000",
        window_seconds=86400,
        now=deployment.now - 60,
        min_reports=100,
        audience=(AUDIENCE,),
    )
    assert dict(policy.mechanism.params) == {"rows": "16", "columns": "256"}
    envelope = deployment.authority.sign(policy)
    deployment.envelopes.append(envelope)
    return envelope


@pytest.mark.parametrize("mechanism", ["cms", "hcms"])
def test_record_strings_collect_and_estimate_candidates(
    deployment: Deployment, tmp_path: Path, mechanism: str
) -> None:
    envelope = sign_open_policy(deployment, mechanism)
    collector = deployment.start()
    payload = "sketch_row" if mechanism == "cms" else "sketch_bit"
    with deployment.client(collector.address, tmp_path / "dev") as c:
        for bad in ("", "x" * 33, "nul\x00", 7):
            with pytest.raises(BadValueError) as info:
                c.record("browser.new_word", bad)
            assert "nul" not in str(info.value) and "xxx" not in str(info.value)
        for word in WORDS:
            c.record("browser.new_word", word)
        kinds = {
            collector_pb2.Report.FromString(e.report).WhichOneof("payload")
            for e in Outbox(c._store).entries()
        }
        assert kinds == {payload}
        assert c.flush(timeout=60).acknowledged == len(WORDS)
    rows = ledger_rows(collector)
    assert len(rows) == len(WORDS)
    assert all("somestring" not in p and "tail-" not in p for _, _, p in rows)

    verified = _verified(deployment, envelope)
    with pytest.raises(CandidatesRequiredError, match="--candidates"):
        report_from_ledgers([("ledger", collector.ledger)], verified)
    report = report_from_ledgers([("ledger", collector.ledger)], verified, candidates=CANDIDATES)
    assert isinstance(report, FrequencyReport)
    assert report.labels == CANDIDATES and report.n == len(WORDS)
    z = NormalDist().inv_cdf(1 - 1e-6 / (2 * len(CANDIDATES)))
    for estimate, truth in zip(report.estimates, TRUTH, strict=True):
        assert abs(estimate.raw_estimate - truth) <= z * estimate.std_error, estimate
    assert report.by_label("somestring").z_score > z  # found, far above the noise

    _check_cli(deployment, collector.ledger.url, envelope, tmp_path, report.to_dict())


def _verified(deployment: Deployment, envelope: policy_pb2.SignedEnvelope) -> VerifiedPolicy:
    return verify_policy(
        envelope,
        deployment.authority.trust_store(now=deployment.now),
        now=deployment.now,
        audience=AUDIENCE,
    )


def _check_cli(
    deployment: Deployment,
    ledger_url: str,
    envelope: policy_pb2.SignedEnvelope,
    tmp_path: Path,
    expected: dict[str, object],
) -> None:
    """`fedldp report --candidates` prints the same report; without it, a usage error."""
    from fedldp.authoring import write_envelope

    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    policy = policy_pb2.Policy.FromString(envelope.payload)
    write_envelope(envelope, policies / f"{policy.policy_id}.policy")
    candidates = tmp_path / "candidates.txt"
    candidates.write_bytes("\n".join(CANDIDATES).encode() + b"\r\n\n")
    base = [
        "report",
        "--policy",
        policy.policy_id,
        "--ledger",
        ledger_url,
        "--policies",
        str(policies),
        "--trust",
        str(deployment.trust_dir()),
    ]
    runner = CliRunner()
    result = runner.invoke(main, [*base, "--candidates", str(candidates), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [e["label"] for e in data["estimates"]] == CANDIDATES
    assert data["estimates"] == expected["estimates"]
    table = runner.invoke(main, [*base, "--candidates", str(candidates)])
    assert table.exit_code == 0 and "somestring" in table.output
    missing = runner.invoke(main, base)
    assert missing.exit_code == 2 and "--candidates" in missing.output
