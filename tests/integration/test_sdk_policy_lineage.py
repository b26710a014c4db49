"""The device guard keeps one budget per policy id across versions: a version that
changes the budget window is refused, with the reason, once the device has spent
under the old window (its guard keys spend by (policy id, window start), as the
collector's ledger does)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fedldp.client import policy_cache
from fedldp.client.sdk import NoPolicyError
from sdk_testkit import LABELS, Deployment, running_deployment


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def test_device_refuses_a_version_that_changes_the_window_it_spent_under(
    deployment: Deployment, tmp_path: Path
) -> None:
    deployment.categorical(epsilon="1", epsilon_cap="2", window_seconds=86400, version=1)
    first = deployment.start(name="first")
    with deployment.client(first.address, tmp_path / "d") as c:
        assert c.record("browser.homepage", LABELS[0]).policy_version == 1
        assert c.flush(timeout=10).acknowledged == 1
    # v2 asks hourly windows (cap 2 per hour). A collector that has not seen v1 (a
    # fresh ledger) activates it; the device, which spent under daily windows, does not.
    hourly = deployment.categorical(epsilon="1", epsilon_cap="2", window_seconds=3600, version=2)
    second = deployment.start([hourly], name="second")
    with deployment.client(second.address, tmp_path / "d") as c:
        reason = c.refresh_policies().rejected["homepage"]
        assert c.policies() == []
        assert "86400 s window" in reason and "3600 s budget window" in reason
        assert "window cannot change" in reason
        with pytest.raises(NoPolicyError, match="window cannot change") as info:
            c.record("browser.homepage", LABELS[1])
        assert info.value.reason == "POLICY_REJECTED"
        assert c.pending() == 0  # nothing randomized or charged
        rejected = [e for e in c.events() if e.kind == "policy_rejected"]
        assert rejected and rejected[-1].reason == "WindowChangeError"
        assert rejected[-1].policy_id == "homepage"
    # The refusal comes from this device's spend history: a device that never spent
    # under the policy id accepts v2 (no window to keep).
    with deployment.client(second.address, tmp_path / "fresh") as fresh:
        assert [p.version for p in fresh.policies()] == [2]


def test_broken_variant_without_the_window_check_spends_three_in_an_hour(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the check prevents: a device that takes the hourly version records 2 more
    in the hour in which it already spent 1 under the daily version (cap 2)."""
    monkeypatch.setattr(policy_cache, "_window_change", lambda conn, policy: None)
    deployment.categorical(epsilon="1", epsilon_cap="2", window_seconds=86400, version=1)
    first = deployment.start(name="first")
    with deployment.client(first.address, tmp_path / "d") as c:
        c.record("browser.homepage", LABELS[0])
    hourly = deployment.categorical(epsilon="1", epsilon_cap="2", window_seconds=3600, version=2)
    second = deployment.start([hourly], name="second")
    with deployment.client(second.address, tmp_path / "d") as c:
        c.refresh_policies()
        spent = [c.record("browser.homepage", label).epsilon_charged for label in LABELS[1:3]]
    assert 1 + sum(spent) == 3
