"""`fedldp policy sign --previous`: a next version keeps its policy id's metric name and
budget window (versions share one budget per user; docs/policies.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from fedldp.authoring import load_policy_toml, successor_problems

from fedldp.cli_keys import keys
from fedldp.cli_policy import policy

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "policies" / "example-policy.toml"


def _variant(tmp_path: Path, filename: str, **changes: str) -> Path:
    """The example policy with whole lines replaced (`key = value` by key)."""
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    for key, value in changes.items():
        lines = [f"{key} = {value}" if line.startswith(f"{key} ") else line for line in lines]
    path = tmp_path / filename
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def key(tmp_path: Path) -> Path:
    result = CliRunner().invoke(keys, ["generate", "--out", str(tmp_path), "--name", "policy"])
    assert result.exit_code == 0, result.output
    return tmp_path / "policy.key"


def _sign(source: Path, key: Path, out: Path, *extra: str) -> tuple[int, str]:
    args = ["sign", str(source), "--key", str(key), "--out", str(out), *extra]
    result = CliRunner().invoke(policy, args)
    return result.exit_code, result.output


def test_sign_refuses_a_window_change_after_the_previous_version(tmp_path: Path, key: Path) -> None:
    v3 = tmp_path / "v3.policy"
    assert _sign(EXAMPLE, key, v3)[0] == 0
    hourly = _variant(tmp_path, "v4-hourly.toml", version="4", window='"1h"')
    code, output = _sign(hourly, key, tmp_path / "v4.policy", "--previous", str(v3))
    assert code != 0
    assert "3600 s budget window, the previous version 86400 s" in output
    assert "window cannot change" in output
    assert not (tmp_path / "v4.policy").exists()  # nothing written
    # Without --previous the file itself is valid: the rule is about succession.
    assert _sign(hourly, key, tmp_path / "v4-unchecked.policy")[0] == 0


def test_sign_accepts_a_proper_successor_and_names_every_other_problem(
    tmp_path: Path, key: Path
) -> None:
    v3 = tmp_path / "v3.policy"
    assert _sign(EXAMPLE, key, v3)[0] == 0
    good = _variant(tmp_path, "v4.toml", version="4", epsilon_cap='"2"')
    code, output = _sign(good, key, tmp_path / "v4.policy", "--previous", str(v3))
    assert code == 0, output
    same = _variant(tmp_path, "v3-again.toml", name='"browser.other"')
    code, output = _sign(same, key, tmp_path / "bad.policy", "--previous", str(v3))
    assert code != 0
    assert "must have a version above the previous version 3" in output
    assert "a new metric needs a new policy id" in output
    code, output = _sign(EXAMPLE, key, tmp_path / "bad.policy", "--previous", str(key))
    assert code != 0 and "cannot read --previous" in output


def test_successor_problems_of_another_policy_id() -> None:
    previous = load_policy_toml(EXAMPLE)
    other = load_policy_toml(EXAMPLE)
    other.policy_id = "browser-other"
    (problem,) = successor_problems(previous, other)
    assert "does not follow policy 'browser-homepage'" in problem
    assert successor_problems(previous, previous) == [
        "policy 'browser-homepage' v3 must have a version above the previous version 3"
    ]
