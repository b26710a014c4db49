"""The release service's start-up refusals and request checks added after the audit
(tests/aggregator/service/test_attack_release_service.py holds the attacks
themselves). Each test names the broken variant it catches."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from collections.abc import Callable
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.central.receipts import verify_release_receipt
from fedldp.aggregator.central.releases import exact_half
from fedldp.aggregator.central.signing import trusted_keys
from fedldp.aggregator.service import errorbars
from fedldp.aggregator.service.addresses import check_plaintext, check_tls, is_loopback
from fedldp.aggregator.service.catalog import RegistrationError
from fedldp.aggregator.service.engine import MAX_DIGITS, MIN_EPSILON
from fedldp.aggregator.service.policy import ReleasePolicyError, ledger_subject
from fedldp.aggregator.service.server import RunningReleaseService, analyst_tag, tag_key_of
from fedldp.v1 import release_pb2 as pb

from tests.aggregator.service.conftest import POLICY, Client

Make = Callable[..., RunningReleaseService]
ClientFor = Callable[[int, "str | None"], Client]
LAPLACE = pb.NOISE_MECHANISM_LAPLACE


def _code(call: Callable[[], Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    err: Any = info.value
    code: grpc.StatusCode = err.code()
    return code


def _release(client: Client, key: str, eps: str = "0.1", **query: Any) -> pb.ReleaseResponse:
    return client.release(
        dataset="visits",
        purpose="study",
        epsilon=eps,
        delta="0",
        mechanism=query.pop("mechanism", LAPLACE),
        idempotency_key=key,
        **(query or {"count": pb.CountQuery()}),
    )


def _payload(reply: pb.ReleaseResponse) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(base64.b64decode(json.loads(reply.receipt)["payload"]))
    return out


# --- the policy against the ledger ---


def test_a_policy_dropping_a_recorded_purpose_cap_is_refused(make_service: Make) -> None:
    """Broken variant: `apply` checking only the caps the new policy lists (the audit
    cap recorded by v1 would be silently left behind, and its next policy could
    raise it as a "new" cap)."""
    make_service(eps_cap="1").stop(0)
    only_study = 'version = 2\n[[cap]]\ndataset = "visits"\npurpose = "study"\n'
    only_study += 'epsilon = "1"\ndelta = "0.00001"\n'
    with pytest.raises(ReleasePolicyError, match=r"omits the cap recorded .* purpose audit"):
        make_service(policy=only_study)


def test_lowering_a_recorded_cap_to_zero_closes_it(
    make_service: Make, client_for: ClientFor
) -> None:
    make_service(eps_cap="1").stop(0)
    svc = make_service(eps_cap="0")
    assert _code(lambda: _release(client_for(svc.port, "alice"), "z")) is (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )


def test_the_service_id_comes_from_the_signed_policy(
    make_service: Make, client_for: ClientFor
) -> None:
    """Broken variant: a service id taken from the command line (a second id on the
    same ledger is a second copy of every lifetime cap)."""
    text = POLICY.format(eps="1").replace("version = 1", 'version = 1\nservice_id = "svc-b"')
    svc = make_service(policy=text, service_id=None)
    reply = _release(client_for(svc.port, "alice"), "b1")
    assert _payload(reply)["ledger"]["subject"] == ledger_subject("svc-b", "visits")
    svc.stop(0)
    with pytest.raises(ReleasePolicyError, match="signed for service id 'svc-b', not 'svc-c'"):
        make_service(policy=text, service_id="svc-c")


@pytest.mark.parametrize("bad", ['"svc/b"', '""', '"' + "a" * 65 + '"', '"svc-b\\n"', "7"])
def test_a_malformed_service_id_is_refused(make_service: Make, bad: str) -> None:
    """Broken variant: `$` in the id pattern (accepts "svc-b\\n")."""
    text = POLICY.format(eps="1").replace("version = 1", f"version = 1\nservice_id = {bad}")
    with pytest.raises(ReleasePolicyError, match="service_id must be"):
        make_service(policy=text)


def test_an_analyst_cap_for_an_ungranted_analyst_names_it(make_service: Make) -> None:
    """carol is granted "audit", not "study": her "study" cap would cap nobody."""
    text = POLICY.format(eps="1") + (
        '[[analyst_cap]]\ndataset = "visits"\npurpose = "study"\nanalyst = "carol"\n'
        'epsilon = "0.1"\ndelta = "0"\n'
    )
    with pytest.raises(ReleasePolicyError, match="analyst carol"):
        make_service(policy=text)


# --- registration ---


def test_undecodable_data_refuses_start_without_quoting_its_bytes(
    make_service: Make, tmp_path: Path
) -> None:
    (tmp_path / "visits.csv").write_bytes(b"user_id,amount,city\nu1,\xff\xfe7,paris\n")
    with pytest.raises(RegistrationError) as info:
        make_service()
    assert "visits" in str(info.value)
    assert "xff" not in str(info.value) and "0xff" not in str(info.value)


# --- the request's ε ---


def test_exact_half_is_exact_where_the_default_context_rounds() -> None:
    eps = Decimal("0.1999999999999999999999999999999")
    assert Fraction(exact_half(eps)) * 2 == Fraction(eps)
    assert Fraction(eps / 2) * 2 != Fraction(eps)  # the broken variant: 28-digit context


def test_a_mean_charges_exactly_the_noise_it_calibrates(
    make_service: Make, client_for: ClientFor
) -> None:
    eps = "0." + "1" * (MAX_DIGITS - 1) + "3"  # MAX_DIGITS digits, an odd last one
    reply = _release(
        client_for(make_service().port, "alice"), "m", eps, mean=pb.MeanQuery(column="amount")
    )
    with localcontext() as ctx:
        ctx.prec = 60
        spent = sum(Decimal(str(e["epsilon"])) for e in _payload(reply)["events"])
    assert spent == Decimal(eps)


@pytest.mark.parametrize(
    "eps", [f"{MIN_EPSILON / 10:f}", "0." + "1" * MAX_DIGITS + "1", "0.1\n", "1e-3"]
)
def test_an_unusable_epsilon_is_refused_before_any_reservation(
    make_service: Make, client_for: ClientFor, eps: str
) -> None:
    """Broken variants: ε below MIN_EPSILON (error bars leave floating point), more
    digits than can be halved exactly, or a trailing newline accepted by `$`."""
    svc = make_service()
    alice = client_for(svc.port, "alice")
    assert _code(lambda: _release(alice, "e", eps)) is grpc.StatusCode.INVALID_ARGUMENT
    # nothing was reserved under the key: it still takes a valid request
    assert _payload(_release(alice, "e", "0.1"))["ledger"]["epsilon_reserved"] == "0.1"


def test_laplace_error_bar_at_the_smallest_epsilon_is_finite() -> None:
    """Broken variant: 1 - exp(-1/t), which is 0.0 once 1/t < 2^-53 (ZeroDivisionError
    after the release was charged)."""
    t = Fraction(10**17)
    sd, m = errorbars._laplace_halfwidth(t, 0.05)
    assert math.isfinite(sd) and sd > 1e16 and m > 10**17
    with pytest.raises(ZeroDivisionError):
        _ = math.sqrt(2.0) / (1.0 - math.exp(-1.0 / float(t)))


# --- idempotency keys and receipts name the query ---


def test_a_quantile_key_reused_for_another_q_is_a_conflict(
    make_service: Make, client_for: ClientFor
) -> None:
    alice = client_for(make_service().port, "alice")

    def q(value: str) -> pb.ReleaseResponse:
        return _release(
            alice,
            "q",
            mechanism=pb.NOISE_MECHANISM_UNSPECIFIED,
            quantile=pb.QuantileQuery(column="amount", quantile=value),
        )

    first = q("0.5")
    assert q("0.5").reservation_id == first.reservation_id  # a retry is the same release
    assert _code(lambda: q("0.9")) is grpc.StatusCode.ALREADY_EXISTS


def test_verify_release_shows_the_column(
    make_service: Make, client_for: ClientFor, receipt_key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    svc = make_service()
    reply = _release(client_for(svc.port, "alice"), "s", sum=pb.SumQuery(column="amount"))
    assert _payload(reply)["ledger"]["metadata"]["query.column"] == "amount"
    path = tmp_path / "receipt.json"
    path.write_bytes(reply.receipt)
    result = verify_release_receipt(
        path, trusted=trusted_keys([receipt_key.public_key()]), ledger=svc.ledger
    )
    query = next(c for c in result.checks if c.name == "query")
    assert query.ok and "sum (column=amount)" in query.detail


# --- logs, TLS, plaintext ---


def test_the_analyst_tag_is_an_hmac_under_the_service_key() -> None:
    key = tag_key_of(Ed25519PrivateKey.generate())
    tag = analyst_tag("carol", key)
    assert tag == hmac.new(key, b"carol", hashlib.sha256).hexdigest()[:12]
    assert tag != hashlib.sha256(b"carol").hexdigest()[:12]  # the broken, unkeyed variant
    assert analyst_tag("carol", tag_key_of(Ed25519PrivateKey.generate())) != tag


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:50061", True),
        ("127.8.9.10:1", True),
        ("localhost:50061", True),
        ("[::1]:50061", True),
        ("0.0.0.0:50061", False),
        ("[::]:50061", False),
        ("192.0.2.1:50061", False),
        ("example.org:443", False),
        ("localhost.example.org:1", False),
        ("dns:///127.0.0.1:1", False),
    ],
)
def test_only_loopback_addresses_may_be_plaintext(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback
    if loopback:
        check_plaintext(address, tls=False, insecure=False)
    else:
        with pytest.raises(ValueError, match="--insecure"):
            check_plaintext(address, tls=False, insecure=False)
    check_plaintext(address, tls=False, insecure=True)
    check_plaintext(address, tls=True, insecure=False)


@pytest.mark.parametrize(
    ("cert", "key", "ca", "mtls", "error"),
    [
        (True, False, False, False, "go together"),
        (False, True, False, False, "go together"),
        (False, False, True, True, "--mtls needs"),
        (True, True, False, True, "--mtls needs"),
        (False, False, True, False, "only used with --mtls"),
        (True, True, True, False, "only used with --mtls"),
        (True, True, True, True, None),
        (True, True, False, False, None),
        (False, False, False, False, None),
    ],
)
def test_tls_options_must_make_a_whole(
    cert: bool, key: bool, ca: bool, mtls: bool, error: str | None
) -> None:
    def path(given: bool) -> Path | None:
        return Path("x.pem") if given else None

    if error is None:
        check_tls(path(cert), path(key), path(ca), mtls=mtls)
    else:
        with pytest.raises(ValueError, match=error):
            check_tls(path(cert), path(key), path(ca), mtls=mtls)


def test_a_collector_token_is_refused_by_the_release_service(
    make_service: Make, client_for: ClientFor
) -> None:
    """Broken variant: one MAC domain for both audiences (a device token, minted with a
    secret the operator reused, would authenticate an analyst)."""
    from fedldp.collector.auth import (
        COLLECTOR_AUDIENCE,
        RELEASE_SERVICE_AUDIENCE,
        TokenAuthority,
        bearer_metadata,
    )

    from tests.aggregator.service.conftest import NOW, SECRET

    svc = make_service()
    alice = client_for(svc.port, "alice")
    device = TokenAuthority(SECRET, audience=COLLECTOR_AUDIENCE).mint("alice", expires_at=NOW + 60)
    alice.metadata = bearer_metadata(device)
    assert _code(lambda: _release(alice, "t")) is grpc.StatusCode.UNAUTHENTICATED
    analyst = TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE)
    assert analyst.mint("alice", expires_at=NOW + 60) != device
    with pytest.raises(ValueError, match="audience"):
        TokenAuthority(SECRET, audience="anything")


def test_train_service_refuses_plaintext_off_loopback_unless_insecure() -> None:
    """`fedldp train --service` shares the release client's connection options: a
    non-loopback address without --tls-ca is a usage error before any token is read."""
    from click.testing import CliRunner

    from fedldp.cli import main

    refused = CliRunner().invoke(main, ["train", "status", "job-1", "--service", "192.0.2.2:1"])
    assert refused.exit_code == 2 and "--tls-ca" in refused.output
    listed = CliRunner().invoke(main, ["train", "--help"])
    assert "--insecure" in listed.output
