"""The release service through real gRPC (port 0) over real SQLite and PostgreSQL ledgers."""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.central.receipts import verify_release_receipt
from fedldp.aggregator.central.signing import trusted_keys
from fedldp.aggregator.service import errorbars
from fedldp.aggregator.service.catalog import RegistrationError
from fedldp.aggregator.service.policy import ledger_subject
from fedldp.aggregator.service.server import RunningReleaseService
from fedldp.collector.daemon import JsonFormatter
from fedldp.v1 import release_pb2 as pb
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest

from tests.aggregator.service.conftest import CATALOG, ROWS, Client, amount, write_data

LAPLACE = pb.NOISE_MECHANISM_LAPLACE
GAUSSIAN = pb.NOISE_MECHANISM_GAUSSIAN
SUBJECT = ledger_subject("release-service", "visits")

Make = Callable[..., RunningReleaseService]
ClientFor = Callable[[int, "str | None"], Client]


def _code(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    err: Any = info.value
    return err.code(), err.details()


def _count(client: Client, key: str, eps: str = "0.25", purpose: str = "study") -> Any:
    return client.release(
        dataset="visits",
        purpose=purpose,
        epsilon=eps,
        delta="0",
        mechanism=LAPLACE,
        idempotency_key=key,
        count=pb.CountQuery(),
    )


def _committed(svc: RunningReleaseService, purpose: str = "study") -> Decimal:
    total = Decimal(0)
    for r in svc.ledger.reservations(SUBJECT, purpose):
        if r.status == "settled" and r.epsilon_spent is not None:
            total += r.epsilon_spent
        elif r.status == "reserved":
            total += r.epsilon
    return total


# --- 1. the contract ---


def test_no_field_of_the_contract_is_a_cap() -> None:
    file = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(file)
    names = [f.name for m in file.message_type for f in m.field]
    assert "epsilon" in names  # the walk sees the fields
    assert not [n for n in names if re.search(r"cap|budget|ledger|subject", n, re.I)]


def test_a_smuggled_cap_field_is_refused_and_charges_nothing(
    make_service: Make, client_for: ClientFor
) -> None:
    svc = make_service()
    client = client_for(svc.port, "alice")
    request = pb.ReleaseRequest(
        dataset="visits",
        purpose="study",
        epsilon="0.5",
        delta="0",
        mechanism=LAPLACE,
        idempotency_key="k1",
        count=pb.CountQuery(),
    ).SerializeToString()
    # field 99, length-delimited "1000": a "cap" a newer or hostile client might send
    smuggled = request + b"\x9a\x06\x041000"  # tag (99 << 3 | 2) as a varint, len 4
    code, details = _code(lambda: client.raw(smuggled))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "fields this contract does not define" in details
    assert svc.ledger.reservations(SUBJECT) == []
    assert svc.ledger.central_cap(SUBJECT, "study") == (Decimal("1"), Decimal("0.00001"))
    # the same request without the extra field is served
    assert client.raw(request)


def test_garbage_bytes_are_invalid_argument(make_service: Make, client_for: ClientFor) -> None:
    svc = make_service()
    code, _ = _code(lambda: client_for(svc.port, "alice").raw(b"\xff\xff\xff"))
    assert code is grpc.StatusCode.INVALID_ARGUMENT


# --- 2. authentication, rights, health ---


def test_unauthenticated_and_unauthorized_analysts_are_refused(
    make_service: Make, client_for: ClientFor
) -> None:
    svc = make_service()
    code, _ = _code(lambda: _count(client_for(svc.port, None), "a"))
    assert code is grpc.StatusCode.UNAUTHENTICATED
    # carol may query "audit" only; dave nothing; an unknown dataset reads the same
    code, details = _code(lambda: _count(client_for(svc.port, "carol"), "b"))
    assert code is grpc.StatusCode.PERMISSION_DENIED
    code2, _ = _code(lambda: _count(client_for(svc.port, "dave"), "c"))
    assert code2 is grpc.StatusCode.PERMISSION_DENIED
    unknown = client_for(svc.port, "alice")
    code3, details3 = _code(
        lambda: unknown.release(
            dataset="nope",
            purpose="study",
            epsilon="0.1",
            delta="0",
            mechanism=LAPLACE,
            idempotency_key="d",
            count=pb.CountQuery(),
        )
    )
    assert code3 is grpc.StatusCode.PERMISSION_DENIED
    assert "is open to you" in details and "is open to you" in details3
    assert svc.ledger.reservations(SUBJECT) == []
    assert _count(client_for(svc.port, "carol"), "e", eps="0.5", purpose="audit").values


def test_list_datasets_shows_only_granted_ones(make_service: Make, client_for: ClientFor) -> None:
    svc = make_service()
    alice = client_for(svc.port, "alice")
    listed = alice.stub.ListDatasets(pb.ListDatasetsRequest(), metadata=alice.metadata)
    assert [(d.dataset, list(d.purposes)) for d in listed.datasets] == [("visits", ["study"])]
    dave = client_for(svc.port, "dave")
    assert not dave.stub.ListDatasets(pb.ListDatasetsRequest(), metadata=dave.metadata).datasets


def test_health_is_serving(make_service: Make) -> None:
    svc = make_service()
    with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service="fedldp.v1.ReleaseService"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


# --- 3. registration ---


def test_registration_refuses_data_beyond_the_declaration(make_service: Make) -> None:
    """A dataset that fails registration stops the service from starting (no analyst can
    observe the outcome, a function of the rows, as a dataset that vanished)."""
    bad_bound = CATALOG.replace("contribution_bound = 2", "contribution_bound = 1")
    with pytest.raises(RegistrationError, match="dataset visits: a unit has more than 1 records"):
        make_service(catalog=bad_bound)


def test_registration_names_column_never_value(make_service: Make) -> None:
    with pytest.raises(RegistrationError) as info:
        make_service(catalog=CATALOG.replace('upper = "100"', 'upper = "50"'))
    message = str(info.value)
    assert "dataset visits: row" in message and "\n" not in message
    assert "column amount: value outside the declared bounds" in message
    assert not re.search(r"\d+\.\d{3,}", message)  # no data value in it


# --- 5. queries, error bars, receipts ---


def _write(tmp_path: Path, response: Any, name: str) -> Path:
    path = tmp_path / name
    path.write_bytes(response.receipt)
    return path


@pytest.mark.parametrize(
    ("query", "mechanism", "delta"),
    [
        ({"count": pb.CountQuery()}, LAPLACE, "0"),
        ({"sum": pb.SumQuery(column="amount")}, GAUSSIAN, "0.000001"),
        ({"mean": pb.MeanQuery(column="amount")}, LAPLACE, "0"),
        ({"histogram": pb.HistogramQuery(column="city")}, LAPLACE, "0"),
        ({"choice": pb.ChoiceQuery(column="city")}, pb.NOISE_MECHANISM_UNSPECIFIED, "0"),
        (
            {"quantile": pb.QuantileQuery(column="amount", quantile="0.5")},
            pb.NOISE_MECHANISM_UNSPECIFIED,
            "0",
        ),
    ],
)
def test_each_query_returns_error_bars_and_a_receipt_that_verifies(
    make_service: Make,
    client_for: ClientFor,
    tmp_path: Path,
    receipt_key: Ed25519PrivateKey,
    query: dict[str, Any],
    mechanism: int,
    delta: str,
) -> None:
    svc = make_service()
    resp = client_for(svc.port, "alice").release(
        dataset="visits",
        purpose="study",
        epsilon="0.5",
        delta=delta,
        mechanism=mechanism,
        idempotency_key="q",
        **query,
    )
    if "choice" in query:
        assert resp.chosen in ("paris", "lyon", "nice") and not resp.values
    elif "quantile" in query:
        (v,) = resp.values
        assert Decimal(0) <= Decimal(v.value) <= Decimal(100) and not v.HasField("error")
        assert v.rank_error.confidence == "0.95" and Decimal(v.rank_error.records) > 0
        assert v.rank_error.grid_step == "0.1"
    else:
        for v in resp.values:
            value = Decimal(v.value)
            assert Decimal(v.error.lower) <= value <= Decimal(v.error.upper)
            assert v.error.noise_stddev > 0 and v.error.confidence == "0.95"
    if "histogram" in query:
        assert [v.label for v in resp.values] == sorted(["paris", "lyon", "nice"])
    path = _write(tmp_path, resp, "r.json")
    trusted = trusted_keys([receipt_key.public_key()])
    result = verify_release_receipt(
        path, trusted=trusted, ledger=svc.ledger, data_path=tmp_path / "visits.csv"
    )
    assert result.ok, result.failures()
    # tampered: the released value changed inside the signed payload
    envelope = json.loads(resp.receipt)
    payload = json.loads(base64.b64decode(envelope["payload"]))
    # the service draws every noise from the OS CSPRNG: for release
    assert payload["randomness"] == {"source": "os-csprng"} and payload["for_release"] is True
    payload["ledger"]["epsilon_spent"] = "0.1"
    envelope["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(envelope))
    failed = verify_release_receipt(bad, trusted=trusted, ledger=svc.ledger)
    assert "signature" in failed.failures() and "reservation" in failed.failures()


def test_contribution_bound_scales_the_noise(make_service: Make, client_for: ClientFor) -> None:
    svc = make_service()
    resp = _count(client_for(svc.port, "alice"), "k", eps="0.5")
    event = json.loads(base64.b64decode(json.loads(resp.receipt)["payload"]))["events"][0]
    assert event["lattice_sensitivity"] == 2 and event["scale"] == "4"  # k/ε = 2/0.5


def test_retry_returns_the_same_release_charged_once_and_keys_are_per_analyst(
    make_service: Make, client_for: ClientFor
) -> None:
    svc = make_service()
    alice, bob = client_for(svc.port, "alice"), client_for(svc.port, "bob")
    first, again = _count(alice, "same"), _count(alice, "same")
    assert first.values[0].value == again.values[0].value
    assert first.reservation_id == again.reservation_id
    other = _count(bob, "same")
    assert other.reservation_id != first.reservation_id
    assert _committed(svc) == Decimal("0.5")


def test_a_data_error_after_reading_is_charged_with_a_fixed_message(
    make_service: Make, client_for: ClientFor, tmp_path: Path
) -> None:
    svc = make_service()
    data = tmp_path / "visits.csv"
    data.write_text(data.read_text() + "u9999,not-a-number,paris\n")  # after registration
    code, details = _code(
        lambda: client_for(svc.port, "alice").release(
            dataset="visits",
            purpose="study",
            epsilon="0.25",
            delta="0",
            mechanism=LAPLACE,
            idempotency_key="x",
            sum=pb.SumQuery(column="amount"),
        )
    )
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert details == (
        "the release failed after the data was opened; its budget is spent and nothing was released"
    )
    (res,) = svc.ledger.reservations(SUBJECT)
    assert res.status == "settled" and res.epsilon_spent == Decimal("0.25")


def test_bad_parameters_change_nothing(make_service: Make, client_for: ClientFor) -> None:
    svc = make_service()
    alice = client_for(svc.port, "alice")
    for kwargs in (
        {"epsilon": "1e-1", "count": pb.CountQuery()},
        {"epsilon": "-1", "count": pb.CountQuery()},
        {"epsilon": "0.1", "sum": pb.SumQuery(column="city")},
        {"epsilon": "0.1", "histogram": pb.HistogramQuery(column="amount")},
        {"epsilon": "0.1"},
    ):
        code, _ = _code(
            lambda kw=kwargs: alice.release(  # type: ignore[misc]
                dataset="visits",
                purpose="study",
                delta="0",
                mechanism=LAPLACE,
                idempotency_key="p",
                **kw,
            )
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert svc.ledger.reservations(SUBJECT) == []


# --- 4. caps: shared by purpose, never exceeded under concurrency ---


def test_two_analysts_sharing_a_purpose_share_its_cap(
    make_service: Make, client_for: ClientFor
) -> None:
    svc = make_service(eps_cap="1")
    alice, bob = client_for(svc.port, "alice"), client_for(svc.port, "bob")
    _count(alice, "a1", eps="0.5")
    _count(bob, "b1", eps="0.5")
    code, details = _code(lambda: _count(bob, "b2", eps="0.5"))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "exceed the cap" in details
    code, _ = _code(lambda: _count(alice, "a2", eps="0.01"))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED


def _race(svc: RunningReleaseService, client_for: ClientFor) -> None:
    clients = [client_for(svc.port, name) for name in ("alice", "bob") * 5]
    codes: list[grpc.StatusCode] = []
    barrier = threading.Barrier(len(clients))

    def go(i: int, client: Client) -> None:
        barrier.wait()
        try:
            _count(client, f"race-{i}", eps="0.25")
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())

    threads = [threading.Thread(target=go, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes.count(grpc.StatusCode.OK) == 4
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == len(clients) - 4
    assert _committed(svc) == Decimal("1")


def test_concurrent_requests_never_exceed_the_cap_sqlite(
    make_service: Make, client_for: ClientFor
) -> None:
    _race(make_service(eps_cap="1"), client_for)


def test_concurrent_requests_never_exceed_the_cap_postgresql(
    make_service: Make, client_for: ClientFor, postgresql_url: str
) -> None:
    _race(make_service(ledger_url=postgresql_url, eps_cap="1"), client_for)


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_release_costs_the_same_ledger_transactions_whatever_came_before(
    make_service: Make, client_for: ClientFor, request: pytest.FixtureRequest, store: str
) -> None:
    """A count costs two writes (claim with its data-opened mark, settle) and one read
    (the receipt's own reservation row), the 2nd release as the 12th: the receipt does
    not read every event of the subject."""
    url = None if store == "sqlite" else str(request.getfixturevalue("postgresql_url"))
    svc = make_service(ledger_url=url, eps_cap="10")
    alice = client_for(svc.port, "alice")
    real = svc.ledger.transaction
    seen: list[bool] = []

    def counting(fn: Any, *, write: bool = True) -> Any:
        seen.append(write)
        return real(fn, write=write)

    svc.ledger.transaction = counting  # type: ignore[method-assign]
    costs = []
    for i in range(12):
        seen.clear()
        resp = _count(alice, f"tx-{i}", eps="0.1")
        assert json.loads(resp.receipt)["payload"]
        costs.append((seen.count(True), seen.count(False)))
    # the first release also reads the ledger's id, once per open ledger
    assert costs[0] == (2, 2) and costs[1:] == [(2, 1)] * 11, costs
    svc.ledger.transaction = real  # type: ignore[method-assign]


# --- 7. the true aggregate leaves through no channel ---


def _leaks(text: str, secrets: list[str]) -> list[str]:
    """The secrets that appear in `text` as a number of their own: not inside a longer
    number, and not inside a hex or base-32 id (a random id holds any run of digits)."""
    return [
        s for s in secrets if re.search(rf"(?<![0-9A-Za-z.]){re.escape(s)}(?![0-9A-Za-z])", text)
    ]


def test_leak_scan_positive_control() -> None:
    """The scanner finds a secret when it is there (else the real scan proves nothing)."""
    assert _leaks('{"msg": "sum 123.456001"}', ["123.456001"]) == ["123.456001"]
    assert _leaks("0.5123.4560019", ["123.456001"]) == []
    assert _leaks('{"request_id": "3fa200be"}', ["200"]) == []
    assert _leaks('{"n": 200}', ["200"]) == ["200"]


def test_the_true_aggregate_is_in_no_log_metric_error_or_response(
    make_service: Make,
    client_for: ClientFor,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    true_sum, n = write_data(tmp_path / "visits.csv")
    true_mean = true_sum / n
    secrets = [str(true_sum), f"{true_mean:.6f}", str(n), *(str(amount(i)) for i in (0, 7, 99))]
    caplog.set_level(logging.DEBUG)
    svc = make_service(eps_cap="10")
    alice = client_for(svc.port, "alice")
    seen: list[str] = []
    for key, query in (
        ("s", {"sum": pb.SumQuery(column="amount")}),
        ("m", {"mean": pb.MeanQuery(column="amount")}),
    ):
        resp = alice.release(
            dataset="visits",
            purpose="study",
            epsilon="0.1",
            delta="0",
            mechanism=LAPLACE,
            idempotency_key=key,
            **query,
        )
        seen.append(str(resp) + resp.receipt.decode())
        assert base64.b64decode(json.loads(resp.receipt)["payload"])
        seen.append(base64.b64decode(json.loads(resp.receipt)["payload"]).decode())
    # refusals: exhausted and failed-after-read
    seen.append(_code(lambda: _count(alice, "big", eps="100"))[1])
    formatter = JsonFormatter()
    logs = "\n".join(formatter.format(r) for r in caplog.records)
    metrics = generate_latest(svc.metrics.registry).decode()
    assert "fedldp_release_service_releases_total" in metrics
    assert "alice" not in metrics and "alice" not in logs
    for channel, text in (("logs", logs), ("metrics", metrics), ("responses", "\n".join(seen))):
        secrets_here = secrets if channel != "responses" else secrets[:2] + secrets[3:]
        assert _leaks(text, secrets_here) == [], channel
    assert n == ROWS


# --- error bars: the interval's coverage, exactly ---


@pytest.mark.parametrize("scale", ["1", "4", "7/3", "250"])
def test_laplace_halfwidth_is_the_smallest_with_coverage(scale: str) -> None:
    from fractions import Fraction
    from math import exp

    t = Fraction(scale)
    alpha = 0.05
    _sd, m = errorbars._laplace_halfwidth(t, alpha)
    q = exp(-1 / float(t))

    def outside(k: int) -> float:  # P[|X| > k] for the two-sided geometric law
        return 2 * q ** (k + 1) / (1 + q)

    assert outside(m) <= alpha
    assert m == 0 or outside(m - 1) > alpha


def test_broken_halfwidth_one_too_small_fails_coverage() -> None:
    """Broken variant kept as a test: m - 1 does not reach the confidence."""
    from fractions import Fraction
    from math import exp

    _sd, m = errorbars._laplace_halfwidth(Fraction(4), 0.05)
    q = exp(-1 / 4)
    assert 2 * q**m / (1 + q) > 0.05


def test_ledger_keys_of_different_analysts_never_collide() -> None:
    from fedldp.aggregator.service.engine import ledger_key

    assert ledger_key("a:b", "c") != ledger_key("a", "b:c")
    # the broken variant (plain concatenation) collides
    assert f"{'a:b'}:{'c'}" == f"{'a'}:{'b:c'}"
