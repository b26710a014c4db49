"""ATTACK (audit atk2): `client.record` on an open-domain (pem) metric refuses every
value outside the domain (empty, too long, NUL, lone surrogate, not a str) with
BAD_VALUE, changes nothing (no report in the outbox, no device budget spent),
and never echoes the value in the error, the stored event or a log line.
Real SDK, real collector, real SQLite state file."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.client.sdk import BadValueError
from sdk_testkit import AUDIENCE, Deployment, running_deployment

SECRET = "zqx"  # a marker inside every refused value


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        policy = d.authority.open_policy(
            policy_id="words",
            metric="browser.new_word",
            max_bytes=8,
            epsilon="4",
            epsilon_cap="4",
            window_seconds=86400,
            now=d.now - 60,
            min_reports=1,
            audience=(AUDIENCE,),
        )
        d.envelopes.append(d.authority.sign(policy))
        yield d


BAD_VALUES: list[object] = [
    "",
    SECRET * 3,  # 9 bytes > 8
    SECRET + "\x00",
    SECRET + "\ud800",
    SECRET.encode(),
    bytearray(SECRET.encode()),
    [SECRET],
    None,
    3,
]


def test_bad_open_domain_values_change_nothing_and_are_not_echoed(
    deployment: Deployment, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    collector = deployment.start()
    caplog.set_level(logging.DEBUG)
    with deployment.client(collector.address, tmp_path / "d") as c:
        for value in BAD_VALUES:
            with pytest.raises(BadValueError) as info:
                c.record("browser.new_word", value)  # type: ignore[arg-type]
            assert info.value.reason == "BAD_VALUE"
            assert SECRET not in str(info.value) and SECRET not in repr(info.value)
        assert c.pending() == 0
        assert c.counters()["record_refused_bad_value"] == len(BAD_VALUES)
        for event in c.events():
            assert SECRET not in repr(event)
        assert SECRET not in caplog.text
        # A good value is then accepted and charged once: nothing was spent before.
        result = c.record("browser.new_word", SECRET)
        assert result.epsilon_spent == Decimal("4")
        assert c.pending() == 1
