"""`fedldp release KIND --service ADDR | --embedded` and the local commands beside them;
`release-service serve` and `sign-policy` with signed policies."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.service.server import RunningReleaseService
from fedldp.authoring import write_private_key, write_public_key
from fedldp.collector.auth import RELEASE_SERVICE_AUDIENCE, TokenAuthority

from fedldp.cli import main
from tests.aggregator.service.conftest import CATALOG, NOW, POLICY, SECRET, write_data

Make = Callable[..., RunningReleaseService]
QUERY = ["--dataset", "visits", "--purpose", "study", "--epsilon", "0.5"]


def _env(analyst: str) -> dict[str, str]:
    return {
        "FEDLDP_TOKEN": TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE).mint(
            analyst, expires_at=NOW + 3600
        )
    }


def _invoke(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, args, env=env)


def _verify(tmp_path: Path, receipt: Path, key: Ed25519PrivateKey, ledger: str) -> Any:
    pub = write_public_key(key.public_key(), tmp_path / f"{receipt.stem}.pub")
    return _invoke(
        ["verify", "release", str(receipt), "--ledger", ledger, "--trusted-key", str(pub)]
    )


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("count", []),
        ("mean", ["--column", "amount"]),
        ("histogram", ["--column", "city"]),
        ("quantile", ["--column", "amount", "--quantile", "0.5"]),
        ("choice", ["--column", "city"]),
    ],
)
def test_release_kind_with_service_asks_the_service(
    make_service: Make,
    tmp_path: Path,
    receipt_key: Ed25519PrivateKey,
    kind: str,
    extra: list[str],
) -> None:
    svc = make_service()
    receipt = tmp_path / f"{kind}.json"
    args = ["release", kind, "--service", f"127.0.0.1:{svc.port}", *QUERY, *extra]
    result = _invoke([*args, "--key", kind, "--receipt", str(receipt)], _env("alice"))
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["kind"] == kind and "receipt" not in shown
    if kind == "quantile":
        assert shown["values"][0]["rankError"]["confidence"] == "0.95"
    ok = _verify(tmp_path, receipt, receipt_key, f"sqlite:///{tmp_path / 'ledger.db'}")
    assert ok.exit_code == 0, ok.output


def test_release_with_service_refusals_are_one_line(make_service: Make) -> None:
    svc = make_service()
    args = ["release", "count", "--service", f"127.0.0.1:{svc.port}", *QUERY, "--key", "k"]
    refused = _invoke(args, _env("dave"))
    assert refused.exit_code == 1 and refused.output.startswith("Error: PERMISSION_DENIED")
    no_token = _invoke(args, {"FEDLDP_TOKEN": ""})
    assert no_token.exit_code == 1 and "FEDLDP_TOKEN" in no_token.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--service", "h:1", "--lower", "0"], "--lower is not used with --service"),
        (["--service", "h:1", "--subject", "s"], "--subject is not used with --service"),
        (["--service", "h:1", "--ledger", "sqlite:///x.db"], "--ledger is not used"),
        (["--service", "h:1", "--catalog", "{catalog}"], "--catalog is not used with --service"),
        (["--service", "h:1", "--embedded"], "exclude each other"),
        (["--service", "h:1"], "needs --dataset"),
        (["--dataset", "visits"], "--dataset needs --service"),
        (["--embedded", "--dataset", "v", "--column", "c"], "--embedded needs --catalog"),
        (["--tls-ca", "{catalog}", "--subject", "s"], "--tls-ca is not used"),
        (["--subject", "s"], "Missing option '--data'"),
        ([], "Missing option '--subject'"),
    ],
)
def test_release_mode_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)
    filled = [a.format(catalog=catalog) for a in args]
    result = _invoke(["release", "sum", "--purpose", "p", "--epsilon", "1", "--key", "k", *filled])
    assert result.exit_code == 2, result.output
    assert message in result.output


def _operator_files(tmp_path: Path) -> list[str]:
    """catalog, signed policy, policy key, ledger and receipt key, as `serve` takes them."""
    write_data(tmp_path / "visits.csv")
    (tmp_path / "catalog.toml").write_text(CATALOG)
    (tmp_path / "policy.toml").write_text(POLICY.format(eps="1"))
    policy_key, receipt_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    write_private_key(policy_key, tmp_path / "policy.key")
    write_public_key(policy_key.public_key(), tmp_path / "policy.pub")
    write_private_key(receipt_key, tmp_path / "receipts.key")
    write_public_key(receipt_key.public_key(), tmp_path / "receipts.pub")
    signed = _invoke(
        [
            "release-service",
            "sign-policy",
            str(tmp_path / "policy.toml"),
            "--key",
            str(tmp_path / "policy.key"),
            "--out",
            str(tmp_path / "policy.json"),
        ]
    )
    assert signed.exit_code == 0, signed.output
    return [
        "--catalog",
        str(tmp_path / "catalog.toml"),
        "--policy",
        str(tmp_path / "policy.json"),
        "--policy-key",
        str(tmp_path / "policy.pub"),
        "--ledger",
        f"sqlite:///{tmp_path / 'ledger.db'}",
        "--signing-key",
        str(tmp_path / "receipts.key"),
    ]


def test_embedded_mode_runs_the_service_in_process(tmp_path: Path) -> None:
    files = _operator_files(tmp_path)
    receipt = tmp_path / "mean.json"
    base = ["release", "mean", "--embedded", *files, *QUERY, "--column", "amount"]
    result = _invoke([*base, "--analyst", "alice", "--key", "m", "--receipt", str(receipt)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["values"][0]["error"]["confidence"] == "0.95"
    verify = [
        "verify",
        "release",
        str(receipt),
        "--ledger",
        f"sqlite:///{tmp_path / 'ledger.db'}",
        "--trusted-key",
        str(tmp_path / "receipts.pub"),
    ]
    assert _invoke(verify).exit_code == 0
    # the catalog's grants still apply: an analyst without one is refused
    refused = _invoke([*base, "--analyst", "mallory", "--key", "m2"])
    assert refused.exit_code == 1 and "PERMISSION_DENIED" in refused.output
    # and so do the caps (0.5 of 1 spent; 0.75 more would exceed it)
    over = [*base[:-6], *QUERY[:4], "--epsilon", "0.75", "--column", "amount"]
    capped = _invoke([*over, "--analyst", "alice", "--key", "m3"])
    assert capped.exit_code == 1 and "RESOURCE_EXHAUSTED" in capped.output


def test_serve_refuses_unsigned_tampered_or_untrusted_policies(tmp_path: Path) -> None:
    made = _operator_files(tmp_path)
    files = dict(zip(made[::2], made[1::2], strict=True))
    other = Ed25519PrivateKey.generate()
    write_public_key(other.public_key(), tmp_path / "other.pub")
    envelope = json.loads((tmp_path / "policy.json").read_bytes())
    envelope["signatures"][0]["sig"] = envelope["signatures"][0]["sig"][::-1]
    (tmp_path / "tampered.json").write_text(json.dumps(envelope))
    (tmp_path / "secret.hex").write_text(SECRET.hex())
    for policy, key, message in (
        (tmp_path / "policy.toml", files["--policy-key"], "is not signed"),
        (tmp_path / "tampered.json", files["--policy-key"], "altered after it was signed"),
        (tmp_path / "policy.json", str(tmp_path / "other.pub"), "untrusted key"),
    ):
        args = {**files, "--policy": str(policy), "--policy-key": key}
        result = _invoke(
            [
                "release-service",
                "serve",
                *[x for pair in args.items() for x in pair],
                "--token-secret-file",
                str(tmp_path / "secret.hex"),
                "--listen",
                "127.0.0.1:0",
            ]
        )
        assert result.exit_code == 1, result.output
        assert result.output.startswith("Error: release policy") and message in result.output
        assert result.output.count("\n") == 1


def test_sign_policy_refuses_a_malformed_policy_and_never_overwrites(tmp_path: Path) -> None:
    _operator_files(tmp_path)
    again = _invoke(
        [
            "release-service",
            "sign-policy",
            str(tmp_path / "policy.toml"),
            "--key",
            str(tmp_path / "policy.key"),
            "--out",
            str(tmp_path / "policy.json"),
        ]
    )
    assert again.exit_code == 1 and "never overwritten" in again.output
    (tmp_path / "bad.toml").write_text("version = -1\n")
    bad = _invoke(
        [
            "release-service",
            "sign-policy",
            str(tmp_path / "bad.toml"),
            "--key",
            str(tmp_path / "policy.key"),
            "--out",
            str(tmp_path / "bad.json"),
        ]
    )
    assert bad.exit_code == 1 and "positive integer" in bad.output
    assert not (tmp_path / "bad.json").exists()


def test_local_quantile_and_histogram_commands(tmp_path: Path) -> None:
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    data = tmp_path / "data.txt"
    data.write_text("\n".join(str(i % 10) for i in range(200)) + "\n")
    assert _invoke(["ledger", "init", "--ledger", ledger]).exit_code == 0
    cap = ["ledger", "set-cap", "s", "p", "--epsilon", "2", "--delta", "0", "--ledger", ledger]
    assert _invoke(cap).exit_code == 0
    common = ["--ledger", ledger, "--subject", "s", "--purpose", "p", "--epsilon", "0.5"]
    q = _invoke(
        [
            "release",
            "quantile",
            *common,
            "--key",
            "q",
            "--data",
            str(data),
            "--quantile",
            "0.5",
            "--lower",
            "0",
            "--upper",
            "10",
        ]
    )
    assert q.exit_code == 0, q.output
    assert json.loads(q.stdout)["kind"] == "quantile"
    h = _invoke(
        ["release", "histogram", *common, "--key", "h", "--data", str(data), "--domain", "1,2"]
    )
    assert h.exit_code == 0, h.output
    assert set(json.loads(h.stdout)["parts"]) == {"1", "2"}
    missing = _invoke(["release", "quantile", *common, "--key", "x", "--data", str(data)])
    assert missing.exit_code == 2 and "--quantile" in missing.output
