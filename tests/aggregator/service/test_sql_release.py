"""`release sql` end to end over real gRPC: a Parquet dataset in DuckDB, grouped
queries with a public domain and with DP partition selection, refusals before
any reservation, and receipts that verify (budget split, threshold event)."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.central.receipts import verify_release_receipt
from fedldp.aggregator.central.signing import trusted_keys
from fedldp.aggregator.service.policy import ledger_subject
from fedldp.aggregator.service.server import RunningReleaseService
from fedldp.v1 import release_pb2 as pb

from tests.aggregator.service.conftest import Client

CATALOG = """
[datasets.visits]
parquet = "sessions.parquet"
unit = "user_id"
contribution_bound = 6
max_groups_per_unit = 2
max_rows_per_group = 2
[datasets.visits.columns.amount]
type = "numeric"
lower = "0"
upper = "100"
scale = 2
[datasets.visits.columns.city]
type = "categorical"
domain = ["paris", "lyon", "nice"]
[datasets.visits.columns.region]
type = "categorical"
[datasets.visits.columns.day]
type = "categorical"
[[datasets.visits.grants]]
analysts = ["alice"]
purposes = ["study"]
"""


def _parquet(path: Path) -> None:
    users, amounts, cities, regions, days = [], [], [], [], []
    for i in range(3000):
        users.append(f"u{i // 6}")
        amounts.append(Decimal(i % 97) + Decimal("0.25"))
        cities.append(["paris", "lyon", "nice"][i % 3])
        regions.append("eu" if i % 5 else "rare-region-" + str(i))  # one unit each: never out
        days.append(f"2026-11-{1 + i % 28:02d}")
    table = pa.table(
        {
            "user_id": users,
            "amount": pa.array(amounts, pa.decimal128(9, 2)),
            "city": cities,
            "region": regions,
            "day": days,
        }
    )
    pq.write_table(table, path)


@pytest.fixture
def svc(
    make_service: Callable[..., RunningReleaseService], tmp_path: Path
) -> RunningReleaseService:
    _parquet(tmp_path / "sessions.parquet")
    return make_service(catalog=CATALOG, eps_cap="10")


def _sql(client: Client, sql: str, key: str, eps: str = "1", delta: str = "0") -> Any:
    return client.release(
        dataset="visits",
        purpose="study",
        epsilon=eps,
        delta=delta,
        idempotency_key=key,
        sql=pb.SqlQuery(sql=sql),
    )


def test_grouped_sql_with_a_public_domain_releases_every_group(
    svc: RunningReleaseService,
    client_for: Callable[[int, str | None], Client],
    tmp_path: Path,
    receipt_key: Ed25519PrivateKey,
) -> None:
    alice = client_for(svc.port, "alice")
    reply = _sql(
        alice,
        "SELECT city, COUNT(*) AS n, AVG(amount), MEDIAN(amount) FROM visits "
        "WHERE day >= '2026-11-15' GROUP BY city",
        "g1",
    )
    groups = {v.group for v in reply.values}
    assert groups == {'["paris"]', '["lyon"]', '["nice"]'}
    assert {v.label for v in reply.values} == {"n", "avg(amount)", "median(amount)"}
    assert json.loads(reply.epsilon_split) == {
        "n": "0.333333333333333333333333333",
        "avg(amount)": "0.333333333333333333333333333",
        "median(amount)": "0.333333333333333333333333334",
    }
    (tmp_path / "r.json").write_bytes(reply.receipt)
    trusted = trusted_keys([receipt_key.public_key()])
    result = verify_release_receipt(tmp_path / "r.json", trusted=trusted, ledger=svc.ledger)
    assert result.ok, result.failures()


def test_partition_selection_drops_rare_groups_and_charges_delta(
    svc: RunningReleaseService,
    client_for: Callable[[int, str | None], Client],
    tmp_path: Path,
    receipt_key: Ed25519PrivateKey,
) -> None:
    alice = client_for(svc.port, "alice")
    reply = _sql(
        alice, "SELECT region, COUNT(*) FROM visits GROUP BY region", "p1", "1", "0.000001"
    )
    assert {v.group for v in reply.values} == {'["eu"]'}  # 600 one-unit groups are not released
    assert set(json.loads(reply.epsilon_split)) == {"count(*)", "partition_selection"}
    (res,) = svc.ledger.reservations(ledger_subject("release-service", "visits"))
    assert res.delta_spent == Decimal("0.000001")
    (tmp_path / "r.json").write_bytes(reply.receipt)
    trusted = trusted_keys([receipt_key.public_key()])
    result = verify_release_receipt(tmp_path / "r.json", trusted=trusted, ledger=svc.ledger)
    assert result.ok, result.failures()


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT COUNT(*) FROM visits v JOIN visits w ON v.city = w.city", "JOIN is not supported"),
        ("SELECT user_id, COUNT(*) FROM visits GROUP BY user_id", "not declared"),
        ("SELECT region, COUNT(*) FROM visits GROUP BY region", "needs a delta"),
        ("SELECT SUM(amount * 2) FROM visits", "plain declared column"),
        ("SELECT COUNT(*) FROM secret_table", "no dataset 'secret_table' is open to you"),
    ],
)
def test_unsupported_sql_is_refused_before_any_reservation(
    svc: RunningReleaseService,
    client_for: Callable[[int, str | None], Client],
    sql: str,
    reason: str,
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _sql(client_for(svc.port, "alice"), sql, "r")
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert reason in str(err.value.details())
    assert svc.ledger.reservations(ledger_subject("release-service", "visits")) == []


def test_ungrouped_count_over_parquet_uses_the_engine(
    svc: RunningReleaseService, client_for: Callable[[int, str | None], Client]
) -> None:
    reply = client_for(svc.port, "alice").release(
        dataset="visits",
        purpose="study",
        epsilon="1",
        delta="0",
        idempotency_key="c",
        mechanism=pb.NOISE_MECHANISM_LAPLACE,
        count=pb.CountQuery(),
    )
    assert abs(Decimal(reply.values[0].value) - 3000) < 100


def test_release_sql_command_embedded_then_verify(tmp_path: Path) -> None:
    """`fedldp release sql "..." --epsilon 1 --delta 1e-6 --embedded`, then `verify release`."""
    from tests.aggregator.service.test_release_client import _invoke, _operator_files

    files = _operator_files(tmp_path)
    receipt = tmp_path / "sql.json"
    sql = "SELECT city, COUNT(*), AVG(amount) FROM visits WHERE amount >= 20 GROUP BY city"
    args = ["release", "sql", sql, "--purpose", "study", "--epsilon", "0.5", "--delta", "0"]
    result = _invoke([*args, "--embedded", *files, "--analyst", "alice", "--receipt", str(receipt)])
    assert result.exit_code == 0, result.output
    reply = json.loads(result.stdout)
    assert reply["kind"] == "grouped" and len(reply["values"]) == 6
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    pub = str(tmp_path / "receipts.pub")
    verified = _invoke(
        ["verify", "release", str(receipt), "--ledger", ledger, "--trusted-key", pub]
    )
    assert verified.exit_code == 0, verified.output
    again = _invoke([*args, "--embedded", *files, "--analyst", "alice"])  # same derived key
    assert json.loads(again.stdout)["reservationId"] == reply["reservationId"]
    refused = _invoke([*args[:2], "SELECT * FROM visits", *args[3:], "--embedded", *files])
    assert refused.exit_code != 0 and "SQL refused" in refused.output
