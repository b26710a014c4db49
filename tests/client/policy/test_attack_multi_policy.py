"""Attack on multi-attribute policy authoring and validation: every bad attribute spec
must come back as a named problem (InvalidPolicyError; `fedldp policy sign` exits 1
with a one-line `Error: ...`), never as an internal error (exit 70)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fedldp.authoring import policy_from_dict
from fedldp.client.policy import InvalidPolicyError

from fedldp.cli import main
from tests.client.policy.test_multi_policy import document

TINY = "0.0000000000000000000000001"


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidPolicyError) as info:
        policy_from_dict(data)
    return info.value.problems


@pytest.mark.parametrize("mechanism", ["multi-split", "auto"])
def test_an_empty_attribute_list_is_a_named_problem(mechanism: str) -> None:
    data = document(mechanism)
    data["metric"]["attributes"] = []
    assert any("needs 2..16" in p for p in _problems(data))


def test_an_empty_attribute_list_under_sample_is_a_named_problem() -> None:
    """The control: the same document under multi-sample is refused cleanly."""
    data = document("multi-sample")
    data["metric"]["attributes"] = []
    assert any("needs 2..16" in p for p in _problems(data))


def test_auto_mode_at_a_tiny_epsilon_is_a_named_problem() -> None:
    assert _problems(document("auto", TINY))


def test_policy_sign_refuses_an_empty_attribute_list_in_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    keys = tmp_path / "keys"
    generated = runner.invoke(main, ["keys", "generate", "--out", str(keys), "--name", "policy"])
    assert generated.exit_code == 0, generated.output
    toml = tmp_path / "empty.toml"
    toml.write_text(
        "\n".join(
            [
                'policy_id = "app-profile"',
                "version = 1",
                'purpose = "Which OS people use."',
                'audience = ["prod-eu"]',
                "not_before = 2026-12-01T00:00:00Z",
                "expires_at = 2027-03-01T00:00:00Z",
                "min_reports_for_release = 10",
                "[metric]",
                'name = "app.profile"',
                "attributes = []",
                "[mechanism]",
                'id = "multi-split"',
                'epsilon = "1"',
                "[budget]",
                'epsilon_cap = "4"',
                'window = "1d"',
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    result = runner.invoke(
        main,
        [
            "policy",
            "sign",
            str(toml),
            "--key",
            str(keys / "policy.key"),
            "--out",
            str(tmp_path / "out.policy"),
        ],
    )
    assert result.exit_code == 1, result.output
    assert "needs 2..16" in result.output
    assert "internal error" not in result.output


def test_an_unresolvable_auto_names_its_cause() -> None:
    data = document("auto", "1000")
    data["budget"]["epsilon_cap"] = "2000"
    assert any("attribute 'minutes'" in p for p in _problems(data))


def test_single_metric_auto_at_a_tiny_epsilon_is_a_named_problem() -> None:
    """A categorical metric's "auto" at an ε where every oracle's p* and q* coincide in
    floats (f0_variance infinite) is left unresolved and reported, never a crash."""
    data = document("auto", TINY)
    data["metric"] = {"name": "app.os", "values": ["android", "ios", "web", "other"]}
    assert any("'auto'" in p for p in _problems(data))
