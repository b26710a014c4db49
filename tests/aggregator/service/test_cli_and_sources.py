"""The analyst's CLI against a real service, `fedldp verify release` on its receipts,
the operator's `serve` command as a process, and SQL-table datasets."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
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
from tests.aggregator.service.conftest import CATALOG, NOW, SECRET, signed_policy, write_data

Make = Callable[..., RunningReleaseService]


def _env(analyst: str, expires: int = NOW + 3600) -> dict[str, str]:
    return {
        "FEDLDP_TOKEN": TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE).mint(
            analyst, expires_at=expires
        )
    }


def _query(port: int, env: dict[str, str], *args: str) -> Any:
    return CliRunner().invoke(
        main,
        ["release-service", "query", *args, "--service", f"127.0.0.1:{port}"],
        env=env,
    )


def test_cli_query_writes_a_receipt_that_fedldp_verify_release_accepts(
    make_service: Make, tmp_path: Path, receipt_key: Ed25519PrivateKey
) -> None:
    svc = make_service()
    pub = write_public_key(receipt_key.public_key(), tmp_path / "receipts.pub")
    receipt = tmp_path / "mean.json"
    result = _query(
        svc.port,
        _env("alice"),
        "mean",
        "--dataset=visits",
        "--purpose=study",
        "--epsilon=0.5",
        "--column=amount",
        "--key=m1",
        f"--receipt={receipt}",
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["kind"] == "mean" and shown["values"][0]["error"]["confidence"] == "0.95"
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    verify = ["verify", "release", str(receipt), "--ledger", ledger_url, "--trusted-key", str(pub)]
    ok = CliRunner().invoke(main, verify)
    assert ok.exit_code == 0, ok.output
    envelope = json.loads(receipt.read_bytes())
    envelope["payload"] = envelope["payload"][:-8] + "AAAAAAA="
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(envelope))
    bad = CliRunner().invoke(main, [*verify[:2], str(tampered), *verify[3:]])
    assert bad.exit_code != 0


def test_cli_refusals_are_one_line_errors(make_service: Make) -> None:
    svc = make_service()
    result = _query(
        svc.port,
        _env("dave"),
        "count",
        "--dataset=visits",
        "--purpose=study",
        "--epsilon=0.5",
        "--key=x",
    )
    assert result.exit_code == 1
    assert "PERMISSION_DENIED" in result.output and "Traceback" not in result.output
    listed = CliRunner().invoke(
        main,
        ["release-service", "datasets", "--service", f"127.0.0.1:{svc.port}"],
        env=_env("alice"),
    )
    assert json.loads(listed.stdout)["datasets"][0]["dataset"] == "visits"


def test_sql_table_dataset_is_registered_and_queried(make_service: Make, tmp_path: Path) -> None:
    db = tmp_path / "consolidated.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE visits (user_id TEXT, amount REAL, city TEXT)")
        conn.executemany(
            "INSERT INTO visits VALUES (?, ?, ?)",
            [(f"u{i // 2}", float(i % 90), "paris") for i in range(300)],
        )
    catalog = CATALOG.replace(
        'csv = "visits.csv"', f'sql_url = "sqlite:///{db}"\nsql_table = "visits"'
    )
    svc = make_service(catalog=catalog)  # it registers, or the service would not start
    result = _query(
        svc.port,
        _env("alice"),
        "sum",
        "--dataset=visits",
        "--purpose=study",
        "--epsilon=0.5",
        "--column=amount",
        "--key=s",
    )
    assert result.exit_code == 0, result.output


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_serve_command_runs_registers_and_stops_on_sigterm(tmp_path: Path) -> None:
    write_data(tmp_path / "visits.csv")
    (tmp_path / "catalog.toml").write_text(CATALOG)
    policy_key = Ed25519PrivateKey.generate()
    signed_policy(
        tmp_path,
        'version = 1\n[[cap]]\ndataset = "visits"\npurpose = "study"\nepsilon = "1"\ndelta = "0"\n',
        policy_key,
    )
    write_public_key(policy_key.public_key(), tmp_path / "policy.pub")
    write_private_key(Ed25519PrivateKey.generate(), tmp_path / "receipts.key")
    (tmp_path / "secret.hex").write_text(SECRET.hex())
    fedldp = Path(sys.executable).parent / "fedldp"
    proc = subprocess.Popen(
        [
            str(fedldp),
            "release-service",
            "serve",
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
            "--token-secret-file",
            str(tmp_path / "secret.hex"),
            "--listen",
            "127.0.0.1:0",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert proc.stderr is not None
        port = None
        for line in proc.stderr:
            if line.startswith("release service on port "):
                port = int(line.rsplit(" ", 1)[1])
                break
        assert port is not None
        import time

        env = {
            "FEDLDP_TOKEN": TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE).mint(
                "bob", expires_at=int(time.time()) + 600
            )
        }
        result = _query(
            port,
            env,
            "count",
            "--dataset=visits",
            "--purpose=study",
            "--epsilon=0.5",
            "--key=c",
        )
        assert result.exit_code == 0, result.output
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
