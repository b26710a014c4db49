"""Signed, versioned release policies and per-analyst caps, through real gRPC.

Broken variants kept as tests: a policy whose payload was edited after signing,
one signed by an unknown key, and an unsigned TOML are all refused; a policy
that raises a recorded cap is refused with nothing written.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.central.receipts import verify_release_receipt
from fedldp.aggregator.central.signing import canonical_json, trusted_keys
from fedldp.aggregator.service.policy import (
    ReleasePolicyError,
    analyst_subject,
    ledger_subject,
    load_release_policy,
)
from fedldp.aggregator.service.server import RunningReleaseService
from fedldp.authoring import write_private_key, write_public_key
from fedldp.collector.ledger import open_ledger
from fedldp.v1 import release_pb2 as pb

from tests.aggregator.service.conftest import (
    CATALOG,
    POLICY,
    SECRET,
    Client,
    signed_policy,
    write_data,
)

Make = Callable[..., RunningReleaseService]
ClientFor = Callable[[int, "str | None"], Client]
SERVICE = "release-service"
PURPOSE_SUBJECT = ledger_subject(SERVICE, "visits")
ALICE_SUBJECT = analyst_subject(SERVICE, "visits", "alice")

CAPPED = """
version = 2
[[cap]]
dataset = "visits"
purpose = "study"
epsilon = "{purpose}"
delta = "0"
[[analyst_cap]]
dataset = "visits"
purpose = "study"
analyst = "alice"
epsilon = "{alice}"
delta = "0"
"""


def _count(client: Client, key: str, eps: str) -> Any:
    return client.release(
        dataset="visits",
        purpose="study",
        epsilon=eps,
        delta="0",
        mechanism=pb.NOISE_MECHANISM_LAPLACE,
        idempotency_key=key,
        count=pb.CountQuery(),
    )


def _committed(svc: RunningReleaseService, subject: str) -> Decimal:
    total = Decimal(0)
    for r in svc.ledger.reservations(subject, "study"):
        assert r.status != "reserved", "a reservation was left open"
        if r.status == "settled":
            assert r.epsilon_spent is not None
            total += r.epsilon_spent
    return total


# --- signed policies ---


def _trusted(key: Ed25519PrivateKey) -> Any:
    return trusted_keys([key.public_key()])


def test_a_signed_policy_loads_with_its_digest_and_signer(
    tmp_path: Path, policy_key: Ed25519PrivateKey
) -> None:
    path = signed_policy(tmp_path, CAPPED.format(purpose="1", alice="0.5"), policy_key)
    policy = load_release_policy(path, _trusted(policy_key))
    assert policy.version == 2 and policy.caps[("visits", "study")].epsilon == Decimal(1)
    assert policy.analyst_caps[("visits", "study", "alice")].epsilon == Decimal("0.5")
    assert len(policy.sha256) == 64 and policy.signer


def test_unsigned_tampered_and_unknown_key_policies_are_refused(
    tmp_path: Path, policy_key: Ed25519PrivateKey
) -> None:
    path = signed_policy(tmp_path, POLICY.format(eps="1"), policy_key)
    with pytest.raises(ReleasePolicyError, match="is not signed"):
        load_release_policy(tmp_path / "policy.toml", _trusted(policy_key))
    with pytest.raises(ReleasePolicyError, match="untrusted key"):
        load_release_policy(path, _trusted(Ed25519PrivateKey.generate()))
    envelope = json.loads(path.read_bytes())
    payload = json.loads(base64.b64decode(envelope["payload"]))
    payload["cap"][0]["epsilon"] = "100"  # the operator's cap raised after signing
    envelope["payload"] = base64.b64encode(canonical_json(payload)).decode()
    tampered = tmp_path / "tampered.json"
    tampered.write_bytes(canonical_json(envelope))
    with pytest.raises(ReleasePolicyError, match="altered after it was signed"):
        load_release_policy(tampered, _trusted(policy_key))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('version = 1\n[[cap]]\ndataset = "d"\npurpose = "p"\nepsilon = "1"\n', "exactly"),
        (
            'version = 1\n[[analyst_cap]]\ndataset = "d"\npurpose = "p"\nanalyst = "a"\n'
            'epsilon = "1"\ndelta = "0"\n',
            "needs a [[cap]]",
        ),
        ("version = 0\n", "positive integer"),
        ("version = 1\ncaps = []\n", "unknown key"),
        (
            'version = 1\n[[cap]]\ndataset = "d"\npurpose = "p"\nepsilon = "1e0"\ndelta = "0"\n',
            "plain decimal",
        ),
    ],
)
def test_malformed_policies_are_refused_at_signing(
    tmp_path: Path, policy_key: Ed25519PrivateKey, text: str, problem: str
) -> None:
    with pytest.raises(ReleasePolicyError, match=problem.replace("[", r"\[")):
        signed_policy(tmp_path, text, policy_key)


def test_a_new_version_may_lower_or_keep_a_cap_but_never_raise_it(
    make_service: Make, tmp_path: Path
) -> None:
    make_service(policy=CAPPED.format(purpose="1", alice="0.5")).stop(0)
    lowered = make_service(policy=CAPPED.format(purpose="0.8", alice="0.5"))
    assert lowered.ledger.central_cap(PURPOSE_SUBJECT, "study") == (Decimal("0.8"), Decimal(0))
    lowered.stop(0)
    for raised in (
        CAPPED.format(purpose="1", alice="0.5"),  # the purpose cap above the recorded 0.8
        CAPPED.format(purpose="0.8", alice="0.6"),  # alice's above her recorded 0.5
        CAPPED.replace("version = 2", "version = 1").format(purpose="1", alice="0.5"),
    ):
        with pytest.raises(ReleasePolicyError, match="can only be lowered or kept"):
            make_service(policy=raised)
    # nothing of the refused policies was written
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        assert ledger.central_cap(PURPOSE_SUBJECT, "study") == (Decimal("0.8"), Decimal(0))
        assert ledger.central_cap(ALICE_SUBJECT, "study") == (Decimal("0.5"), Decimal(0))
    finally:
        ledger.close()


# --- per-analyst caps ---


def test_an_analyst_cap_stops_one_analyst_while_another_continues(
    make_service: Make, client_for: ClientFor, tmp_path: Path, receipt_key: Ed25519PrivateKey
) -> None:
    svc = make_service(policy=CAPPED.format(purpose="1", alice="0.5"))
    alice, bob = client_for(svc.port, "alice"), client_for(svc.port, "bob")
    first = _count(alice, "a1", "0.25")
    _count(alice, "a2", "0.25")
    with pytest.raises(grpc.RpcError) as info:
        _count(alice, "a3", "0.25")
    err: Any = info.value
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "your own cap" in err.details()
    _count(bob, "b1", "0.25")  # the purpose has 0.5 left: bob continues
    assert _committed(svc, ALICE_SUBJECT) == Decimal("0.5")
    assert _committed(svc, PURPOSE_SUBJECT) == Decimal("0.75")  # alice's refusal charged nothing
    _count(bob, "b2", "0.25")
    with pytest.raises(grpc.RpcError) as info:
        _count(bob, "b3", "0.25")  # the shared purpose cap: bob is stopped too
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    # a retry of alice's first key returns her release without a second hold
    assert _count(alice, "a1", "0.25").reservation_id == first.reservation_id
    assert _committed(svc, ALICE_SUBJECT) == Decimal("0.5")
    # the receipt of a release with a hold verifies as any other
    path = tmp_path / "a1.json"
    path.write_bytes(first.receipt)
    result = verify_release_receipt(path, trusted=_trusted(receipt_key), ledger=svc.ledger)
    assert result.ok, result.failures()


def test_a_failure_after_reading_spends_the_analyst_hold_too(
    make_service: Make, client_for: ClientFor, tmp_path: Path
) -> None:
    svc = make_service(policy=CAPPED.format(purpose="1", alice="0.5"))
    data = tmp_path / "visits.csv"
    data.write_text(data.read_text() + "u9999,not-a-number,paris\n")  # after registration
    with pytest.raises(grpc.RpcError) as info:
        client_for(svc.port, "alice").release(
            dataset="visits",
            purpose="study",
            epsilon="0.25",
            delta="0",
            mechanism=pb.NOISE_MECHANISM_LAPLACE,
            idempotency_key="x",
            sum=pb.SumQuery(column="amount"),
        )
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert _committed(svc, ALICE_SUBJECT) == Decimal("0.25")
    assert _committed(svc, PURPOSE_SUBJECT) == Decimal("0.25")


def _race(services: list[RunningReleaseService], client_for: ClientFor) -> None:
    """40 requests of 0.1 from alice (own cap 0.5) and bob, across every service replica."""
    clients = [
        client_for(services[i % len(services)].port, ("alice", "bob")[i % 2]) for i in range(40)
    ]
    ok: dict[str, int] = {"alice": 0, "bob": 0}
    codes: list[grpc.StatusCode] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(clients))

    def go(i: int, client: Client) -> None:
        barrier.wait()
        try:
            _count(client, f"race-{i}", "0.1")
            with lock:
                ok[("alice", "bob")[i % 2]] += 1
        except grpc.RpcError as exc:
            codes.append(exc.code())

    threads = [threading.Thread(target=go, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert ok["alice"] <= 5 and ok["alice"] + ok["bob"] <= 10
    svc = services[0]
    assert _committed(svc, ALICE_SUBJECT) == Decimal("0.1") * ok["alice"] <= Decimal("0.5")
    total = Decimal("0.1") * (ok["alice"] + ok["bob"])
    assert _committed(svc, PURPOSE_SUBJECT) == total <= Decimal(1)


def test_concurrent_requests_never_exceed_either_cap_sqlite(
    make_service: Make, client_for: ClientFor
) -> None:
    policy = CAPPED.format(purpose="1", alice="0.5")
    first = make_service(policy=policy)
    _race([first, make_service(policy=policy)], client_for)  # two replicas, one ledger


def test_concurrent_requests_never_exceed_either_cap_postgresql(
    make_service: Make, client_for: ClientFor, postgresql_url: str
) -> None:
    policy = CAPPED.format(purpose="1", alice="0.5")
    first = make_service(ledger_url=postgresql_url, policy=policy)
    _race([first, make_service(ledger_url=postgresql_url, policy=policy)], client_for)


def _serve(tmp_path: Path, name: str) -> tuple[subprocess.Popen[str], int]:
    """`fedldp release-service serve` as its own process; (process, port)."""
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "fedldp"),
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
            str(tmp_path / f"{name}.key"),
            "--token-secret-file",
            str(tmp_path / "secret.hex"),
            "--listen",
            "127.0.0.1:0",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("release service on port "):
            return proc, int(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} did not start (exit {proc.wait()})")


def test_concurrent_requests_across_two_service_processes_never_exceed_either_cap(
    tmp_path: Path, policy_key: Ed25519PrivateKey
) -> None:
    write_data(tmp_path / "visits.csv")
    (tmp_path / "catalog.toml").write_text(CATALOG)
    signed_policy(tmp_path, CAPPED.format(purpose="1", alice="0.5"), policy_key)
    write_public_key(policy_key.public_key(), tmp_path / "policy.pub")
    (tmp_path / "secret.hex").write_text(SECRET.hex())
    procs = []
    try:
        for name in ("a", "b"):
            write_private_key(Ed25519PrivateKey.generate(), tmp_path / f"{name}.key")
            procs.append(_serve(tmp_path, name))  # one after another: one applies the caps
        clients = [Client(procs[i % 2][1], ("alice", "bob")[i % 2]) for i in range(30)]
        ok = {"alice": 0, "bob": 0}
        codes: list[grpc.StatusCode] = []
        lock = threading.Lock()
        barrier = threading.Barrier(len(clients))

        def go(i: int, client: Client) -> None:
            barrier.wait()
            try:
                _count(client, f"proc-{i}", "0.1")
                with lock:
                    ok[("alice", "bob")[i % 2]] += 1
            except grpc.RpcError as exc:
                codes.append(exc.code())

        threads = [threading.Thread(target=go, args=(i, c)) for i, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in clients:
            c.close()
    finally:
        for proc, _port in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert ok["alice"] <= 5 and 1 <= ok["alice"] + ok["bob"] <= 10
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        for subject, limit in ((ALICE_SUBJECT, Decimal("0.5")), (PURPOSE_SUBJECT, Decimal(1))):
            spent = [r for r in ledger.reservations(subject, "study") if r.status != "cancelled"]
            assert all(r.status == "settled" for r in spent)
            assert sum((r.epsilon_spent or Decimal(0) for r in spent), Decimal(0)) <= limit
        assert len(ledger.reservations(ALICE_SUBJECT, "study")) >= ok["alice"]
    finally:
        ledger.close()
