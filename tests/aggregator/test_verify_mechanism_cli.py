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
from tests.aggregator.broken_mechanisms import DoubledGRR, RetiredChargeRapporOUE

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


@pytest.fixture
def retired_charge_registered(monkeypatch: pytest.MonkeyPatch) -> str:
    """rappor-oue charged the retired r* per report, under a test-only wire id."""

    def factory(
        epsilon: Decimal, metric: int | tuple[Decimal, Decimal], params: Mapping[str, str]
    ) -> Mechanism:  # type: ignore[type-arg]
        assert isinstance(metric, int)
        if "epsilon_permanent" not in params:  # as the registry says it
            raise ValueError("test-retired-oue needs parameter 'epsilon_permanent'")
        return RetiredChargeRapporOUE(epsilon, metric, Decimal(params["epsilon_permanent"]))

    monkeypatch.setitem(registry._REGISTRY, "test-retired-oue", factory)
    return "test-retired-oue"


OUE_64 = ["-e", "1", "--k", "64", "--epsilon-permanent", "2", "--path", "batch"]


def test_the_sequence_test_fails_the_retired_charge_and_exits_1(
    retired_charge_registered: str,
) -> None:
    code, out = run("-m", retired_charge_registered, "-m", "rappor-oue", *OUE_64, *SMALL)
    assert code == 1, out
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in out.splitlines()}
    retired, sound = rows[retired_charge_registered], rows["rappor-oue"]
    # claimed 2.0 (r* = 1 per report); the sequence bound, batch path, is far above it
    assert retired[5] == "2" and float(retired[9]) > 2.0 and retired[-1] == "FAIL |"
    assert sound[5] == "180.173564" and float(sound[9]) > 2.0 and sound[-1] == "PASS |"
    assert retired[6] == "-" and float(retired[7]) <= 2.0  # one unchanged value: no leak


def test_json_carries_the_sequence_bounds_and_no_sequences_turns_them_off() -> None:
    code, out = run("-m", "rappor-grr", "--format", "json", "--path", "batch", *SMALL)
    assert code == 0, out
    (audit,) = json.loads(out)
    assert set(audit["sequences_epsilon_lb"]) == {"batch"} and audit["wall_s"] > 0
    code, out = run(
        "-m", "rappor-grr", "--format", "json", "--path", "batch", "--no-sequences", *SMALL
    )
    assert code == 0, out
    assert json.loads(out)[0]["sequences_epsilon_lb"] == {}


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
