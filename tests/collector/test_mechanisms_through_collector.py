"""Every registered mechanism through the real collector: its outputs are accepted,
charged and folded into the stored statistic exactly as a recompute from the raw
rows; an output outside its domain is refused with the mechanism's own reason."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
from collector_testkit import Deployment, coarse, make_report
from fedldp.aggregator.reports import merge_partials, partials_from_ledger
from fedldp.client.mechanisms import (
    BitVectorOutput,
    IndexBitsOutput,
    MultiOutput,
    NumericOutput,
    SketchBitOutput,
    SketchRowOutput,
    registered_ids,
)
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc, policy_pb2

NUMERIC = {"duchi", "hybrid", "piecewise", "sw", "dbitflip"}
MEMOIZED = {"rappor-grr", "rappor-oue", "rappor-sue", "loloha", "dbitflip"}
SKETCHES = {"cms", "hcms"}
OPEN = {"pem", *SKETCHES}
LABELS = [f"v{i}" for i in range(8)]
MULTI = {"multi-split", "multi-sample"}
ATTRIBUTES: list[dict[str, Any]] = [
    {"name": "kind", "values": LABELS, "mechanism": "oue"},
    {"name": "level", "lo": "-1", "hi": "1", "mechanism": "hybrid"},
]


def _value(mechanism: str, rng: random.Random) -> Any:
    if mechanism in MULTI:
        return (rng.randrange(len(LABELS)), rng.uniform(-1, 1))
    if mechanism in OPEN:
        return rng.choice(["new", "words", "😀"])
    return rng.uniform(-1, 1) if mechanism in NUMERIC else rng.randrange(len(LABELS))


@pytest.fixture(scope="module")
def every_mechanism(now: int) -> Deployment:
    d = Deployment.create(now=now)
    for m in registered_ids():
        if m == "dbitflip":
            params = {"epsilon_permanent": "2", "buckets": "8", "d": "3"}
            d.add_numeric(f"p-{m}", mechanism=m, lo="-1", hi="1", epsilon_cap="20", params=params)
        elif m in NUMERIC:
            d.add_numeric(f"p-{m}", mechanism=m, lo="-1", hi="1")
        elif m in OPEN:
            d.add_open(
                f"p-{m}",
                mechanism=m,
                max_bytes=32,
                epsilon="2",
                epsilon_cap="8",
                params={"rows": "8", "columns": "64"} if m in SKETCHES else None,
            )
        elif m in MULTI:
            d.add_multi(f"p-{m}", mechanism=m, attributes=ATTRIBUTES)
        elif m.startswith("rappor-") or m == "loloha":
            d.add_categorical(
                f"p-{m}",
                mechanism=m,
                labels=LABELS,
                params={"epsilon_permanent": "2"},
                memo_charging=policy_pb2.MEMO_CHARGING_INSTANTANEOUS,
                epsilon_cap="1000",  # three reports at the sound memoized charge
            )
        else:
            d.add_categorical(f"p-{m}", mechanism=m, labels=LABELS)
    return d


@pytest.fixture(scope="module")
def running(
    every_mechanism: Deployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningCollector]:
    path: Path = tmp_path_factory.mktemp("mech") / "ledger.db"
    r = start_collector(
        every_mechanism.config(f"sqlite:///{path}"), registry=every_mechanism.registry()
    )
    yield r
    r.stop(1.0)


@pytest.mark.parametrize("mechanism", registered_ids())
def test_outputs_are_charged_and_aggregated(
    every_mechanism: Deployment, running: RunningCollector, now: int, mechanism: str
) -> None:
    envelope = every_mechanism.envelopes[registered_ids().index(mechanism)]
    policy = every_mechanism.verified(envelope)
    rng = random.Random(7)
    values = [_value(mechanism, rng) for _ in range(3)]
    outputs = []
    for v in values:
        if mechanism in MEMOIZED:
            memoized: Any = policy.mechanism
            outputs.append(memoized.perturb(v, rng=rng, memo=memoized.new_memo()))
        else:
            outputs.append(policy.mechanism.perturb(v, rng=rng))
    reports = [make_report(policy, o, coarse_time=coarse(now)) for o in outputs]
    subject = f"user-{mechanism}"
    with grpc.insecure_channel(running.address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        response = stub.Submit(
            pb.SubmitRequest(reports=reports),
            metadata=bearer_metadata(every_mechanism.token(subject)),
        )
    assert [o.outcome for o in response.outcomes] == [pb.OUTCOME_ACCEPTED] * 3
    window = policy.window_start(now)
    ledger = running.ledger
    assert ledger.spent(subject, policy.policy_id, window) == 3 * policy.charge
    parts = ledger.statistics(policy.policy_id, policy.version, window)
    assert sum(p.n for p in parts) == 3
    mech = policy.mechanism
    # Each part's JSON and, for a mechanism that keeps chunk rows (pem), its chunks.
    merged = merge_partials(mech, partials_from_ledger(ledger, policy, window)).statistic
    assert mech.statistic_to_json(merged) == mech.statistic_to_json(
        ledger.recompute_statistics(policy, window)
    )
    assert ledger.reconcile() == []


def _bad_output(mechanism: str, output: object) -> tuple[object, int]:
    """An output of the right kind but outside the domain, and the expected reason."""
    if isinstance(output, MultiOutput):  # split without its last part; sample with two
        parts = output.parts[:-1] if mechanism == "multi-split" else output.parts * 2
        return MultiOutput(parts), pb.REJECT_REASON_WRONG_LENGTH
    if isinstance(output, IndexBitsOutput):  # one index too many
        return dataclasses.replace(
            output, indices=(*output.indices, 7)
        ), pb.REJECT_REASON_WRONG_LENGTH
    if isinstance(output, BitVectorOutput):
        return dataclasses.replace(output, length=output.length + 1), pb.REJECT_REASON_WRONG_LENGTH
    if isinstance(output, NumericOutput):
        return NumericOutput(1e9), pb.REJECT_REASON_OUT_OF_DOMAIN
    if isinstance(output, SketchRowOutput):
        return dataclasses.replace(output, length=output.length * 2), pb.REJECT_REASON_WRONG_LENGTH
    if isinstance(output, SketchBitOutput):
        return dataclasses.replace(output, column=64), pb.REJECT_REASON_OUT_OF_DOMAIN
    field = "index" if hasattr(output, "index") else "value"
    return dataclasses.replace(output, **{field: 10**6}), pb.REJECT_REASON_OUT_OF_DOMAIN  # type: ignore[type-var]


@pytest.mark.parametrize("mechanism", registered_ids())
def test_out_of_domain_outputs_are_refused(
    every_mechanism: Deployment, running: RunningCollector, now: int, mechanism: str
) -> None:
    envelope = every_mechanism.envelopes[registered_ids().index(mechanism)]
    policy = every_mechanism.verified(envelope)
    rng = random.Random(3)
    value = _value(mechanism, rng)
    if mechanism in MEMOIZED:
        memoized: Any = policy.mechanism
        good = memoized.perturb(value, rng=rng, memo=memoized.new_memo())
    else:
        good = policy.mechanism.perturb(value, rng=rng)
    bad, reason = _bad_output(mechanism, good)
    report = make_report(policy, bad, coarse_time=coarse(now))  # type: ignore[arg-type]
    subject = f"bad-{mechanism}"
    with grpc.insecure_channel(running.address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        response = stub.Submit(
            pb.SubmitRequest(reports=[report]),
            metadata=bearer_metadata(every_mechanism.token(subject)),
        )
    outcome = response.outcomes[0]
    assert (outcome.outcome, outcome.reason) == (pb.OUTCOME_INVALID, reason)
    assert running.ledger.spent(subject, policy.policy_id, policy.window_start(now)) == Decimal(0)
    assert not running.ledger.has_report(report.report_id)
