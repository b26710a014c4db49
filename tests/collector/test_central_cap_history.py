"""Reconcile judges each central reservation against the cap in force when it was made.

A release policy may lower a purpose's cap below what was already spent ("to 0
to close it"); reconcile used to compare the committed total with today's cap
and reported `central_over_cap` forever. Now every cap change is a "cap_set"
event of the reservation log (collector/ledger/central.py) and reconcile
replays that log (collector/ledger/reconcile.py). A reservation that really
exceeded the cap in force when it was made (written here past the API, as a
broken collector would) is still a mismatch. SQLite files and the suite's
PostgreSQL; an old ledger migrated from revision 0006 is read too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from click.testing import CliRunner
from fedldp.collector.ledger import CentralBudgetExhaustedError, Ledger, Mismatch, open_ledger
from fedldp.collector.ledger.migrate import alembic_config
from fedldp.collector.ledger.schema import (
    central_caps,
    central_reservation_log,
    central_reservations,
)

from fedldp.cli import main

S, P = "release-service/visits", "quarterly"
T0 = 1_000_000


@pytest.fixture
def url(ledger_url: str) -> str:
    """Each store of the collector suite (conftest `ledger_url`: SQLite, PostgreSQL)."""
    return ledger_url


@pytest.fixture
def ledger(url: str) -> Iterator[Ledger]:
    """An open ledger without a shard name (the CLI below opens it the same way)."""
    led = open_ledger(url)
    yield led
    led.close()


def _cap(led: Ledger, eps: str, delta: str = "0.001") -> None:
    led.set_central_cap(S, P, epsilon_cap=Decimal(eps), delta_cap=Decimal(delta))


def _spend(led: Ledger, key: str, eps: str, *, spent: str | None = None, at: int = T0) -> str:
    """Reserve (ε, 0) and settle it as `spent` (default: all of it); the reservation id."""
    res = led.reserve(
        subject=S, purpose=P, epsilon=Decimal(eps), delta=Decimal(0), idempotency_key=key, now=at
    )
    led.settle(res.id, epsilon_spent=Decimal(spent or eps), delta_spent=Decimal(0), now=at + 1)
    return res.id


def _over_cap(led: Ledger) -> list[Mismatch]:
    return [m for m in led.reconcile() if m.kind == "central_over_cap"]


def _today_rule(led: Ledger) -> bool:
    """The broken variant (the old rule): committed total above TODAY's cap."""
    cap = led.central_cap(S, P)
    assert cap is not None
    return led.central_spend(S, P)[0] > cap[0]


def test_lowering_a_cap_below_the_spend_is_no_mismatch(ledger: Ledger) -> None:
    _cap(ledger, "1")
    _spend(ledger, "a", "0.6")
    _cap(ledger, "0")  # the purpose closed: nothing new fits, nothing was over its cap
    assert ledger.reconcile() == []
    assert _today_rule(ledger), "the old rule flags this honest ledger (the bug)"
    with pytest.raises(CentralBudgetExhaustedError, match="exceed the cap"):
        ledger.reserve(
            subject=S,
            purpose=P,
            epsilon=Decimal("0.1"),
            delta=Decimal(0),
            idempotency_key="b",
            now=T0 + 5,
        )


def test_releases_refunds_and_raises_replay_in_order(ledger: Ledger) -> None:
    _cap(ledger, "1")
    _spend(ledger, "a", "1", spent="0.4")  # 0.6 released back to the cap
    _spend(ledger, "b", "0.6")  # fits only because the settle released 0.6
    _cap(ledger, "3")
    _spend(ledger, "c", "2")
    _cap(ledger, "0.5")
    assert ledger.reconcile() == []
    _cap(ledger, "0.5")  # the same cap again logs nothing
    log = ledger.reservation_log("")
    assert [e["epsilon_cap"] for e in log] == ["1", "3", "0.5"]


def _inject(url: str, rid: str, eps: str, at: int) -> None:
    """A reservation charged past the API (what a broken collector would write): its row,
    its "reserved" event and its commitment, with no cap check."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(central_reservations).values(
                id=rid,
                subject=S,
                purpose=P,
                epsilon=eps,
                delta="0",
                status="settled",
                epsilon_spent=eps,
                delta_spent="0",
                idempotency_key=rid,
                metadata_json="{}",
                created_at=at,
                closed_at=at,
            )
        )
        conn.execute(
            sa.insert(central_reservation_log).values(
                reservation_id=rid,
                at=at,
                action="reserved",
                detail_json=json.dumps({"epsilon": eps, "delta": "0"}),
            )
        )
        committed = conn.execute(
            sa.select(central_caps.c.epsilon_committed).where(central_caps.c.subject == S)
        ).scalar_one()
        conn.execute(
            sa.update(central_caps)
            .where(central_caps.c.subject == S)
            .values(epsilon_committed=str(Decimal(committed) + Decimal(eps)))
        )
    engine.dispose()


def test_a_charge_over_the_cap_in_force_is_still_a_mismatch(url: str, ledger: Ledger) -> None:
    _cap(ledger, "1")
    _spend(ledger, "a", "0.5")
    _inject(url, "f" * 32, "0.75", T0 + 10)  # 1.25 > 1, the cap in force then
    _cap(ledger, "5")  # raising the cap afterwards does not excuse it
    assert not _today_rule(ledger), "the old rule misses it once the cap was raised"
    (m,) = _over_cap(ledger)
    assert m.subject == S and f"reservation={'f' * 32}" in m.scope
    assert m.recomputed == "eps=1.25 delta=0" and m.recorded.startswith("cap in force eps=1 ")
    assert [x.kind for x in ledger.reconcile()] == ["central_over_cap"]


def test_the_cli_reconcile_passes_after_a_lowered_cap(url: str, ledger: Ledger) -> None:
    _cap(ledger, "2")
    _spend(ledger, "a", "1.5")
    _cap(ledger, "1")
    ledger.close()
    result = CliRunner().invoke(main, ["ledger", "reconcile", "--ledger", url])
    assert result.exit_code == 0, result.output
    assert "MISMATCH" not in result.output


def test_an_old_ledger_is_judged_against_its_earliest_recorded_cap(tmp_path: Path) -> None:
    """A ledger made at revision 0006 (no cap history): the migration logs each cap as it
    is at the upgrade, old reservations are judged against it, new ones as above."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0006_restore_central_block")
        conn.execute(
            sa.text("INSERT INTO central_caps VALUES (:s, :p, '1', '0.001', '0.8', '0', :t)"),
            {"s": S, "p": P, "t": T0},
        )
        conn.execute(
            sa.text(
                "INSERT INTO central_reservations (id, subject, purpose, epsilon, delta, status, "
                "epsilon_spent, delta_spent, idempotency_key, metadata_json, created_at) "
                "VALUES ('old', :s, :p, '0.8', '0', 'settled', '0.8', '0', 'k-old', '{}', :t)"
            ),
            {"s": S, "p": P, "t": T0},
        )
    engine.dispose()
    led = open_ledger(url)  # migrates to head
    try:
        assert led.reservation("old").receipt_key_id is None
        assert [e["source"] for e in led.reservation_log("")] == ["migration 0007"]
        assert led.reconcile() == []
        _cap(led, "0.5")
        assert led.reconcile() == []
        _cap(led, "1")  # an operator's `ledger set-cap` may raise a cap
        _spend(led, "new", "0.2")
        assert led.reconcile() == []
    finally:
        led.close()
