"""Fixtures: a release service on port 0 over a real ledger, with a distinctive dataset."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.central.signing import canonical_json, trusted_keys
from fedldp.aggregator.service.catalog import load_catalog
from fedldp.aggregator.service.policy import load_release_policy, sign_release_policy
from fedldp.aggregator.service.server import (
    RunningReleaseService,
    ServiceConfig,
    start_release_service,
)
from fedldp.collector.auth import (
    RELEASE_SERVICE_AUDIENCE,
    Authenticator,
    TokenAuthority,
    bearer_metadata,
)
from fedldp.v1 import release_pb2 as pb
from fedldp.v1 import release_pb2_grpc

SECRET = b"s" * 32
NOW = 1_900_000_000
#: Amounts with many decimals: their sum and mean are distinctive strings that
#: the noised outputs (multiples of a coarse lattice) can never equal.
ROWS = 2 * 397  # 397 units, 2 records each


def amount(i: int) -> Decimal:
    return Decimal("13.370001") + Decimal(i % 50) + Decimal(i) / Decimal(1_000_000)


def write_data(path: Path, rows: int = ROWS) -> tuple[Decimal, int]:
    """The CSV (user_id, amount, city); returns the true (sum, count)."""
    total = Decimal(0)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["user_id", "amount", "city"])
        for i in range(rows):
            a = amount(i)
            total += a
            w.writerow([f"u{i // 2}", str(a), ["paris", "lyon", "nice"][i % 3]])
    return total, rows


CATALOG = """
[groups]
research = ["alice", "bob"]

[datasets.visits]
csv = "visits.csv"
unit = "user_id"
contribution_bound = 2
[datasets.visits.columns.amount]
type = "numeric"
lower = "0"
upper = "100"
[datasets.visits.columns.city]
type = "categorical"
domain = ["paris", "lyon", "nice"]
[[datasets.visits.grants]]
groups = ["research"]
purposes = ["study"]
[[datasets.visits.grants]]
analysts = ["carol"]
purposes = ["audit"]
"""

POLICY = """
version = 1
[[cap]]
dataset = "visits"
purpose = "study"
epsilon = "{eps}"
delta = "0.00001"
[[cap]]
dataset = "visits"
purpose = "audit"
epsilon = "1"
delta = "0"
"""


class Client:
    """A gRPC client of the service for one analyst (bearer token)."""

    def __init__(self, port: int, analyst: str | None) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = release_pb2_grpc.ReleaseServiceStub(self.channel)
        token = (
            TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE).mint(
                analyst, expires_at=NOW + 3600
            )
            if analyst
            else None
        )
        self.metadata = bearer_metadata(token) if token else ()

    def release(self, **kwargs: Any) -> pb.ReleaseResponse:
        return self.stub.Release(pb.ReleaseRequest(**kwargs), metadata=self.metadata)

    def raw(self, data: bytes) -> bytes:
        call = self.channel.unary_unary(
            "/fedldp.v1.ReleaseService/Release",
            request_serializer=None,
            response_deserializer=None,
        )
        out: bytes = call(data, metadata=self.metadata)
        return out

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def receipt_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def policy_key() -> Ed25519PrivateKey:
    """The operator's release-policy signing key."""
    return Ed25519PrivateKey.generate()


def signed_policy(folder: Path, text: str, key: Ed25519PrivateKey) -> Path:
    """Write the policy source `text` and its signed envelope; the envelope's path."""
    (folder / "policy.toml").write_text(text, encoding="utf-8")
    out = folder / "policy.json"
    out.write_bytes(canonical_json(sign_release_policy(folder / "policy.toml", key)))
    return out


@pytest.fixture
def make_service(
    tmp_path: Path, receipt_key: Ed25519PrivateKey, policy_key: Ed25519PrivateKey
) -> Iterator[Callable[..., RunningReleaseService]]:
    """Start a service: make_service(ledger_url=None, eps_cap="1", catalog=CATALOG,
    policy=None (POLICY with eps_cap), service_id="release-service")."""
    started: list[RunningReleaseService] = []

    def make(
        ledger_url: str | None = None,
        eps_cap: str = "1",
        catalog: str = CATALOG,
        policy: str | None = None,
        service_id: str | None = "release-service",
    ) -> RunningReleaseService:
        if not (tmp_path / "visits.csv").exists():
            write_data(tmp_path / "visits.csv")
        (tmp_path / "catalog.toml").write_text(catalog, encoding="utf-8")
        envelope = signed_policy(tmp_path, policy or POLICY.format(eps=eps_cap), policy_key)
        config = ServiceConfig(
            catalog=load_catalog(tmp_path / "catalog.toml"),
            policy=load_release_policy(envelope, trusted_keys([policy_key.public_key()])),
            service_id=service_id,
            ledger_url=ledger_url or f"sqlite:///{tmp_path / 'ledger.db'}",
            signing_key=receipt_key,
            authenticator=Authenticator(TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE)),
        )
        svc = start_release_service(config, clock=lambda: NOW)
        started.append(svc)
        return svc

    yield make
    for svc in started:
        svc.stop(0)


@pytest.fixture
def client_for() -> Iterator[Callable[[int, str | None], Client]]:
    made: list[Client] = []

    def make(port: int, analyst: str | None) -> Client:
        c = Client(port, analyst)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
