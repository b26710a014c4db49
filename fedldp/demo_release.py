"""`fedldp demo --release-service`: the trusted release service on a small generated dataset.

After the LDP demo, `run_release_demo` plays both roles of docs/release-service.md
in one process, in a sub-folder `release-service/` of the demo's output:

* the operator: a consolidated per-person table (CSV, 2,000 records of 1,000
  people, at most 2 each: amount in [0, 100], city), a catalog granting the
  analyst "demo-analyst" the purpose "demo-report", a release policy signed
  with a fresh release-policy key (cap ε = 1, δ = 0), a receipt key, a token
  secret, and the service on 127.0.0.1 (random port, its own SQLite ledger);
* the analyst: one count and one mean (ε = 0.25 each, Laplace) over gRPC with
  a bearer token, each receipt written to a file and verified against the
  ledger and the receipt key (`fedldp verify release` does the same).

`release_html` renders the results (noised value, noise standard deviation,
95 % interval, reservation, receipt, verification) as a section of the HTML
report. The generated data are synthetic; the simulation seed, when given,
makes them reproducible, while the release noise always comes from the OS CSPRNG.
"""

from __future__ import annotations

import csv
import html
import random
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ANALYST = "demo-analyst"
PURPOSE = "demo-report"
DATASET = "purchases"
PEOPLE = 1000
RECORDS_PER_PERSON = 2

_CATALOG = f"""
[datasets.{DATASET}]
csv = "{DATASET}.csv"
unit = "person_id"
contribution_bound = {RECORDS_PER_PERSON}
[datasets.{DATASET}.columns.amount]
type = "numeric"
lower = "0"
upper = "100"
[datasets.{DATASET}.columns.city]
type = "categorical"
domain = ["lyon", "nice", "paris"]
[[datasets.{DATASET}.grants]]
analysts = ["{ANALYST}"]
purposes = ["{PURPOSE}"]
"""
_POLICY = f"""
version = 1
[[cap]]
dataset = "{DATASET}"
purpose = "{PURPOSE}"
epsilon = "1"
delta = "0"
"""


@dataclass(frozen=True)
class DemoRelease:
    """One release as the analyst received it, and whether its receipt verified."""

    kind: str
    value: str
    noise_stddev: float
    lower: str
    upper: str
    confidence: str
    reservation_id: str
    receipt: Path
    verified: bool


def _write_dataset(path: Path, rng: random.Random) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["person_id", "amount", "city"])
        for person in range(PEOPLE):
            for _ in range(RECORDS_PER_PERSON):
                amount = min(100.0, rng.expovariate(1 / 30))
                writer.writerow(
                    [f"p{person}", f"{amount:.2f}", rng.choice(["lyon", "nice", "paris"])]
                )


def run_release_demo(out: Path, seed: int | None) -> list[DemoRelease]:
    """Generate, register, serve, ask a count and a mean, verify the receipts (module docstring)."""
    import grpc
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedldp.aggregator.central.receipts import verify_release_receipt
    from fedldp.aggregator.central.signing import canonical_json, trusted_keys
    from fedldp.aggregator.service.catalog import load_catalog
    from fedldp.aggregator.service.policy import load_release_policy, sign_release_policy
    from fedldp.aggregator.service.server import ServiceConfig, start_release_service
    from fedldp.collector.auth import Authenticator, TokenAuthority, bearer_metadata
    from fedldp.v1 import release_pb2 as pb
    from fedldp.v1 import release_pb2_grpc

    folder = out / "release-service"
    folder.mkdir()
    _write_dataset(
        folder / f"{DATASET}.csv",
        random.Random(seed) if seed is not None else random.SystemRandom(),
    )
    (folder / "catalog.toml").write_text(_CATALOG, encoding="utf-8")
    (folder / "release-policy.toml").write_text(_POLICY, encoding="utf-8")
    policy_key, receipt_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    signed = canonical_json(sign_release_policy(folder / "release-policy.toml", policy_key))
    (folder / "release-policy.json").write_bytes(signed)
    secret = secrets.token_bytes(32)
    ledger_url = f"sqlite:///{(folder / 'release-ledger.db').resolve()}"
    running = start_release_service(
        ServiceConfig(
            catalog=load_catalog(folder / "catalog.toml"),
            policy=load_release_policy(
                folder / "release-policy.json", trusted_keys([policy_key.public_key()])
            ),
            ledger_url=ledger_url,
            signing_key=receipt_key,
            authenticator=Authenticator(TokenAuthority(secret)),
            listen="127.0.0.1:0",
            max_workers=2,
        )
    )
    token = TokenAuthority(secret).mint(ANALYST, expires_at=int(time.time()) + 600)
    queries: dict[str, dict[str, Any]] = {
        "count": {"count": pb.CountQuery()},
        "mean": {"mean": pb.MeanQuery(column="amount")},
    }
    results = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = release_pb2_grpc.ReleaseServiceStub(channel)
            for kind, query in queries.items():
                reply = stub.Release(
                    pb.ReleaseRequest(
                        dataset=DATASET,
                        purpose=PURPOSE,
                        epsilon="0.25",
                        delta="0",
                        mechanism=pb.NOISE_MECHANISM_LAPLACE,
                        idempotency_key=f"demo-{kind}",
                        **query,
                    ),
                    metadata=bearer_metadata(token),
                )
                receipt = folder / f"{kind}.receipt.json"
                receipt.write_bytes(reply.receipt)
                check = verify_release_receipt(
                    receipt, trusted=trusted_keys([receipt_key.public_key()]), ledger=running.ledger
                )
                (value,) = reply.values
                results.append(
                    DemoRelease(
                        kind,
                        value.value,
                        value.error.noise_stddev,
                        value.error.lower,
                        value.error.upper,
                        value.error.confidence,
                        reply.reservation_id,
                        receipt,
                        check.ok,
                    )
                )
    finally:
        running.stop(0)
    return results


def short(text: str) -> str:
    """A released decimal shown with 6 significant digits (the receipt keeps it exact)."""
    return f"{float(text):.6g}"


def release_html(results: list[DemoRelease]) -> str:
    """The HTML section of the demo report showing the releases."""
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(c)}</td>"
            for c in (
                r.kind,
                short(r.value),
                f"{r.noise_stddev:.3g}",
                f"[{short(r.lower)}, {short(r.upper)}] ({float(r.confidence):.0%})",
                r.reservation_id[:12] + "…",
                r.receipt.name,
                "verified" if r.verified else "FAILED",
            )
        )
        + "</tr>"
        for r in results
    )
    head = (
        "<tr><th>query</th><th>noised value</th><th>noise sd</th><th>interval</th>"
        "<th>reservation</th><th>signed receipt</th><th>receipt check</th></tr>"
    )
    return (
        "<h2>Central releases through the release service</h2>"
        f"<p>An analyst ({ANALYST}, purpose {PURPOSE}) asked the trusted release service for "
        f"a count and a mean of a generated consolidated table ({PEOPLE} people, at most "
        f"{RECORDS_PER_PERSON} records each, amount declared in [0, 100]), ε = 0.25 each "
        "(discrete Laplace) against a signed cap of ε = 1. The service never returned the data "
        "or the true aggregate; each receipt was verified against the service's ledger and "
        "receipt key.</p>"
        f"<table>{head}{rows}</table>"
        "<p class='note'>The interval is for the value before noise, over the noise only "
        "(exact for the count; a delta-method approximation for the mean); it does not "
        "include sampling error of the data.</p>"
    )


def append_to_report(report: Path, section: str) -> None:
    """Insert `section` at the end of the HTML report's body."""
    text = report.read_text(encoding="utf-8")
    closing = "</body></html>"
    report.write_text(text.replace(closing, section + "\n" + closing), encoding="utf-8")
