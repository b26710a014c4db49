"""Attacks on the trusted release service (independent audit, branch atk1).

Each test states the documented claim it breaks. Every test here FAILS on the
code it was written against and should pass once the finding is fixed.
"""

from __future__ import annotations

import base64
import csv
import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
from fedldp.aggregator.service.policy import ReleasePolicyError, analyst_subject, ledger_subject
from fedldp.aggregator.service.server import RunningReleaseService
from fedldp.v1 import release_pb2 as pb

from tests.aggregator.service.conftest import CATALOG, Client

Make = Callable[..., RunningReleaseService]
ClientFor = Callable[[int, "str | None"], Client]
LAPLACE = pb.NOISE_MECHANISM_LAPLACE
SERVICE = "release-service"
ALICE_SUBJECT = analyst_subject(SERVICE, "visits", "alice")


def _count(client: Client, key: str, eps: str) -> Any:
    return client.release(
        dataset="visits",
        purpose="study",
        epsilon=eps,
        delta="0",
        mechanism=LAPLACE,
        idempotency_key=key,
        count=pb.CountQuery(),
    )


def _code(call: Callable[[], Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    err: Any = info.value
    code: grpc.StatusCode = err.code()
    return code


# --- F1: replaying an older signed policy (or signing one without it) lifts an analyst's own cap


V1_NO_ANALYST_CAP = """
version = 1
[[cap]]
dataset = "visits"
purpose = "study"
epsilon = "1"
delta = "0"
"""

V2_ALICE_CAPPED = """
version = 2
[[cap]]
dataset = "visits"
purpose = "study"
epsilon = "1"
delta = "0"
[[analyst_cap]]
dataset = "visits"
purpose = "study"
analyst = "alice"
epsilon = "0.25"
delta = "0"
"""


def test_attack_policy_rollback_drops_a_recorded_analyst_cap(
    make_service: Make, client_for: ClientFor
) -> None:
    """Claim (docs/release-service.md, "Versions"): "a new policy may lower or keep any
    recorded cap and never raise one ... whatever its version number; so replaying an
    older signed policy cannot raise a cap either."

    The operator's v2 gives alice an own cap of 0.25, recorded in the ledger. Someone
    who can write the policy file but has no signing key puts back the still-validly
    signed v1 (no [[analyst_cap]]): the service starts, alice's recorded cap is
    silently ignored (the engine looks only at the policy, not the ledger), and alice
    spends 0.75 > 0.25. Expected: refuse to start (a recorded analyst cap missing from
    the policy), or keep enforcing the recorded cap.
    """
    make_service(policy=V2_ALICE_CAPPED).stop(0)
    try:
        svc = make_service(policy=V1_NO_ANALYST_CAP)
    except ReleasePolicyError:
        return  # fixed by refusing the rollback
    alice = client_for(svc.port, "alice")
    _count(alice, "a1", "0.25")  # within her recorded own cap
    assert _code(lambda: _count(alice, "a2", "0.5")) is grpc.StatusCode.RESOURCE_EXHAUSTED, (
        "alice spent 0.75 against her recorded own cap of 0.25 after a policy rollback"
    )


# --- F2: an idempotency key reused for another column returns the other column's release


TWO_COLUMNS = """
[datasets.visits]
csv = "visits.csv"
unit = "user_id"
contribution_bound = 1
[datasets.visits.columns.amount]
type = "numeric"
lower = "0"
upper = "100"
[datasets.visits.columns.score]
type = "numeric"
lower = "0"
upper = "100"
[datasets.visits.columns.city]
type = "categorical"
domain = ["paris", "lyon"]
[datasets.visits.columns.town]
type = "categorical"
domain = ["paris", "lyon"]
[[datasets.visits.grants]]
analysts = ["alice"]
purposes = ["study"]
"""

POLICY_STUDY = """
version = 1
[[cap]]
dataset = "visits"
purpose = "study"
epsilon = "100"
delta = "0.00001"
"""


def _two_column_data(path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["user_id", "amount", "score", "city", "town"])
        for i in range(400):  # amount always 0, score always 100: sums 0 vs 40,000
            w.writerow([f"u{i}", "0", "100", "paris", "lyon"])


def _sum(client: Client, column: str, key: str) -> Any:
    return client.release(
        dataset="visits",
        purpose="study",
        epsilon="50",
        delta="0",
        mechanism=LAPLACE,
        idempotency_key=key,
        sum=pb.SumQuery(column=column),
    )


def test_attack_idempotency_key_reused_for_another_column_returns_the_wrong_release(
    make_service: Make, client_for: ClientFor, tmp_path: Path
) -> None:
    """Claim (docs/release-service.md, status codes): "`ALREADY_EXISTS` (key reused for
    another query)"; proto: "a retry with the same key returns the same release".

    The conflict check compares the ledger reservation's metadata, which holds the
    kind and the clipping bounds but not the column: sum(score) with the key of an
    earlier sum(amount) (same declared bounds, same ε) silently returns the amount
    release labelled as the score one, with a receipt that verifies. Its receipt
    cannot tell which column it was about, so it can also be passed off as a receipt
    for the other column. Expected: ALREADY_EXISTS (and the column in the metadata).
    """
    _two_column_data(tmp_path / "visits.csv")
    svc = make_service(catalog=TWO_COLUMNS, policy=POLICY_STUDY)
    alice = client_for(svc.port, "alice")
    first = _sum(alice, "amount", "k1")
    assert abs(Decimal(first.values[0].value)) < 100  # true 0, noise scale 2
    assert _code(lambda: _sum(alice, "score", "k1")) is grpc.StatusCode.ALREADY_EXISTS, (
        "a key used for sum(amount) answered sum(score) with the amount release"
    )


def test_attack_histogram_key_reused_for_another_column_returns_the_wrong_release(
    make_service: Make, client_for: ClientFor, tmp_path: Path
) -> None:
    """As above, for a histogram over two categorical columns with the same domain."""
    _two_column_data(tmp_path / "visits.csv")
    svc = make_service(catalog=TWO_COLUMNS, policy=POLICY_STUDY)
    alice = client_for(svc.port, "alice")

    def hist(column: str) -> Any:
        return alice.release(
            dataset="visits",
            purpose="study",
            epsilon="50",
            delta="0",
            mechanism=LAPLACE,
            idempotency_key="h1",
            histogram=pb.HistogramQuery(column=column),
        )

    hist("city")
    assert _code(lambda: hist("town")) is grpc.StatusCode.ALREADY_EXISTS


def test_attack_a_receipt_names_the_column_it_is_about(
    make_service: Make, client_for: ClientFor, tmp_path: Path
) -> None:
    """Claim (README/docs): receipts let anyone check *what* was released. A sum
    receipt records kind, bounds, ε, dataset and purpose but not the column, so the
    receipt of sum(amount) is indistinguishable from one of sum(score) (same bounds)
    and can be replayed as the receipt of the other query."""
    _two_column_data(tmp_path / "visits.csv")
    svc = make_service(catalog=TWO_COLUMNS, policy=POLICY_STUDY)
    alice = client_for(svc.port, "alice")
    receipt = json.loads(
        base64.b64decode(json.loads(_sum(alice, "amount", "k2").receipt)["payload"])
    )
    assert "amount" in json.dumps(receipt), "the receipt does not say which column was summed"


# --- F3: the registration outcome (a function of the data) is released for free


CLEAN_AND_DIRTY = (
    CATALOG
    + """
[datasets.dirty]
csv = "dirty.csv"
unit = "user_id"
contribution_bound = 2
[datasets.dirty.columns.amount]
type = "numeric"
lower = "0"
upper = "100"
[datasets.dirty.columns.city]
type = "categorical"
domain = ["paris", "lyon", "nice"]
[[datasets.dirty.grants]]
groups = ["research"]
purposes = ["study"]
"""
)


def test_attack_registration_outcome_is_observable_by_a_granted_analyst(
    make_service: Make, client_for: ClientFor, tmp_path: Path
) -> None:
    """Claim (docs/release-service.md, "Registration"): "Registration reads data
    without charging budget ... and its outcome is not released to analysts."

    Whether a dataset registers is a function of every row (one person's value above
    the declared bound, or one unit with k+1 records, refuses it). A granted analyst
    sees that bit for free: the dataset is missing from ListDatasets and every
    Release on it answers PERMISSION_DENIED. Here the only difference between the two
    datasets is ONE person's amount (101 instead of 99), and alice can tell. Expected:
    serve refuses to start (the operator fixes the data) or the dataset is served,
    bounded and clipped at query time like any other (registration is advisory).
    """
    rows = [["user_id", "amount", "city"]] + [[f"u{i}", "50", "paris"] for i in range(50)]
    with (tmp_path / "dirty.csv").open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([*rows, ["target", "101", "lyon"]])  # the target's value
    try:
        svc = make_service(catalog=CLEAN_AND_DIRTY)
    except (ValueError, OSError):  # a refusal to start is one valid fix
        return
    alice = client_for(svc.port, "alice")
    listed = alice.stub.ListDatasets(pb.ListDatasetsRequest(), metadata=alice.metadata)
    assert sorted(d.dataset for d in listed.datasets) == ["dirty", "visits"], (
        "a granted dataset vanished because one person's value broke its declaration"
    )


# --- F4: the mean's ε split is rounded in the default 28-digit Decimal context


def test_attack_mean_spends_more_epsilon_than_it_charges(
    make_service: Make, client_for: ClientFor
) -> None:
    """Claim (docs: exact quantities, "mean: ε, δ split in half over sum and count";
    releases.py: "every sum and comparison ... exact"). ε/2 is computed in the default
    28-digit context, so for ε = 0.1999999999999999999999999999999 each half is
    rounded UP to 0.1: the noise is calibrated to a total ε of 0.2 while the ledger
    charges 0.1999999999999999999999999999999 (and the receipt's events sum to more
    than was reserved). Tiny, but it breaks the exactness the ledger promises.
    Expected: exact halves (or refuse ε with more digits than can be halved exactly).
    """
    svc = make_service()
    alice = client_for(svc.port, "alice")
    eps = "0.1999999999999999999999999999999"
    try:
        reply = alice.release(
            dataset="visits",
            purpose="study",
            epsilon=eps,
            delta="0",
            mechanism=LAPLACE,
            idempotency_key="m1",
            mean=pb.MeanQuery(column="amount"),
        )
    except grpc.RpcError as err:
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT  # refusing is a fix too
        return
    receipt = json.loads(base64.b64decode(json.loads(reply.receipt)["payload"]))
    spent = sum(Decimal(str(e["epsilon"])) for e in receipt["events"])
    assert spent <= Decimal(eps), f"noise calibrated to eps={spent} > charged {eps}"


# --- F5: "printable ASCII" keys and plain decimals accept a trailing newline ($ in re)


def test_attack_idempotency_key_with_a_trailing_newline_is_accepted(
    make_service: Make, client_for: ClientFor
) -> None:
    """Claim (proto): idempotency_key is "1-128 printable ASCII characters". The check
    is re.match(r"^[\\x21-\\x7e]{1,128}$"), and `$` also matches before a final "\\n",
    so "k1\\n" is accepted (a key distinct from "k1", with a control character that
    ends up in the ledger and in receipts). Expected: INVALID_ARGUMENT (use \\Z or
    re.fullmatch). Informational."""
    svc = make_service()
    alice = client_for(svc.port, "alice")
    assert _code(lambda: _count(alice, "k1\n", "0.1")) is grpc.StatusCode.INVALID_ARGUMENT


def test_attack_epsilon_with_a_trailing_newline_is_accepted(
    make_service: Make, client_for: ClientFor
) -> None:
    """Claim (proto/docs): ε and δ are "plain decimal strings ("0.5", no exponent)";
    the same `$` lets "0.1\\n" through. Informational."""
    svc = make_service()
    alice = client_for(svc.port, "alice")
    assert _code(lambda: _count(alice, "k2", "0.1\n")) is grpc.StatusCode.INVALID_ARGUMENT


# keep the import used (subjects are handy when extending these attacks)
assert ledger_subject(SERVICE, "visits") == "release-service/visits"
assert ALICE_SUBJECT.endswith("analyst:alice")


# --- F6: the analyst client sends its bearer token in clear text to any address


def _non_loopback_ipv4() -> str | None:
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.254", 9))  # no packet is sent (UDP connect)
            addr: str = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


def test_attack_client_sends_the_bearer_token_in_clear_text_off_localhost() -> None:
    """Claims (docs/release-service.md): "tokens should only travel over TLS outside
    localhost"; threat model: "Untrusted: ... the network (use TLS)".

    `fedldp release-service query ... --service HOST:PORT` without `--tls-ca` opens an
    insecure channel to any host (the Quick start even shows `--service host:50061`
    without it) and sends `authorization: Bearer <token>` in clear text. A passive
    network attacker (here: a plaintext gRPC server on this machine's non-loopback
    address standing in for a sniffer or a spoofed DNS name) captures the token and
    can spend the analyst's budget and read their releases. Expected: refuse a
    non-loopback --service without TLS (exit 2), or use TLS with the system roots by
    default and require an explicit --insecure for plaintext.
    """
    from concurrent.futures import ThreadPoolExecutor

    from click.testing import CliRunner
    from fedldp.collector.auth import TokenAuthority

    from fedldp.cli import main
    from tests.aggregator.service.conftest import NOW, SECRET

    host = _non_loopback_ipv4()
    if host is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    captured: list[str] = []

    def sniff(_raw: bytes, context: Any) -> bytes:
        captured.extend(str(v) for k, v in context.invocation_metadata() if k == "authorization")
        context.abort(grpc.StatusCode.UNAVAILABLE, "not the release service")
        return b""

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "fedldp.v1.ReleaseService",
                {"Release": grpc.unary_unary_rpc_method_handler(sniff)},
            ),
        )
    )
    port = server.add_insecure_port(f"{host}:0")
    server.start()
    try:
        token = TokenAuthority(SECRET).mint("alice", expires_at=NOW + 3600)
        CliRunner().invoke(
            main,
            [
                "release-service",
                "query",
                "count",
                "--service",
                f"{host}:{port}",
                "--dataset",
                "visits",
                "--purpose",
                "study",
                "--epsilon",
                "0.1",
                "--key",
                "net1",
            ],
            env={"FEDLDP_TOKEN": token},
        )
    finally:
        server.stop(0)
    assert not any(token in c for c in captured), (
        f"the bearer token crossed the network in clear text to {host}:{port}"
    )


# --- F7: a different --service-id on the same ledger starts every lifetime cap afresh


def test_attack_changing_the_service_id_resets_every_lifetime_cap(
    make_service: Make, client_for: ClientFor
) -> None:
    """Claims (docs/release-service.md): "Central caps are lifetime totals"; the policy
    is signed so that caps cannot be raised without the operator's key; "a new policy
    may lower or keep any recorded cap and never raise one".

    The ledger subject of every cap is "<service id>/<dataset>", and the service id is
    an unsigned command-line flag (`serve --service-id`, default "release-service").
    Whoever can restart the service (or a second replica started with another id on
    the same ledger) gets a fresh copy of every cap, with the same signed policy and
    the same ledger: the purpose's committed budget is forgotten. Expected: the
    service id bound into the signed policy, or the ledger refusing a (dataset,
    purpose) already capped under another service id.
    """
    svc = make_service(eps_cap="1")
    alice = client_for(svc.port, "alice")
    _count(alice, "s1", "1")  # the whole lifetime cap of (visits, study)
    assert _code(lambda: _count(alice, "s2", "0.5")) is grpc.StatusCode.RESOURCE_EXHAUSTED
    svc.stop(0)
    try:
        replica = make_service(eps_cap="1", service_id="release-service-2")
    except (ValueError, OSError):
        return  # refusing the other service id is a fix
    again = client_for(replica.port, "alice")
    assert _code(lambda: _count(again, "s3", "1")) is grpc.StatusCode.RESOURCE_EXHAUSTED, (
        "the same dataset and purpose got a second lifetime cap of 1 on the same ledger"
    )


# --- F8: an analyst cap naming no granted analyst (case typo) silently caps nobody


ALICE_CAPPED_WITH_A_TYPO = V2_ALICE_CAPPED.replace('analyst = "alice"', 'analyst = "Alice"')


def test_attack_an_analyst_cap_for_an_ungranted_spelling_is_silently_ignored(
    make_service: Make, client_for: ClientFor
) -> None:
    """Claim (docs/release-service.md): "[[analyst_cap]] # optional: one analyst's own
    cap in it" ... "then each is stopped at their own cap". Subjects are case-sensitive
    and nothing checks an [[analyst_cap]] against the catalog's grants: the operator
    signs a cap for "Alice" meaning alice (granted through the group `research`),
    the service starts without a word, and alice is never held to 0.25. A careless
    operator gets no signal that the cap protects nobody. Expected: serve (or
    sign-policy with --catalog) refuses an analyst cap whose analyst is not granted
    that (dataset, purpose) by the catalog, or at least names it at start-up.
    """
    try:
        svc = make_service(policy=ALICE_CAPPED_WITH_A_TYPO)
    except (ValueError, OSError):
        return  # refused at start-up: fixed
    alice = client_for(svc.port, "alice")
    _count(alice, "t1", "0.25")
    assert _code(lambda: _count(alice, "t2", "0.25")) is grpc.StatusCode.RESOURCE_EXHAUSTED, (
        "an analyst cap that applies to no granted analyst was accepted silently"
    )


# --- F9: the "non-reversible" analyst tag in logs is an unsalted hash of a public name


def test_attack_log_analyst_tag_is_reversible_by_dictionary() -> None:
    """Claim (server.py): "a hashed analyst tag" / analyst_tag: "A short, non-reversible
    tag of an analyst for logs"; issue 19: no analyst names in metrics labels, and the
    docs list `analyst_tag` as what stands for the analyst in logs. The tag is
    sha256(name)[:12] with no key, so anyone reading the logs maps it back with the
    list of analyst subjects (the catalog's grants, or a dictionary of login names).
    Expected: an HMAC under a service secret (or say plainly that it is a pseudonym
    reversible by anyone who knows the names). Informational."""
    import hashlib

    from fedldp.aggregator.service.server import analyst_tag

    candidates = ["alice", "bob", "carol", "dave", "root", "admin"]
    table = {hashlib.sha256(n.encode()).hexdigest()[:12]: n for n in candidates}
    assert table.get(analyst_tag("carol")) != "carol", "the log tag was reversed by dictionary"


# --- F10: `serve --mtls` without --tls-cert serves plaintext and takes bearer tokens


def test_attack_serve_with_mtls_but_no_tls_cert_serves_plaintext(tmp_path: Path) -> None:
    """Claims (docs/release-service.md): "TLS with `--tls-cert/--tls-key`"; "with
    `--mtls`, the client certificate's common name"; "Untrusted: ... the network".

    An operator who asks for mutual TLS (`--mtls --tls-client-ca ca.pem`) but forgets
    `--tls-cert/--tls-key` gets a service that starts without a word, listens in
    plaintext (`add_insecure_port`), never sees a client certificate, and
    authenticates by bearer token instead: what they believe is mTLS is clear-text
    token auth. (`--tls-client-ca` without `--mtls` is likewise silently ignored.)
    Expected: a usage error (exit 2) for --mtls / --tls-client-ca without --tls-cert.
    """
    import subprocess
    import sys
    import time

    from tests.aggregator.service.test_release_client import _operator_files

    files = _operator_files(tmp_path)
    (tmp_path / "secret.hex").write_text("ab" * 32)
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    exe = Path(sys.executable).parent / "fedldp"
    args = [
        str(exe), "release-service", "serve", *files,
        "--token-secret-file", str(tmp_path / "secret.hex"),
        "--mtls", "--tls-client-ca", str(tmp_path / "ca.pem"), "--listen", "127.0.0.1:0",
    ]  # fmt: skip
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    served = False
    try:
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break  # exited: refused
            if "release service on port" in line:
                served = True
                break
    finally:
        proc.terminate()
        proc.wait(30)
    assert not served, "serve --mtls without --tls-cert started a plaintext service"


# --- F12: the README's release-service paragraph contradicts what is built


def test_attack_readme_release_service_command_is_the_one_that_runs() -> None:
    """Claim (issue 19, "Done means: the above works end to end from the README").
    README.md's "trusted release service" paragraph shows `serve ... --policy
    release-policy.toml` with no `--policy-key` (a required option; and serve refuses
    an unsigned TOML policy: "is not signed"), and ends "Not built yet: ...
    quantiles, per-analyst caps, signed release policies, Parquet sources, and the
    demo flag" although docs/release-service.md documents all but Parquet as built.
    An operator following the README either cannot start the service or believes
    there are no per-analyst caps or policy signatures. Informational (docs)."""
    # The paragraph moved with the privacy engineers' section to docs/privacy.md.
    text = (Path(__file__).resolve().parents[3] / "docs" / "privacy.md").read_text(encoding="utf-8")
    start = text.index("**The trusted release service.**")
    paragraph = text[start : text.index("## Threat model", start)]
    assert "--policy-key" in paragraph, "the README's serve command lacks --policy-key"
    assert "signed release policies" not in paragraph.split("Not built yet")[-1]
