"""Central releases against a real SQLite ledger: reserve first, idempotency, refusal.

Also sensitivity checks (clipping bounds the change one record can make) and
composition recomputed from the ledger alone.
"""

from __future__ import annotations

import functools
import logging
import math
import random
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from fedldp.aggregator.central.accounting import compose
from fedldp.aggregator.central.releases import (
    ReleaseConflictError,
    ReleaseFailedError,
    ReleaseInProgressError,
    _clipped_sum,
    _round_half_up,
    centre_of,
    mean_of,
    plan_noise,
    private_choice,
    private_count,
    private_mean,
    private_sum,
)
from fedldp.collector.ledger import Ledger, open_ledger
from fedldp.collector.ledger.store import (
    CentralBudgetExhaustedError,
    IdempotencyConflictError,
    NoCentralCapError,
)

SUBJECT, PURPOSE = "analytics-team", "weekly-stats"
DATA = [Decimal(x) / 4 for x in range(1, 401)]  # 0.25 .. 100; true sum 20050

# The release functions charging (SUBJECT, PURPOSE), the budget the `ledger` fixture caps.
team_count = functools.partial(private_count, subject=SUBJECT, purpose=PURPOSE)
team_sum = functools.partial(private_sum, subject=SUBJECT, purpose=PURPOSE)
team_choice = functools.partial(private_choice, subject=SUBJECT, purpose=PURPOSE)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    led.set_central_cap(SUBJECT, PURPOSE, epsilon_cap=Decimal("3"), delta_cap=Decimal("1e-5"))
    yield led
    led.close()


def test_budget_is_reserved_before_the_data_is_read(ledger: Ledger) -> None:
    seen: list[tuple[Decimal, Decimal]] = []

    def load() -> list[Decimal]:
        # At the moment the protected data is read, the charge is already in the ledger.
        seen.append(ledger.central_spend(SUBJECT, PURPOSE))
        assert [r.status for r in ledger.reservations(SUBJECT, PURPOSE)] == ["reserved"]
        return DATA

    rel = team_sum(
        ledger,
        epsilon=Decimal("0.5"),
        idempotency_key="k1",
        now=100,
        load=load,
        lower=Decimal(0),
        upper=Decimal(100),
    )
    assert seen == [(Decimal("0.5"), Decimal(0))]
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled" and res.id == rel.reservation_id
    assert rel.sensitivity == Decimal(100) and rel.value % rel.granularity == 0


def test_exhausted_budget_refuses_without_reading_data(ledger: Ledger) -> None:
    team_count(
        ledger,
        epsilon=Decimal("2.5"),
        idempotency_key="a",
        now=1,
        load=lambda: DATA,
    )
    read: list[bool] = []

    def load() -> list[Decimal]:
        read.append(True)
        return DATA

    with pytest.raises(CentralBudgetExhaustedError):
        team_count(
            ledger,
            epsilon=Decimal("0.6"),
            idempotency_key="b",
            now=2,
            load=load,
        )
    assert read == []
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal("2.5"), Decimal(0))
    with pytest.raises(NoCentralCapError):
        private_count(
            ledger,
            subject="nobody",
            purpose=PURPOSE,
            epsilon=Decimal("0.1"),
            idempotency_key="c",
            now=3,
            load=load,
        )
    assert read == []


def test_retry_with_the_same_key_returns_the_same_release_charged_once(ledger: Ledger) -> None:
    calls: list[int] = []

    def load() -> list[Decimal]:
        calls.append(1)
        return DATA

    args = {
        "subject": SUBJECT,
        "purpose": PURPOSE,
        "epsilon": Decimal("1"),
        "idempotency_key": "mean-1",
        "lower": Decimal(0),
        "upper": Decimal(100),
        "load": load,
    }
    first = private_mean(ledger, now=10, **args)  # type: ignore[arg-type]
    again = private_mean(ledger, now=20, **args)  # type: ignore[arg-type]
    assert again == first and calls == [1]
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(1), Decimal(0))
    # Same key, other query: refused, nothing charged.
    with pytest.raises(ReleaseConflictError):
        private_sum(ledger, now=30, **args)  # type: ignore[arg-type]
    with pytest.raises(IdempotencyConflictError):
        team_count(
            ledger,
            epsilon=Decimal("0.2"),
            idempotency_key="mean-1",
            now=40,
            load=load,
        )
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(1), Decimal(0))


def test_a_data_error_after_the_data_was_opened_is_charged(ledger: Ledger) -> None:
    """A non-numeric value is a data-dependent outcome: the reservation is settled as
    spent (never cancelled), and a retry with the same key does not read again."""

    def load() -> list[object]:
        return [Decimal(1), "not a number"]

    with pytest.raises(ValueError, match="not a number") as info:
        team_sum(
            ledger,
            epsilon=Decimal("1"),
            idempotency_key="bad",
            now=5,
            load=load,
            lower=Decimal(0),
            upper=Decimal(1),
        )
    assert "'not a number'" not in str(info.value)  # the value itself is never echoed
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(1), Decimal(0))
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled" and res.epsilon_spent == Decimal(1)
    assert res.close_reason is not None and "ValueError" in res.close_reason
    with pytest.raises(ReleaseFailedError, match="budget is spent"):
        team_sum(
            ledger,
            epsilon=Decimal("1"),
            idempotency_key="bad",
            now=6,
            load=lambda: pytest.fail("read again"),
            lower=Decimal(0),
            upper=Decimal(1),
        )


def test_bad_requests_change_nothing(ledger: Ledger) -> None:
    cases: list[Callable[[], object]] = [
        lambda: team_sum(
            ledger,
            epsilon=Decimal(1),
            idempotency_key="x",
            now=1,
            load=lambda: DATA,
            lower=Decimal(5),
            upper=Decimal(5),
        ),
        lambda: team_count(
            ledger,
            epsilon=Decimal(1),
            delta=Decimal("1e-6"),
            idempotency_key="x",
            now=1,
            load=lambda: DATA,
        ),  # Laplace with δ > 0
        lambda: team_count(
            ledger,
            epsilon=Decimal(1),
            mechanism="gaussian",
            idempotency_key="x",
            now=1,
            load=lambda: DATA,
        ),  # Gaussian without δ
        lambda: team_count(
            ledger,
            epsilon=Decimal(2),
            delta=Decimal("1e-6"),
            mechanism="gaussian",
            calibration="classic",
            idempotency_key="x",
            now=1,
            load=lambda: DATA,
        ),  # classic, ε ≥ 1
        lambda: team_choice(
            ledger,
            epsilon=Decimal(1),
            idempotency_key="x",
            now=1,
            candidates=["a", "a"],
            load=lambda: ["a"],
        ),
    ]
    for case in cases:
        with pytest.raises(ValueError):
            case()
    assert ledger.reservations(SUBJECT, PURPOSE) == []


def test_true_aggregate_is_neither_logged_nor_returned(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rel = team_sum(
        ledger,
        epsilon=Decimal(1),
        idempotency_key="s",
        now=1,
        load=lambda: DATA,
        lower=Decimal(0),
        upper=Decimal(100),
        granularity=Decimal("0.01"),
    )
    true_sum = str(sum(DATA))
    assert true_sum not in caplog.text
    assert rel.value != Decimal(true_sum)  # noise of scale 100 / 0.01 lattice units
    assert true_sum not in str(rel.to_dict())
    events = [e.event for e in ledger.central_events(SUBJECT, PURPOSE)]
    assert all(true_sum not in str(e) for e in events)


def test_sensitivity_of_clipped_sum_on_the_lattice() -> None:
    """One added record moves the lattice centre by at most ⌈Δ/γ⌉ (what the noise covers)."""
    rng = random.Random(7)
    lower, upper = Decimal("-3"), Decimal("10")
    for granularity in (Decimal("0.01"), Decimal("0.3"), Decimal(1), Decimal(7)):
        plan = plan_noise(
            "laplace",
            epsilon=Decimal(1),
            delta=Decimal(0),
            sensitivity=max(abs(lower), abs(upper)),
            granularity=granularity,
        )
        assert plan.lattice_sensitivity == math.ceil(Fraction(10) / Fraction(granularity))
        for _ in range(300):
            data = [Decimal(rng.randint(-500, 1500)) / 100 for _ in range(rng.randint(0, 20))]
            extra = Decimal(rng.choice([-1e9, 1e9, rng.uniform(-3, 10)]))  # may exceed bounds
            s1, _ = _clipped_sum(data, lower, upper)
            s2, _ = _clipped_sum([*data, extra], lower, upper)
            assert abs(s2 - s1) <= 10
            c1 = _round_half_up(Fraction(s1) / Fraction(granularity))
            c2 = _round_half_up(Fraction(s2) / Fraction(granularity))
            assert abs(c2 - c1) <= plan.lattice_sensitivity


@pytest.mark.parametrize(("lower", "upper"), [("0", "100"), ("-5", "20"), ("-30", "-10")])
def test_the_mean_noises_a_centred_sum_of_half_the_range(
    ledger: Ledger, lower: str, upper: str
) -> None:
    """The mean's sum part is Σ(x − M), M = (L + U)/2, recorded with sensitivity
    k·(U − L)/2 and its centre; ε is halved between it and the count; the value
    is M + noisy Σ(x − M) / noisy count, clipped."""
    lo, hi = Decimal(lower), Decimal(upper)
    rel = private_mean(
        ledger,
        subject=SUBJECT,
        purpose=PURPOSE,
        epsilon=Decimal("1"),
        idempotency_key=f"centred-{lower}",
        now=1,
        lower=lo,
        upper=hi,
        contribution_bound=3,
        load=lambda: DATA,
    )
    (res,) = [r for r in ledger.reservations(SUBJECT, PURPOSE) if r.id == rel.reservation_id]
    events = {e.event["query"]: e.event for e in ledger.central_events(SUBJECT, PURPOSE)}
    assert res.id == rel.reservation_id and set(events) == {"centred_sum", "count"}
    centred, count = events["centred_sum"], events["count"]
    assert Decimal(str(centred["sensitivity"])) == 3 * (hi - lo) / 2 < 3 * max(abs(lo), abs(hi))
    assert Decimal(str(centred["centre"])) == centre_of(lo, hi) == (lo + hi) / 2
    assert centred["epsilon"] == count["epsilon"] == "0.5"
    assert Decimal(str(count["sensitivity"])) == 3
    noisy_sum, noisy_count = Decimal(str(centred["output"])), Decimal(str(count["output"]))
    assert rel.parts == {"centred_sum": noisy_sum, "count": noisy_count}
    assert rel.value == mean_of(noisy_sum, noisy_count, lo, hi, centred=True)
    expected = min(max((lo + hi) / 2 + noisy_sum / noisy_count, lo), hi)
    assert rel.value == expected


@pytest.mark.parametrize("broken", [False, True])
def test_one_unit_moves_the_centred_sum_by_at_most_its_sensitivity(broken: bool) -> None:
    """Adding a unit of k records (any values, clipped) to any data moves Σ(x − M) by
    at most k·(U − L)/2, and the bound is reached; the broken variant, half of
    max(|L|, |U|) (a plain sum's sensitivity halved), is exceeded."""
    rng = random.Random(11)
    k = 3
    exceeded = []
    for lower, upper in ((Decimal(-5), Decimal(20)), (Decimal(0), Decimal(100))):
        centre = centre_of(lower, upper)
        sens = k * (max(abs(lower), abs(upper)) / 2 if broken else (upper - lower) / 2)
        worst = Decimal(0)
        for _ in range(200):
            data = [Decimal(rng.randint(-4000, 12000)) / 100 for _ in range(rng.randint(0, 20))]
            unit = [Decimal(rng.choice([-1e9, 1e9, rng.uniform(-40, 120)])) for _ in range(k)]
            s1, n1 = _clipped_sum(data, lower, upper)
            s2, n2 = _clipped_sum([*data, *unit], lower, upper)
            worst = max(worst, abs((s2 - centre * n2) - (s1 - centre * n1)))
        exceeded.append(worst > sens)
    # the broken sensitivity is caught on [-5, 20] (on [0, 100] both are 50 per record)
    assert exceeded == ([True, False] if broken else [False, False])


def test_a_mean_recorded_as_a_plain_sum_still_reads_back() -> None:
    """Means released before the centred form (events "sum"/"count") keep their value:
    noisy Σx / noisy count, clipped; the midpoint below a count of 1."""
    lo, hi = Decimal(0), Decimal(100)
    assert mean_of(Decimal(500), Decimal(10), lo, hi, centred=False) == 50
    assert mean_of(Decimal(-100), Decimal(10), lo, hi, centred=True) == 40
    assert mean_of(Decimal(5000), Decimal(10), lo, hi, centred=True) == 100
    assert mean_of(Decimal(7), Decimal("0.5"), lo, hi, centred=True) == 50


def test_choice_picks_the_clear_winner(ledger: Ledger) -> None:
    records = ["blue"] * 300 + ["red"] * 20 + ["green"] * 5
    rel = team_choice(
        ledger,
        epsilon=Decimal(1),
        idempotency_key="c",
        now=1,
        candidates=["red", "green", "blue"],
        load=lambda: records,
        rng=random.Random(1),
    )
    assert rel.value == "blue" and rel.mechanism == "exponential"


def test_composition_recomputed_from_the_ledger_alone(ledger: Ledger, tmp_path: Path) -> None:
    """Ten Gaussian sums: RDP beats basic composition, and a fresh process gets the same."""
    for i in range(10):
        team_sum(
            ledger,
            epsilon=Decimal("0.25"),
            delta=Decimal("1e-7"),
            mechanism="gaussian",
            idempotency_key=f"g{i}",
            now=i,
            load=lambda: DATA,
            lower=Decimal(0),
            upper=Decimal(100),
        )
    team_count(
        ledger,
        epsilon=Decimal("0.2"),
        idempotency_key="lap",
        now=11,
        load=lambda: DATA,
    )
    basic = compose(ledger, SUBJECT, PURPOSE, "basic")
    assert (basic.basic_epsilon, basic.basic_delta) == (Decimal("2.70"), Decimal("0.0000010"))
    rdp = compose(ledger, SUBJECT, PURPOSE, "rdp")
    assert rdp.tight_events == 11 and rdp.basic_events == 0
    assert rdp.epsilon < basic.epsilon and rdp.delta == pytest.approx(1e-6)
    # Golden, built independently: every event is zCDP (discrete Gaussian Δ²/2σ², discrete
    # Laplace ε²/2), and zCDP ρ composes to ρ total = the RDP curve of ONE Gaussian with
    # noise multiplier 1/sqrt(2ρ), composed here directly with dp-accounting.
    import dp_accounting
    from dp_accounting import rdp as rdp_lib

    gauss = [
        e.event
        for e in ledger.central_events(SUBJECT, PURPOSE)
        if e.event["kind"] == "discrete_gaussian"
    ]
    rho = sum(
        int(str(e["lattice_sensitivity"])) ** 2 / (2 * float(str(e["sigma"])) ** 2) for e in gauss
    )
    rho += 0.2**2 / 2
    acc = rdp_lib.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(1 / math.sqrt(2 * rho)))
    assert rdp.epsilon == pytest.approx(min(2.7, acc.get_epsilon(1e-6)), rel=1e-6)
    fresh = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        assert compose(fresh, SUBJECT, PURPOSE, "rdp") == rdp
    finally:
        fresh.close()
    pld = compose(ledger, SUBJECT, PURPOSE, "pld")
    assert pld.tight_events == 11 and pld.epsilon < basic.epsilon


def test_release_cli_count_retry_and_spend(ledger: Ledger, tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from fedldp.cli_report import release

    data = tmp_path / "data.csv"
    data.write_text("amount\n" + "\n".join(str(x) for x in DATA) + "\n")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    base = [
        "--ledger",
        url,
        "--subject",
        SUBJECT,
        "--purpose",
        PURPOSE,
        "--data",
        str(data),
        "--column",
        "amount",
    ]
    runner = CliRunner()
    first = runner.invoke(
        release,
        ["sum", *base, "--epsilon", "1", "--key", "cli-1", "--lower", "0", "--upper", "100"],
    )
    assert first.exit_code == 0, first.output
    again = runner.invoke(
        release,
        ["sum", *base, "--epsilon", "1", "--key", "cli-1", "--lower", "0", "--upper", "100"],
    )
    assert json.loads(again.output)["value"] == json.loads(first.output)["value"]
    refused = runner.invoke(release, ["count", *base, "--epsilon", "2.5", "--key", "cli-2"])
    assert refused.exit_code == 1 and "exceed the cap" in refused.output
    spend = runner.invoke(
        release,
        [
            "spend",
            "--ledger",
            url,
            "--subject",
            SUBJECT,
            "--purpose",
            PURPOSE,
            "--composition",
            "rdp",
        ],
    )
    assert json.loads(spend.output)["basic_epsilon"] == "1"


def test_a_second_call_while_the_first_holds_the_key_never_computes(ledger: Ledger) -> None:
    """A second call with the same key, made while the first is still reading data, is
    refused without reading; after the first settles, the key returns its one output."""
    inner: list[BaseException] = []

    def args(load: Callable[[], list[Decimal]]) -> dict[str, object]:
        return {
            "subject": SUBJECT,
            "purpose": PURPOSE,
            "epsilon": Decimal(1),
            "idempotency_key": "race",
            "now": 1,
            "lower": Decimal(0),
            "upper": Decimal(100),
            "load": load,
            "granularity": Decimal("0.01"),
        }

    def never() -> list[Decimal]:
        raise AssertionError("the second call read the data")

    def outer_load() -> list[Decimal]:
        with pytest.raises(ReleaseInProgressError, match="never released twice") as info:
            private_sum(ledger, **args(never))  # type: ignore[arg-type]
        inner.append(info.value)
        return DATA

    outer = private_sum(ledger, **args(outer_load))  # type: ignore[arg-type]
    assert len(inner) == 1
    again = private_sum(ledger, **args(never))  # type: ignore[arg-type]
    assert again == outer
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(1), Decimal(0))
