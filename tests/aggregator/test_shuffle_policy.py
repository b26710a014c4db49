"""A shuffle-model policy's [shuffle] section (authoring, validation, the verified policy) and
the shuffler's pull into its spool (idempotent; nothing after a release)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fedldp.aggregator.shuffler import (
    ShuffleSpool,
    pull_window,
    release,
    window_batch,
)
from fedldp.authoring import load_policy_toml
from fedldp.client.policy import InvalidPolicyError
from fedldp.v1 import policy_pb2

KEY = bytes(range(32))
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "policies" / "example-policy.toml"


def _policy(tmp_path: Path, section: str) -> policy_pb2.Policy:
    """The shipped example policy with `section` appended, loaded as an author would."""
    path = tmp_path / "shuffled.toml"
    path.write_text(EXAMPLE.read_text(encoding="utf-8") + "\n" + section, encoding="utf-8")
    return load_policy_toml(path)


def test_shuffle_section_is_signed_into_the_policy(tmp_path: Path) -> None:
    """The key (hex in TOML) and min_batch land in Policy.shuffle; without the section,
    the policy has none."""
    policy = _policy(tmp_path, f'[shuffle]\nanalyzer_public_key = "{KEY.hex()}"\nmin_batch = 50\n')
    assert policy.HasField("shuffle")
    assert (policy.shuffle.analyzer_public_key, policy.shuffle.min_batch) == (KEY, 50)
    assert not load_policy_toml(EXAMPLE).HasField("shuffle")


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ('analyzer_public_key = "zz"\nmin_batch = 5', "not hex"),
        (f'analyzer_public_key = "{KEY[:31].hex()}"\nmin_batch = 5', "32-byte"),
        (f'analyzer_public_key = "{KEY.hex()}"\nmin_batch = 1', "min_batch must be at least 2"),
        (f'analyzer_public_key = "{KEY.hex()}"\nmin_batch = 5\nx = 1', "unknown keys"),
    ],
)
def test_bad_shuffle_sections_are_refused(tmp_path: Path, section: str, problem: str) -> None:
    """Each bad section is named; nothing is signed."""
    with pytest.raises(InvalidPolicyError) as info:
        _policy(tmp_path, "[shuffle]\n" + section + "\n")
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
