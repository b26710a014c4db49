"""`fedldp verify mechanism`: table and JSON output, exit status, one-line errors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal

import pytest
from click.testing import CliRunner
from fedldp.client.mechanisms import registry
from fedldp.client.mechanisms.base import Mechanism

from fedldp.cli import main
from tests.aggregator.broken_mechanisms import DoubledGRR

SMALL = ["--samples", "100000", "--device-samples", "2000", "--seed", "5"]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["verify", "mechanism", *args])
    return result.exit_code, result.output


def test_passing_mechanisms_print_a_table_and_exit_0() -> None:
    code, out = run("-m", "grr", "-m", "rappor-grr", "--epsilon", "0.5,1", *SMALL, "--reports", "1")
    assert code == 0, out
    rows = [
        line for line in out.splitlines() if line.startswith("| grr") or line.startswith("| rappor")
    ]
    assert len(rows) == 4 and all(row.endswith("| PASS |") for row in rows)
    assert "confidence 0.999999" in out


def test_json_output_carries_claim_bounds_and_verdict() -> None:
    code, out = run("-m", "oue", "-e", "2", "--format", "json", "--path", "batch", *SMALL)
    assert code == 0, out
    (audit,) = json.loads(out)
    assert audit["mechanism"] == "oue" and audit["claim"] == "2" and audit["passed"] is True
    assert set(audit["epsilon_lb"]) == {"batch"}
    assert 0 < audit["epsilon_lb"]["batch"] <= 2
    assert audit["alpha"] == pytest.approx(1e-6)


@pytest.fixture
def broken_registered(monkeypatch: pytest.MonkeyPatch) -> str:
    """A broken mechanism under a test-only wire id (GRR at 2ε claiming ε)."""

    def factory(
        epsilon: Decimal, metric: int | tuple[Decimal, Decimal], params: Mapping[str, str]
    ) -> Mechanism:  # type: ignore[type-arg]
        assert isinstance(metric, int)
        return DoubledGRR(epsilon, metric)

    monkeypatch.setitem(registry._REGISTRY, "test-doubled-grr", factory)
    return "test-doubled-grr"


def test_a_lower_bound_above_the_claim_exits_1(broken_registered: str) -> None:
    code, out = run("-m", broken_registered, "-m", "grr", *SMALL)
    assert code == 1, out
    assert "| FAIL |" in out and "| PASS |" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "nope"], "unknown mechanism id 'nope'"),
        (["-m", "grr", "-e", "abc"], "--epsilon must be a decimal number"),
        (["-m", "grr", "-e", "-1"], "--epsilon must be positive"),
        (["-m", "grr", "--k", "1"], "--k"),
        (["--all", "-m", "grr"], "not both"),
        ([], "or --all (every registered mechanism)"),
        (["-m", "grr", "--path", "gpu"], "--path"),
        (["-m", "grr", "--confidence", "1"], "--confidence"),
        (["-m", "grr", "--param", "g"], "NAME=VALUE"),
        (["-m", "grr", "--param", "g=5"], "grr takes no parameters"),
        (["-m", "piecewise", "--range", "1", "0"], "lo < hi"),
        (["-m", "rappor-grr", "--epsilon-permanent", "0.5"], "must not exceed epsilon_permanent"),
    ],
)
def test_bad_input_is_one_error_line_exit_2(args: list[str], message: str) -> None:
    code, out = run(*args)
    assert code == 2, out
    assert out.startswith("Error: ") and message in out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out
