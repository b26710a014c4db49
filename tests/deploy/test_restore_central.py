"""A restored ledger and central (windowless) budget; the restore's clock and
PostgreSQL's in-between state (collector/ledger/restore.py states the rules).

Central caps have no window, so a restore gap cannot cover a central release
lost with the backup. The regression (finding 01 of the attack round): cap
ε = 1, backup, a release of ε = 1 on the live ledger, restore; the restored
ledger must refuse every central reservation, through the CLI and the API,
until `fedldp ledger confirm-central` re-enters that release (after which the
cap is spent) or confirms none was made. Broken variant: the same restore with
its epoch marked confirmed by hand publishes ε = 2 against a cap of 1.
"""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from unittest import mock

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from fedldp.collector.ledger import (
    CentralBudgetExhaustedError,
    CentralSpendUnconfirmedError,
    NoCentralCapError,
    NothingToConfirmError,
    open_ledger,
)
from fedldp.collector.ledger import restore as restore_module
from fedldp.collector.ledger.restore import RestoreIncompleteError
from fedldp.collector.ledger.schema import restore_epochs

from fedldp.cli import main


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


class Urls:
    def __init__(self, live: str, restored: str, pg_bin: list[str]) -> None:
        self.live, self.restored, self.pg_bin = live, restored, pg_bin


@pytest.fixture(params=["sqlite", "postgresql"])
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> Urls:
    if request.param == "sqlite":
        return Urls(f"sqlite:///{tmp_path / 'live.db'}", f"sqlite:///{tmp_path / 'new.db'}", [])
    server = request.getfixturevalue("postgresql_server")
    return Urls(
        server.create_database(), server.create_database(), ["--pg-bin", str(server.bindir)]
    )


def _release(url: str, data: Path, key: str) -> Result:
    return _cli(
        "release", "count", "--ledger", url, "--subject", "alice", "--purpose", "stats",
        "--epsilon", "1", "--key", key, "--data", str(data),
    )  # fmt: skip


def _backup_then_spend(urls: Urls, tmp_path: Path) -> tuple[Path, Path]:
    """Cap ε = 1, back up, then spend it all on the live ledger; (backup, data)."""
    data = tmp_path / "data.txt"
    data.write_text("1\n" * 50)
    assert _cli("ledger", "migrate", "--ledger", urls.live).exit_code == 0
    cap = _cli("ledger", "set-cap", "alice", "stats", "--epsilon", "1", "--delta", "0",
               "--ledger", urls.live)  # fmt: skip
    assert cap.exit_code == 0, cap.output
    backup = tmp_path / "backup.bin"
    made = _cli("ledger", "backup", "--ledger", urls.live, *urls.pg_bin, str(backup))
    assert made.exit_code == 0, made.output
    assert _release(urls.live, data, "k1").exit_code == 0
    assert "exceed the cap" in _release(urls.live, data, "k2").output
    return backup, data


def _restore(urls: Urls, backup: Path) -> Result:
    return _cli("ledger", "restore", "--ledger", urls.restored, *urls.pg_bin, str(backup))


def test_restored_ledger_refuses_central_until_the_spend_is_reentered(
    urls: Urls, tmp_path: Path
) -> None:
    backup, data = _backup_then_spend(urls, tmp_path)
    restored = _restore(urls, backup)
    assert restored.exit_code == 0, restored.output
    assert "confirm-central" in restored.output
    refused = _release(urls.restored, data, "k3")
    assert refused.exit_code == 1
    assert "restored from a backup" in refused.output
    assert "fedldp ledger confirm-central" in refused.output
    with open_ledger(urls.restored) as led:  # the API: same refusal, nothing reserved
        with pytest.raises(CentralSpendUnconfirmedError):
            led.reserve(subject="alice", purpose="stats", epsilon=Decimal(1),
                        delta=Decimal(0), idempotency_key="api", now=int(time.time()))  # fmt: skip
        assert led.central_spend("alice", "stats") == (Decimal(0), Decimal(0))
    confirmed = _cli("ledger", "confirm-central", "--ledger", urls.restored,
                     "--spent", "alice", "stats", "1", "0", "--note", "release k1")  # fmt: skip
    assert confirmed.exit_code == 0, confirmed.output
    after = _release(urls.restored, data, "k4")
    assert after.exit_code == 1 and "exceed the cap" in after.output
    with open_ledger(urls.restored) as led:
        assert led.central_spend("alice", "stats") == (Decimal(1), Decimal(0))
        (entry,) = led.reservations("alice", "stats")
        assert entry.status == "settled" and entry.close_reason is not None
        assert [e["action"] for e in led.reservation_log(entry.id)] == ["reentered"]
        assert led.reconcile() == []


def test_broken_variant_without_the_block_spends_the_cap_twice(urls: Urls, tmp_path: Path) -> None:
    backup, data = _backup_then_spend(urls, tmp_path)
    assert _restore(urls, backup).exit_code == 0
    engine = sa.create_engine(urls.restored)
    with engine.begin() as connection:  # the block lifted without re-entering anything
        connection.execute(sa.update(restore_epochs).values(central_confirmed_at=1))
    engine.dispose()
    assert _release(urls.restored, data, "k3").exit_code == 0  # ε = 2 against a cap of 1


def test_confirm_none_and_refusals(tmp_path: Path) -> None:
    live, restored = f"sqlite:///{tmp_path / 'live.db'}", f"sqlite:///{tmp_path / 'r.db'}"
    with open_ledger(live) as led:
        led.set_central_cap("alice", "stats", epsilon_cap=Decimal(1), delta_cap=Decimal(0))
    backup = tmp_path / "b.db"
    assert _cli("ledger", "backup", "--ledger", live, str(backup)).exit_code == 0
    # An unrestored backup copy: blocked, and it cannot be confirmed before a restore.
    with open_ledger(f"sqlite:///{backup}") as led:
        with pytest.raises(CentralSpendUnconfirmedError, match="never restored"):
            led.reserve(subject="alice", purpose="stats", epsilon=Decimal(1),
                        delta=Decimal(0), idempotency_key="x", now=1)  # fmt: skip
        with pytest.raises(NothingToConfirmError, match="ledger restore"):
            led.confirm_central([], now=1)
    assert _cli("ledger", "restore", "--ledger", restored, str(backup)).exit_code == 0
    for bad, code, says in (
        ((), 2, "or --none (no central release was made since)"),
        (("--none", "--spent", "alice", "stats", "1", "0"), 2, "not both"),
        (("--spent", "alice", "stats", "one", "0"), 1, "decimal numbers"),
        (("--spent", "alice", "stats", "0", "0"), 1, "epsilon"),
        (("--spent", "alice", "stats", "1", "0", "--spent", "bob", "stats", "1", "0"), 1, "bob"),
    ):
        out = _cli("ledger", "confirm-central", "--ledger", restored, *bad)
        assert out.exit_code == code and says in out.output, (bad, out.output)
    with open_ledger(restored) as led:  # every refusal changed nothing: still blocked
        assert led.reservations("alice") == []
        with pytest.raises(CentralSpendUnconfirmedError):
            led.reserve(subject="alice", purpose="stats", epsilon=Decimal(1),
                        delta=Decimal(0), idempotency_key="y", now=1)  # fmt: skip
    none = _cli("ledger", "confirm-central", "--ledger", restored, "--none")
    assert none.exit_code == 0, none.output
    again = _cli("ledger", "confirm-central", "--ledger", restored, "--none")
    assert again.exit_code == 1 and "awaits confirmation" in again.output
    with open_ledger(restored) as led:
        led.reserve(subject="alice", purpose="stats", epsilon=Decimal(1), delta=Decimal(0),
                    idempotency_key="z", now=1)  # fmt: skip
        with pytest.raises(CentralBudgetExhaustedError):
            led.reserve(subject="alice", purpose="stats", epsilon=Decimal(1),
                        delta=Decimal(0), idempotency_key="w", now=1)  # fmt: skip
        with pytest.raises(NoCentralCapError):  # the block is gone, the cap rules again
            led.reserve(subject="bob", purpose="stats", epsilon=Decimal(1),
                        delta=Decimal(0), idempotency_key="v", now=1)  # fmt: skip


def test_restore_refuses_a_clock_behind_the_backup(urls: Urls, tmp_path: Path) -> None:
    with open_ledger(urls.live) as led:
        led.set_central_cap("a", "b", epsilon_cap=Decimal(1), delta_cap=Decimal(0))
    backup = tmp_path / "bk.bin"
    assert _cli("ledger", "backup", "--ledger", urls.live, *urls.pg_bin, str(backup)).exit_code == 0
    slow = time.time() - 2 * 86400
    with mock.patch("time.time", return_value=slow):
        out = _restore(urls, backup)
    assert out.exit_code == 1
    assert "fix the clock" in out.output
    if urls.restored.startswith("sqlite"):
        assert not (tmp_path / "new.db").exists()  # nothing left behind
    else:  # the database holds data without its epoch: it will not open
        assert "drop the database" in out.output
        with pytest.raises(RestoreIncompleteError):
            open_ledger(urls.restored)


def test_postgresql_restore_never_serves_before_its_gap(
    postgresql_server: object, tmp_path: Path
) -> None:
    """A collector that opens the database after pg_restore committed and before
    the gap is recorded is refused; broken variant: without the pending mark it
    opens with no gap at all."""
    server = postgresql_server
    live = server.create_database()  # type: ignore[attr-defined]
    pg_bin = ["--pg-bin", str(server.bindir)]  # type: ignore[attr-defined]
    with open_ledger(live) as led:
        led.set_central_cap("a", "b", epsilon_cap=Decimal(1), delta_cap=Decimal(0))
    backup = tmp_path / "bk.dump"
    assert _cli("ledger", "backup", "--ledger", live, *pg_bin, str(backup)).exit_code == 0
    real_record = restore_module.record_restore

    def open_in_between(target: str, seen: list[object]) -> object:
        def record(*args: object, **kwargs: object) -> object:
            try:
                with open_ledger(target) as led:
                    seen.append(led.restore_gaps)
            except RestoreIncompleteError as exc:
                seen.append(exc)
            return real_record(*args, **kwargs)  # type: ignore[arg-type]

        return record

    target = server.create_database()  # type: ignore[attr-defined]
    seen: list[object] = []
    with mock.patch.object(restore_module, "record_restore", open_in_between(target, seen)):
        out = _cli("ledger", "restore", "--ledger", target, *pg_bin, str(backup))
    assert out.exit_code == 0, out.output
    assert len(seen) == 1 and isinstance(seen[0], RestoreIncompleteError)
    with open_ledger(target) as led:
        assert len(led.restore_gaps) == 1

    broken = server.create_database()  # type: ignore[attr-defined]
    seen = []
    with (
        mock.patch.object(restore_module, "record_restore", open_in_between(broken, seen)),
        mock.patch.object(restore_module, "begin_restore", lambda *a, **k: None),
    ):
        assert _cli("ledger", "restore", "--ledger", broken, *pg_bin, str(backup)).exit_code == 0
    assert seen == [()]  # served with no gap: the hole the pending mark closes
