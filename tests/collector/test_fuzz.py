"""Property-based fuzzing of Submit, GetPolicies and GetBudget through real gRPC.

Structured requests (every field drawn from valid, boundary and random values),
raw bytes, and byte-level mutations of valid requests go to one running
collector (the asyncio server, a SQLite ledger). Every answer must be OK with
one outcome per report echoing its id, or a request-level status of the
contract (INVALID_ARGUMENT, RESOURCE_EXHAUSTED): never INTERNAL or UNKNOWN.
At the end the ledger holds exactly the reports acknowledged ACCEPTED, each
charged once (reconcile clean).

The CI slice runs `CI_EXAMPLES` cases per property (a few thousand in all,
derandomized: the same cases every run). `FEDLDP_FUZZ_NIGHTLY=1` runs
`NIGHTLY_EXAMPLES` per property (more than 100,000 in all) with fresh random
draws; `FEDLDP_FUZZ_EXAMPLES=N` sets the count per property.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from collector_testkit import Deployment, coarse, memory_folder
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Per property; five properties below (CI: 3,000 cases; nightly: 130,000).
CI_EXAMPLES = 600
NIGHTLY_EXAMPLES = 26_000
NIGHTLY = os.environ.get("FEDLDP_FUZZ_NIGHTLY") == "1"
EXAMPLES = int(os.environ.get("FEDLDP_FUZZ_EXAMPLES", NIGHTLY_EXAMPLES if NIGHTLY else CI_EXAMPLES))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not NIGHTLY,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# The nightly run is long: no per-test timeout then (pyproject's applies in CI).
pytestmark = [pytest.mark.timeout(0)] if NIGHTLY else []
ALLOWED_ERRORS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
U32, U64, I64 = 2**32 - 1, 2**64 - 1, 2**63 - 1


class Fuzzed:
    """The collector under fuzzing, its raw-bytes stubs, and what was acknowledged."""

    def __init__(self, running: RunningCollector, deployment: Deployment, now: int) -> None:
        self.running = running
        self.deployment = deployment
        self.now = now
        self.policies: list[VerifiedPolicy] = [deployment.verified(e) for e in deployment.envelopes]
        self.channel = grpc.insecure_channel(running.address)
        self.auth = bearer_metadata(deployment.token("fuzzer"))
        self.accepted: set[bytes] = set()
        self.reports = st.lists(_report(self.policies, now), max_size=6)

    def call(self, method: str, request: bytes, *, auth: bool = True) -> bytes | None:
        """The response bytes, or None for an allowed request-level refusal."""
        stub = self.channel.unary_unary(
            f"/fedldp.v1.Collector/{method}", request_serializer=None, response_deserializer=None
        )
        try:
            return stub(request, metadata=self.auth if auth else (), timeout=30)  # type: ignore[no-any-return]
        except grpc.RpcError as exc:
            assert exc.code() in ALLOWED_ERRORS, (exc.code(), exc.details())
            return None

    def submit(self, request: bytes) -> None:
        """Submit raw bytes; check the answer's shape and remember what was accepted."""
        answer = self.call("Submit", request)
        if answer is None:
            return
        sent = pb.SubmitRequest.FromString(request)  # OK only for a parseable request
        outcomes = pb.SubmitResponse.FromString(answer).outcomes
        assert [o.report_id for o in outcomes] == [r.report_id for r in sent.reports]
        for report, outcome in zip(sent.reports, outcomes, strict=True):
            assert outcome.outcome != pb.OUTCOME_UNSPECIFIED
            if outcome.outcome == pb.OUTCOME_ACCEPTED:
                assert report.report_id not in self.accepted  # never accepted twice
                self.accepted.add(report.report_id)
            if outcome.outcome == pb.OUTCOME_INVALID:
                assert outcome.reason != pb.REJECT_REASON_UNSPECIFIED


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, now: int) -> Iterator[Fuzzed]:
    d = Deployment.create(now=now)
    d.add_categorical("cat", epsilon="0.001", epsilon_cap="1000000")
    d.add_categorical("oue", labels=("a", "b", "c", "d", "e"), mechanism="oue", epsilon="0.001")
    d.add_numeric("num", epsilon="0.001", epsilon_cap="1000000")
    d.add_categorical("olh", mechanism="olh", epsilon="0.001", epsilon_cap="1000000")
    # The ledger on tmpfs when there is one: its fsyncs cost nothing there, and
    # durability is not what this module tests (test_faults.py does).
    shm = memory_folder()
    base = (
        Path(tempfile.mkdtemp(prefix="fedldp-fuzz-", dir=shm))
        if shm
        else tmp_path_factory.mktemp("fuzz")
    )
    config = d.config(
        f"sqlite:///{base / 'ledger.db'}", group_commit_delay_ms=0.0, max_message_bytes=65536
    )
    running = start_collector(config, registry=d.registry())
    state = Fuzzed(running, d, now)
    try:
        yield state
        # The ledger holds exactly what was acknowledged ACCEPTED, charged once.
        led = running.ledger
        stored = sum(led.report_count(p.policy_id, p.version) for p in state.policies)
        assert stored == len(state.accepted)
        assert all(led.has_report(rid) for rid in state.accepted)
        assert led.reconcile() == []
    finally:
        state.channel.close()
        running.stop(1.0)
        shutil.rmtree(base, ignore_errors=True)


# -- strategies --


def _payload() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.just({}),
        st.builds(lambda i: {"category": pb.CategoryPayload(index=i)}, st.integers(0, U32)),
        st.builds(
            lambda b, n: {"bits": pb.BitVectorPayload(bits=b, length=n)},
            st.binary(max_size=4),
            st.one_of(st.integers(0, 40), st.integers(0, U32)),
        ),
        st.builds(
            lambda s, v: {"hashed": pb.HashedPayload(seed=s, value=v)},
            st.integers(0, U64),
            st.integers(0, U32),
        ),
        st.builds(
            lambda v: {"numeric": pb.NumericPayload(value=v)},
            st.one_of(st.floats(-2, 3), st.floats(allow_nan=True, allow_infinity=True)),
        ),
        st.builds(
            lambda i, b: {"index_bit": pb.IndexBitPayload(index=i, bit=b)},
            st.integers(0, U32),
            st.booleans(),
        ),
    )


PAYLOAD = _payload()
REPORT_ID = st.one_of(st.just(b""), st.binary(min_size=16, max_size=16), st.binary(max_size=24))


def _report(policies: list[VerifiedPolicy], now: int) -> st.SearchStrategy[pb.Report]:
    """A report naming one of `policies`, each field valid, boundary or random. The
    strategies are built once here, not inside the draw: a strategy built per draw is
    validated and labelled again every time (most of an example's cost)."""
    hour = coarse(now)
    coarse_time = st.one_of(
        st.sampled_from([hour, hour - 3600, hour + 3600, hour + 7200, hour - 31 * 86400]),
        st.integers(-I64 - 1, I64),
    )
    known = st.sampled_from(
        [
            (
                st.one_of(st.just(p.policy_id), st.text(max_size=12)),
                st.one_of(st.just(p.version), st.integers(0, U64)),
                st.one_of(st.just(p.digest), st.binary(max_size=40)),
            )
            for p in policies
        ]
    )

    @st.composite
    def report(draw: st.DrawFn) -> pb.Report:
        policy_id, version, digest = draw(known)
        return pb.Report(
            report_id=draw(REPORT_ID),
            policy_id=draw(policy_id),
            policy_version=draw(version),
            policy_digest=draw(digest),
            coarse_time=draw(coarse_time),
            **draw(PAYLOAD),
        )

    return report()


# -- properties --


@FUZZ
@given(data=st.data())
def test_structured_submit(fuzzed: Fuzzed, data: st.DataObject) -> None:
    reports = data.draw(fuzzed.reports)
    repeat = bool(reports) and data.draw(st.booleans())
    if repeat:
        reports.append(reports[0])  # an id repeated in the request
    fuzzed.submit(pb.SubmitRequest(reports=reports).SerializeToString())


@FUZZ
@given(raw=st.binary(max_size=2048))
def test_raw_bytes_submit(fuzzed: Fuzzed, raw: bytes) -> None:
    fuzzed.submit(raw)


EDIT_KIND = st.sampled_from(["flip", "insert", "delete", "truncate"])


@FUZZ
@given(data=st.data())
def test_mutated_valid_submit(fuzzed: Fuzzed, data: st.DataObject) -> None:
    """A valid request with bytes flipped, inserted, deleted or truncated."""
    policy = fuzzed.policies[0]
    report = pb.Report(
        report_id=secrets.token_bytes(16),
        policy_id=policy.policy_id,
        policy_version=policy.version,
        policy_digest=policy.digest,
        coarse_time=coarse(fuzzed.now),
        category=pb.CategoryPayload(index=data.draw(st.integers(0, 3))),
    )
    blob = bytearray(pb.SubmitRequest(reports=[report] * 1).SerializeToString())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(blob)))
        kind = data.draw(EDIT_KIND)
        if kind == "flip" and at < len(blob):
            blob[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "insert":
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del blob[at : at + data.draw(st.integers(1, 8))]
        else:
            del blob[at:]
    fuzzed.submit(bytes(blob))


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=512),
        st.builds(
            lambda m, v: pb.GetPoliciesRequest(metric=m, known_root_version=v).SerializeToString(),
            st.one_of(st.just(""), st.just("metric.cat"), st.text(max_size=20)),
            st.integers(0, U64),
        ),
    )
)
def test_get_policies(fuzzed: Fuzzed, data: bytes) -> None:
    answer = fuzzed.call("GetPolicies", data)
    if answer is not None:
        response = pb.GetPoliciesResponse.FromString(answer)
        request = pb.GetPoliciesRequest.FromString(data)
        assert all(int(request.known_root_version) < 2 for _ in response.roots)
        assert len(response.policies) <= len(fuzzed.policies)


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=256),
        st.builds(
            lambda p: pb.GetBudgetRequest(policy_id=p).SerializeToString(),
            st.one_of(st.just("cat"), st.text(max_size=20)),
        ),
    )
)
def test_get_budget(fuzzed: Fuzzed, data: bytes) -> None:
    answer = fuzzed.call("GetBudget", data)
    if answer is not None:
        for budget in pb.GetBudgetResponse.FromString(answer).budgets:
            spent, remaining = float(budget.epsilon_spent), float(budget.epsilon_remaining)
            assert math.isfinite(spent) and spent >= 0 and remaining >= 0
