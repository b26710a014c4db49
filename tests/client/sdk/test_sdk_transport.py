"""Transport pieces: full-jitter backoff, retry hints, raw SubmitRequest bytes, credentials."""

from __future__ import annotations

import random

import pytest
from fedldp.client.transport import (
    Backoff,
    Credentials,
    retry_after_seconds,
    submit_request_bytes,
)
from fedldp.v1 import collector_pb2


def test_ceiling_doubles_to_the_cap() -> None:
    b = Backoff(base_seconds=0.5, max_seconds=5.0)
    assert [b.ceiling(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.ceiling(10_000) == 5.0  # no overflow


def test_full_jitter_spans_zero_to_ceiling() -> None:
    b = Backoff(base_seconds=1.0, max_seconds=8.0)
    rng = random.Random(7)
    draws = [b.delay(3, rng=rng) for _ in range(2000)]
    assert all(0.0 <= d <= 4.0 for d in draws)
    # Full jitter, not "equal jitter": a quarter of the draws fall below ceiling/4
    # (binomial(2000, 1/4) stays within [400, 600] except with probability < 1e-6).
    assert 400 <= sum(d < 1.0 for d in draws) <= 600


def test_retry_hint_is_a_floor_and_capped() -> None:
    b = Backoff(base_seconds=0.1, max_seconds=1.0, max_hint_seconds=30.0)
    rng = random.Random(1)
    assert all(b.delay(1, rng=rng, retry_after=2.5) == 2.5 for _ in range(50))
    assert b.delay(1, rng=rng, retry_after=10_000.0) == 30.0


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((("retry-after-ms", "1500"),), 1.5),
        ((("Retry-After-Ms", b"20"),), 0.02),
        ((("retry-after-ms", "-5"),), None),
        ((("retry-after-ms", "1e3"),), None),
        ((("other", "5"),), None),
        (None, None),
    ],
)
def test_retry_after_parsing(metadata: object, expected: float | None) -> None:
    assert retry_after_seconds(metadata) == expected  # type: ignore[arg-type]


def test_backoff_validation() -> None:
    with pytest.raises(ValueError):
        Backoff(base_seconds=0)
    with pytest.raises(ValueError):
        Backoff(base_seconds=2, max_seconds=1)


def test_submit_request_bytes_embed_reports_unchanged() -> None:
    reports = []
    for size in (0, 1, 200, 70_000):  # varint lengths of 1, 2 and 3 bytes
        r = collector_pb2.Report(report_id=bytes(16), policy_id="p" * size, policy_version=1)
        r.category.index = 3
        reports.append(r.SerializeToString())
    request = collector_pb2.SubmitRequest.FromString(submit_request_bytes(reports))
    assert [r.SerializeToString() for r in request.reports] == reports
    assert submit_request_bytes([]) == b""


def test_credentials() -> None:
    c = Credentials.insecure_bearer("s3cret-token")
    assert c.metadata() == (("authorization", "Bearer s3cret-token"),)
    assert "s3cret" not in repr(c)
    assert Credentials().metadata() == ()
    with pytest.raises(ValueError, match="single-line"):
        Credentials.bearer("a\nb")
    with pytest.raises(ValueError, match="both"):
        Credentials(private_key=b"k")
    with pytest.raises(ValueError, match="insecure"):
        Credentials(insecure=True, root_certificates=b"pem")
