"""The refund rule and one owner per reservation, on SQLite and PostgreSQL.

Refund rule: a reservation is cancelled only when the run failed before it
recorded `open_data` (so it read no protected byte); from that mark on, every
outcome (data error, KeyboardInterrupt, crash) leaves it charged in full. Each
release kind and training is run with a failure injected before and after the
first read. Ownership: the same idempotency key is claimed by exactly one run,
checked with concurrent processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fedldp.aggregator.central.releases import (
    ReleaseFailedError,
    private_choice,
    private_count,
    private_mean,
    private_sum,
)
from fedldp.collector.ledger import (
    DataOpenedError,
    LeaseActiveError,
    Ledger,
    ReservationOwnedError,
    ReservationStateError,
    open_ledger,
)

from tests.aggregator import race_worker

SUBJECT, PURPOSE = "team", "race"
WORKER = Path(__file__).with_name("race_worker.py")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgresql_url"))


@pytest.fixture
def ledger(url: str) -> Iterator[Ledger]:
    led = open_ledger(url)
    led.set_central_cap(SUBJECT, PURPOSE, epsilon_cap=Decimal(10), delta_cap=Decimal("1e-4"))
    yield led
    led.close()


class LedgerDown:
    """The real ledger, except that recording the data-opened mark fails (an unreachable
    ledger): `open_data`, and a claim asked to commit the mark with it
    (`reserve(open_data=True)`: nothing is claimed). `separate_open`: a view that takes
    the claim without the mark (as service/holds.py does), so the mark is a call of
    its own."""

    def __init__(self, ledger: Ledger, *, separate_open: bool = False) -> None:
        self._ledger, self._separate = ledger, separate_open

    def reserve(self, **kwargs: Any) -> Any:
        if self._separate:
            kwargs.pop("open_data", None)
        elif kwargs.get("open_data"):
            raise ConnectionError("ledger unreachable")
        return self._ledger.reserve(**kwargs)

    def open_data(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("ledger unreachable")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


def _release(kind: str) -> Callable[..., Any]:
    """A release of `kind` charging (SUBJECT, PURPOSE) with ε = 1 over `load`."""
    common: dict[str, Any] = {"subject": SUBJECT, "purpose": PURPOSE, "epsilon": Decimal(1)}
    bounds: dict[str, Any] = {"lower": Decimal(0), "upper": Decimal(10)}

    def run(ledger: Any, key: str, load: Callable[[], Any]) -> Any:
        if kind == "choice":
            return private_choice(
                ledger, **common, idempotency_key=key, now=1, load=load, candidates=["a", "b"]
            )
        releases: dict[str, Callable[..., Any]] = {
            "count": private_count,
            "sum": private_sum,
            "mean": private_mean,
        }
        fn = releases[kind]
        extra = {} if kind == "count" else bounds
        return fn(ledger, **common, **extra, idempotency_key=key, now=1, load=load)

    return run


KINDS = ["count", "sum", "mean", "choice"]


def _rows_then(exc: BaseException) -> Callable[[], Iterator[str]]:
    """A loader that yields protected rows, then fails."""

    def load() -> Iterator[str]:
        yield "3"
        raise exc

    return load


@pytest.mark.parametrize("kind", KINDS)
def test_release_failing_before_the_first_read_is_cancelled(ledger: Ledger, kind: str) -> None:
    """Through a view that opens separately: the claim commits, the mark does not, and
    the claim is cancelled (the refund rule's one refund)."""
    reads: list[int] = []

    def load() -> list[str]:
        reads.append(1)
        return ["a"]

    with pytest.raises(ConnectionError):
        _release(kind)(LedgerDown(ledger, separate_open=True), "k", load)
    assert reads == []
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "cancelled" and res.data_opened_at is None
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(0), Decimal(0))


@pytest.mark.parametrize("kind", KINDS)
def test_release_whose_claim_with_the_mark_fails_reserves_nothing(
    ledger: Ledger, kind: str
) -> None:
    """The plain ledger: the claim and the mark are one transaction; when it fails,
    nothing was claimed, nothing read, nothing charged."""
    reads: list[int] = []

    def load() -> list[str]:
        reads.append(1)
        return ["a"]

    with pytest.raises(ConnectionError):
        _release(kind)(LedgerDown(ledger), "k", load)
    assert reads == [] and ledger.reservations(SUBJECT, PURPOSE) == []
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(0), Decimal(0))


@pytest.mark.parametrize("kind", KINDS)
def test_release_claims_and_opens_in_one_transaction(ledger: Ledger, kind: str) -> None:
    """The mark is committed with the claim, before `load` runs: the reservation seen
    from inside `load` is opened already and can no longer be cancelled."""
    seen: list[Any] = []

    def load() -> list[str]:
        (res,) = ledger.reservations(SUBJECT, PURPOSE)
        seen.append(res)
        with pytest.raises(DataOpenedError):
            ledger.cancel(res.id, now=1)
        return ["a"] if kind == "choice" else ["3"]

    _release(kind)(ledger, "k", load)
    assert seen[0].status == "reserved" and seen[0].data_opened_at == seen[0].created_at
    assert [e["action"] for e in ledger.reservation_log(seen[0].id)] == [
        "reserved",
        "data_opened",
        "settled",
    ]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("failure", [ValueError("bad row"), KeyboardInterrupt()])
def test_release_failing_after_the_first_read_is_charged(
    ledger: Ledger, kind: str, failure: BaseException
) -> None:
    with pytest.raises(type(failure)):
        _release(kind)(ledger, "k", _rows_then(failure))
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled" and res.data_opened_at is not None
    assert (res.epsilon_spent, res.delta_spent) == (res.epsilon, res.delta)
    assert ledger.central_spend(SUBJECT, PURPOSE)[0] == Decimal(1)
    assert [e["action"] for e in ledger.reservation_log(res.id)] == [
        "reserved",
        "data_opened",
        "settled",
    ]
    with pytest.raises(ReleaseFailedError):  # the key never reads again, nor refunds
        _release(kind)(ledger, "k", lambda: pytest.fail("read again"))


def test_crash_after_opening_stays_charged_until_an_operator_settles_it(ledger: Ledger) -> None:
    """A run killed after open_data: cancel is refused, the lease runs out, the operator
    settles it as spent (the full amount) and that action is logged."""
    res = ledger.reserve(
        subject=SUBJECT,
        purpose=PURPOSE,
        epsilon=Decimal(2),
        delta=Decimal(0),
        idempotency_key="crashed",
        now=100,
        owner="run-a",
        lease_seconds=60,
    )
    ledger.open_data(res.id, owner="run-a", now=110, lease_seconds=60)
    with pytest.raises(DataOpenedError):
        ledger.cancel(res.id, now=120, owner="run-a")
    with pytest.raises(DataOpenedError):
        ledger.cancel(res.id, now=120)  # the administrative path refuses too
    with pytest.raises(ReservationOwnedError):
        ledger.settle(
            res.id, epsilon_spent=Decimal(0), delta_spent=Decimal(0), now=120, owner="run-b"
        )
    with pytest.raises(LeaseActiveError):
        ledger.settle_stale(res.id, now=169)
    assert ledger.reservation(res.id).stale(170)
    done = ledger.settle_stale(res.id, now=170, note="run-a was killed")
    assert (done.status, done.epsilon_spent) == ("settled", Decimal(2))
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(2), Decimal(0))
    log = ledger.reservation_log(res.id)
    assert log[-1]["action"] == "settled_stale" and log[-1]["note"] == "run-a was killed"
    with pytest.raises(ReservationStateError):
        ledger.settle_stale(res.id, now=171)
    assert ledger.reconcile() == []


def _wait_for(path: Path, lines: int) -> None:
    deadline = time.monotonic() + 120
    while not (path.exists() and len(path.read_text().splitlines()) >= lines):
        assert time.monotonic() < deadline, f"{path} never reached {lines} line(s)"
        time.sleep(0.05)


def _start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(WORKER), *args])


def test_concurrent_release_processes_with_one_key_release_once(
    ledger: Ledger, url: str, tmp_path: Path
) -> None:
    """The first run (a process of its own) holds the key while it reads; a second run
    and, once the first is done, a third (both in this process) must not read."""

    def must_not_read() -> Any:
        pytest.fail("a second run read the data")

    marker, go = tmp_path / "reads", tmp_path / "go"
    out = tmp_path / "out.json"
    first = _start("release", url, "one-key", str(marker), str(go), str(out))
    _wait_for(marker, 1)  # the first process has opened the data and holds the key
    try:
        b = race_worker.release_outcome(url, "one-key", must_not_read)
    finally:
        go.touch()  # the first run may finish
    assert first.wait(120) == 0
    c = race_worker.release_outcome(url, "one-key", must_not_read)
    a = json.loads(out.read_text())
    assert b["error"] == "ReleaseInProgressError", b
    assert c == a and "ok" in a  # the first run's published output, not a second draw
    assert marker.read_text().splitlines() == ["read"]  # the data was read once
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled"
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(1), Decimal(0))


def test_killed_run_is_listed_then_settled_as_spent_by_the_operator(
    ledger: Ledger, url: str, tmp_path: Path
) -> None:
    """kill -9 while the run reads: the reservation stays charged (open, data opened), shows
    as stale once the lease is over, and the operator settles it as spent, logged."""
    import signal

    from click.testing import CliRunner

    from fedldp.cli import main

    marker, go = tmp_path / "reads", tmp_path / "go"
    run = _start("release", url, "killed", str(marker), str(go), str(tmp_path / "out.json"))
    _wait_for(marker, 1)
    run.send_signal(signal.SIGKILL)
    run.wait(60)
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "reserved" and res.data_opened_at is not None
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(1), Decimal(0))
    done = ledger.reserve(
        subject=SUBJECT, purpose=PURPOSE, epsilon=Decimal("0.5"), delta=Decimal(0),
        idempotency_key="done", now=res.created_at, owner="o",
    )  # fmt: skip
    ledger.cancel(done.id, now=res.created_at, owner="o")
    runner = CliRunner()
    base = ["ledger", "reservations", "--ledger", url, "--json"]
    rows = [json.loads(line) for line in runner.invoke(main, base).output.splitlines()]
    assert sorted((r["state"], r["data_opened"]) for r in rows) == [
        ("cancelled", False),
        ("open", True),
    ]
    refused = runner.invoke(main, ["ledger", "settle-stale", res.id, "--ledger", url])
    assert refused.exit_code == 1 and "held by a live run" in refused.output
    assert res.lease_expires_at is not None
    later = str(res.lease_expires_at + 1)
    stale = runner.invoke(main, [*base, "--state", "stale", "--now", later]).output.splitlines()
    assert [json.loads(line)["id"] for line in stale] == [res.id]
    table = runner.invoke(main, ["ledger", "reservations", "--ledger", url, "--now", later])
    assert "stale" in table.output and "1 open reservation(s) charged in full" in table.output
    settled = runner.invoke(
        main, ["ledger", "settle-stale", res.id, "--ledger", url, "--now", later, "--note", "oom"]
    )
    assert settled.exit_code == 0 and "settled as spent: eps=1" in settled.output
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(1), Decimal(0))
    assert ledger.reservation_log(res.id)[-1]["action"] == "settled_stale"
    assert ledger.reconcile() == []
