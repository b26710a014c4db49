"""What goes on the wire depends only on the randomizer's output and the policy.

Two devices record *different* true values; seeded generators force their
randomized outputs to coincide. The bytes the devices send to the collector,
captured by a TCP relay and split into HTTP/2 frames (RFC 9113, Section 4.1),
must then be identical on every request stream, frame for frame (HEADERS with
the method, authority, user agent and token; DATA with the request; the
stream's flow control), except the 16-byte report id (the coarse time is equal
here because both use the same clock).

Connection-level frames (stream 0) are compared by kind only: they are
SETTINGS, WINDOW_UPDATE, PING and GOAWAY, whose placement between request
frames follows the transport's read timing and whose PING payload is the
*server's* opaque data echoed back (RFC 9113, Sections 6.5, 6.7-6.9); the test
checks no other kind appears there. The control case shows the comparison is
sharp: a different output does show up in the bytes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fedldp.client.mechanisms import CategoryOutput, Mechanism
from sdk_testkit import LABELS, Deployment, Relay, http2_frames, ledger_rows, running_deployment


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def _seed_for(mechanism: Mechanism, value: int, output: CategoryOutput) -> int:  # type: ignore[type-arg]
    return next(
        s for s in range(10_000) if mechanism.perturb(value, rng=random.Random(s)) == output
    )


def _capture(
    deployment: Deployment,
    relay: Relay,
    token: str,
    state_dir: Path,
    label: str,
    seed: int,
    now: int,
) -> tuple[bytes, bytes]:
    """Everything one fresh device sends while fetching policies, recording and flushing."""
    before = relay.connections
    with deployment.client(
        relay.address, state_dir, rng=random.Random(seed), token=token, clock=lambda: now
    ) as client:
        report_id = client.record("browser.homepage", label).report_id
        assert client.flush(timeout=10).acknowledged == 1
    time.sleep(0.2)  # let the relay copy the last frames of the closed channel
    assert relay.connections == before + 1  # one connection per device, its own
    return bytes(relay.sent[before]), report_id


#: HTTP/2 frame types allowed on the connection stream (RFC 9113, Section 6).
CONNECTION_CONTROL = {4: "SETTINGS", 6: "PING", 7: "GOAWAY", 8: "WINDOW_UPDATE"}


def _mask(stream: bytes, report_id: bytes) -> dict[int, list[tuple[int, int, bytes]]]:
    """Frames per request stream, report id zeroed (see the module docstring)."""
    assert stream.count(report_id) == 1
    masked = stream.replace(report_id, b"\x00" * len(report_id))
    streams: dict[int, list[tuple[int, int, bytes]]] = {}
    for kind, flags, stream_id, payload in http2_frames(masked):
        if stream_id == 0:
            assert kind in CONNECTION_CONTROL, f"unexpected connection frame type {kind}"
        else:
            streams.setdefault(stream_id, []).append((kind, flags, payload))
    assert len(streams) == 2  # GetPolicies, then Submit
    return streams


def test_equal_outputs_give_equal_bytes_apart_from_report_id(
    deployment: Deployment, tmp_path: Path
) -> None:
    deployment.categorical(epsilon="1", epsilon_cap="10")
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "probe") as probe:
        (policy,) = probe.policies()
    target = CategoryOutput(2)
    seed_a = _seed_for(policy.mechanism, 0, target)  # LABELS[0] randomized to index 2
    seed_b = _seed_for(policy.mechanism, 1, target)  # LABELS[1] randomized to index 2
    now = int(time.time())

    token = deployment.token()
    relay = Relay(("127.0.0.1", collector.port))  # one relay: one :authority for all
    try:
        sent_a, id_a = _capture(deployment, relay, token, tmp_path / "a", LABELS[0], seed_a, now)
        sent_b, id_b = _capture(deployment, relay, token, tmp_path / "b", LABELS[1], seed_b, now)
        # Control: a different output (same true value as b) is visible in the bytes.
        seed_c = _seed_for(policy.mechanism, 1, CategoryOutput(3))
        sent_c, id_c = _capture(deployment, relay, token, tmp_path / "c", LABELS[1], seed_c, now)
    finally:
        relay.close()
    assert id_a != id_b
    assert _mask(sent_a, id_a) == _mask(sent_b, id_b)
    assert _mask(sent_c, id_c) != _mask(sent_b, id_b)
    assert len(ledger_rows(collector)) == 3
