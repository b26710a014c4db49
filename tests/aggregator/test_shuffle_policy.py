"""A shuffle-model policy's [shuffle] section (authoring, validation, the verified policy) and
the shuffler's pull into its spool (idempotent; nothing after a release)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from fedldp.aggregator.shuffler import (
    ShuffleSpool,
    pull_window,
    release,
    window_batch,
)
from fedldp.authoring import policy_from_dict
from fedldp.client.policy import InvalidPolicyError

KEY = bytes(range(32))

BASE: dict[str, Any] = {
    "policy_id": "browser-homepage",
    "version": 1,
    "purpose": "start page choice",
    "audience": ["prod-eu"],
    "not_before": 1_796_083_200,
    "expires_at": 1_796_083_200 + 30 * 86400,
    "min_reports_for_release": 100,
    "metric": {"name": "browser.homepage", "values": ["a", "b", "c"]},
    "mechanism": {"id": "grr", "epsilon": "1"},
    "budget": {"epsilon_cap": "4", "window": "1d"},
    "shuffle": {"analyzer_public_key": KEY.hex(), "min_batch": 50},
}


def _shuffle(**section: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["shuffle"] = section
    return data


def test_shuffle_section_is_signed_into_the_policy() -> None:
    """The key (hex in TOML) and min_batch land in Policy.shuffle; without the section,
    the policy has none."""
    policy = policy_from_dict(BASE)
    assert policy.HasField("shuffle")
    assert (policy.shuffle.analyzer_public_key, policy.shuffle.min_batch) == (KEY, 50)
    plain = copy.deepcopy(BASE)
    del plain["shuffle"]
    assert not policy_from_dict(plain).HasField("shuffle")


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"analyzer_public_key": "zz", "min_batch": 5}, "not hex"),
        ({"analyzer_public_key": KEY[:31].hex(), "min_batch": 5}, "32-byte"),
        ({"analyzer_public_key": KEY.hex(), "min_batch": 1}, "min_batch must be at least 2"),
        ({"analyzer_public_key": KEY.hex(), "min_batch": 5, "x": 1}, "unknown keys"),
    ],
)
def test_bad_shuffle_sections_are_refused(section: dict[str, Any], problem: str) -> None:
    """Each bad section is named; nothing is signed."""
    with pytest.raises(InvalidPolicyError) as info:
        policy_from_dict(_shuffle(**section))
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_pull_is_idempotent_and_stops_at_release(tmp_path: Path) -> None:
    """Pulling twice adds nothing twice; what is new is added; a released batch takes none."""
    spool = ShuffleSpool(tmp_path / "spool.db")
    first = {1: [b"a" * 60, b"b" * 60], 2: [b"c" * 60]}
    pulled = pull_window(first, spool, "p", 3600)
    assert [(p.batch, p.added, p.released) for p in pulled] == [
        ("p.v1.3600", 2, False),
        ("p.v2.3600", 1, False),
    ]
    assert [p.added for p in pull_window(first, spool, "p", 3600)] == [0, 0]
    more = {1: [b"a" * 60, b"b" * 60, b"d" * 60]}
    assert [p.added for p in pull_window(more, spool, "p", 3600)] == [1]
    assert spool.pending(window_batch("p", 1, 3600)) == 3
    (tmp_path / "out").mkdir()
    release(spool, "p.v1.3600", tmp_path / "out", min_batch=2)
    (after,) = pull_window({1: [b"e" * 60]}, spool, "p", 3600)
    assert (after.added, after.released) == (0, True)
