"""Reconcile: recompute every running total from the raw rows and list disagreements."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import (
    Any,
)

import sqlalchemy as sa
from fedldp.collector.ledger.engine import (
    LedgerCore,
    _SaConn,
)
from fedldp.collector.ledger.model import (
    EXACT,
    Mismatch,
    PolicyVersion,
    _dec,
)
from fedldp.collector.ledger.schema import (
    central_caps,
    central_reservation_log,
    central_reservations,
    policy_lineage,
    reports,
    spend,
    statistics,
)
from fedldp.collector.ledger.statistic_chunks import chunk_mismatches
from fedldp.collector.ledger.versions import (
    _policy_version,
    smallest_cap,
)


class Reconcile(LedgerCore):
    """Audit: every running total recomputed from the raw rows."""

    def reconcile(self) -> list[Mismatch]:
        """Recompute every running total from the raw rows; every disagreement.

        Independent of the running totals: sums each subject's `reports.charge`
        per (policy, window) exactly and compares with `spend`; checks the raw sum
        against the cap in force, the smallest of the caps its reports were
        charged under and of the recorded versions in force during the window;
        checks each window start against its policy id's recorded window length;
        compares each statistics n with the stored report count and with its
        statistic chunks (`statistic_chunks.chunk_mismatches`); recomputes
        central commitments from the reservations and judges each reservation
        against the central cap in force when it was made (a cap lowered later
        below what was spent is no mismatch). An empty list means the ledger is
        consistent.
        """
        return self.transaction(self._reconcile_tx, write=False)

    def _reconcile_tx(self, conn: sa.Connection) -> list[Mismatch]:
        raw, count_by_policy = _report_sums(conn)
        return [
            *self._spend_mismatches(conn, raw),
            *_statistic_mismatches(conn, count_by_policy),
            *chunk_mismatches(conn),
            *_central_mismatches(conn),
        ]

    def _spend_mismatches(
        self, conn: sa.Connection, raw: Mapping[tuple[str, str, int], list[Any]]
    ) -> list[Mismatch]:
        """Each spend row against the raw sums: totals, the cap in force, window starts."""
        out: list[Mismatch] = []
        windows = {
            pid: int(w)
            for pid, w in conn.execute(
                sa.select(policy_lineage.c.policy_id, policy_lineage.c.window_seconds)
            )
        }
        versions: dict[str, list[PolicyVersion]] = defaultdict(list)
        for row in _SaConn(conn).execute(self._sql["select_versions"], ()):
            v = _policy_version(row)
            versions[v.policy_id].append(v)
        recorded = {
            (r.subject, r.policy_id, int(r.window_start)): (
                _dec(r.epsilon_spent),
                int(r.report_count),
            )
            for r in conn.execute(sa.select(spend))
        }
        for key in sorted(set(raw) | set(recorded)):
            spent_raw, n_raw, cap = raw[key] if key in raw else (Decimal(0), 0, None)
            spent_rec, n_rec = recorded.get(key, (Decimal(0), 0))
            scope = f"policy={key[1]} window={key[2]}"
            if spent_raw != spent_rec or n_raw != n_rec:
                out.append(
                    Mismatch(
                        "spend",
                        key[0],
                        scope,
                        f"{spent_raw} ({n_raw} reports)",
                        f"{spent_rec} ({n_rec} reports)",
                    )
                )
            window = windows.get(key[1])
            if cap is not None and window is not None:
                # The cap in force: also every recorded version in force during the window.
                recorded_cap = smallest_cap(versions.get(key[1], ()), key[2], window)
                if recorded_cap is not None and recorded_cap < cap:
                    cap = recorded_cap
            if cap is not None and spent_raw > cap:
                out.append(Mismatch("over_cap", key[0], scope, str(spent_raw), f"cap {cap}"))
            if window is not None and key[2] % window != 0:
                out.append(
                    Mismatch("window", key[0], scope, f"{spent_raw} charged", f"window {window} s")
                )
        return out


#: A stored sealed payload (`output_to_json` of a SealedOutput), as a LIKE pattern.
_SEALED_PAYLOAD = '{"k":"sealed",%'


def _report_sums(
    conn: sa.Connection,
) -> tuple[dict[tuple[str, str, int], list[Any]], dict[tuple[str, int, int], int]]:
    """One streamed pass over the reports: per (subject, policy, window) the exact sum of
    charges, the count and the smallest cap charged under; per (policy, version,
    window) the count of plain (not sealed) reports, those a statistics row counts."""
    raw: dict[tuple[str, str, int], list[Any]] = defaultdict(lambda: [Decimal(0), 0, None])
    count_by_policy: dict[tuple[str, int, int], int] = defaultdict(int)
    rows = conn.execution_options(stream_results=True, yield_per=5000).execute(
        sa.select(
            reports.c.subject,
            reports.c.policy_id,
            reports.c.policy_version,
            reports.c.window_start,
            reports.c.charge,
            reports.c.epsilon_cap,
            reports.c.payload.like(_SEALED_PAYLOAD),
        )
    )
    for subj, pid, ver, win, charge, cap, sealed in rows:
        acc = raw[(subj, pid, int(win))]
        acc[0] = EXACT.add(acc[0], _dec(charge))
        acc[1] += 1
        capd = _dec(cap)
        acc[2] = capd if acc[2] is None else min(acc[2], capd)
        if not sealed:  # a sealed payload (shuffle model) has no statistics row
            count_by_policy[(pid, int(ver), int(win))] += 1
    return raw, count_by_policy


def _statistic_mismatches(
    conn: sa.Connection, count_by_policy: Mapping[tuple[str, int, int], int]
) -> list[Mismatch]:
    """Each statistics row's n against the stored report count of its key."""
    out: list[Mismatch] = []
    stat_n: dict[tuple[str, int, int], int] = defaultdict(int)
    for pid, ver, win, n in conn.execute(
        sa.select(
            statistics.c.policy_id,
            statistics.c.policy_version,
            statistics.c.window_start,
            statistics.c.n,
        )
    ):
        stat_n[(pid, int(ver), int(win))] += int(n)
    for key in sorted(set(stat_n) | set(count_by_policy)):
        if stat_n.get(key, 0) != count_by_policy.get(key, 0):
            out.append(
                Mismatch(
                    "statistic_count",
                    None,
                    f"policy={key[0]} version={key[1]} window={key[2]}",
                    str(count_by_policy.get(key, 0)),
                    str(stat_n.get(key, 0)),
                )
            )

    return out


def _central_mismatches(conn: sa.Connection) -> list[Mismatch]:
    """Each central cap row's committed (ε, δ) against its reservations' sum; each
    reservation against the cap in force when it was made (`_central_over_cap`)."""
    out: list[Mismatch] = []
    committed: dict[tuple[str, str], list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    rows = {r.id: r for r in conn.execute(sa.select(central_reservations))}
    for r in rows.values():
        eps, delta = _committed(r)
        acc2 = committed[(r.subject, r.purpose)]
        acc2[0] = EXACT.add(acc2[0], eps)
        acc2[1] = EXACT.add(acc2[1], delta)
    caps = {(r.subject, r.purpose): r for r in conn.execute(sa.select(central_caps))}
    for ckey in sorted(set(committed) | set(caps)):
        eps_raw, delta_raw = committed[ckey] if ckey in committed else (Decimal(0), Decimal(0))
        scope = f"purpose={ckey[1]}"
        cap_row = caps.get(ckey)
        if cap_row is None:
            out.append(
                Mismatch(
                    "central", ckey[0], scope, f"eps={eps_raw} delta={delta_raw}", "no cap row"
                )
            )
            continue
        eps_rec, delta_rec = _dec(cap_row.epsilon_committed), _dec(cap_row.delta_committed)
        if eps_raw != eps_rec or delta_raw != delta_rec:
            out.append(
                Mismatch(
                    "central",
                    ckey[0],
                    scope,
                    f"eps={eps_raw} delta={delta_raw}",
                    f"eps={eps_rec} delta={delta_rec}",
                )
            )
    out.extend(_central_over_cap(conn, rows, caps))
    return out


def _committed(row: Any) -> tuple[Decimal, Decimal]:
    """What a reservation row holds against its cap now: reserved while open, spent once
    settled, nothing once cancelled."""
    if row.status == "reserved":
        return _dec(row.epsilon), _dec(row.delta)
    if row.status == "settled":
        return _dec(row.epsilon_spent), _dec(row.delta_spent)
    return Decimal(0), Decimal(0)


#: Log actions that close a reservation: what was reserved and not spent leaves the cap.
_CLOSING = frozenset({"settled", "settled_stale", "cancelled"})


def _central_over_cap(
    conn: sa.Connection, rows: Mapping[str, Any], caps: Mapping[tuple[str, str], Any]
) -> list[Mismatch]:
    """Every reservation whose charge exceeded the cap in force when it was made.

    Replays `central_reservation_log` in id order (the order in which caps and
    reservations took effect: schema.py) per (subject, purpose): a "cap_set"
    sets the cap in force, "reserved" adds the row's reserved (ε, δ) and is
    judged (committed ≤ cap), a closing event removes what the row reserved and
    did not spend, "reentered" (spend re-entered after a restore, allowed above
    the cap) adds the row's spend unjudged. Rows with no "reserved" event (made
    before the log existed) count from the start with what they hold now. A
    reservation made before the first recorded cap of its key (ledgers migrated
    by 0007) is judged against that earliest recorded cap, or against today's
    cap row when none was ever logged.
    """
    events = conn.execute(
        sa.select(
            central_reservation_log.c.reservation_id,
            central_reservation_log.c.action,
            central_reservation_log.c.detail_json,
        ).order_by(central_reservation_log.c.id)
    ).all()
    logged = {rid for rid, action, _ in events if action in ("reserved", "reentered")}
    state: dict[tuple[str, str], _CapReplay] = {}

    def replay(key: tuple[str, str]) -> _CapReplay:
        if key not in state:
            state[key] = _CapReplay(key, _first_cap(events, key, caps.get(key)))
        return state[key]

    for r in rows.values():
        if r.id not in logged:
            replay((r.subject, r.purpose)).add(*_committed(r))
    for st in state.values():
        st.judge("(made before the reservation log)")
    for rid, action, detail_json in events:
        if action == "cap_set":
            detail = json.loads(detail_json)
            replay((detail["subject"], detail["purpose"])).cap = (
                _dec(detail["epsilon_cap"]),
                _dec(detail["delta_cap"]),
            )
            continue
        row = rows.get(rid)
        if row is None:
            continue
        st = replay((row.subject, row.purpose))
        if action == "reserved":
            st.add(_dec(row.epsilon), _dec(row.delta))
            st.judge(f"reservation={rid}")
        elif action == "reentered":
            st.add(*_committed(row))
        elif action in _CLOSING:
            spent_eps, spent_delta = _committed(row)
            st.add(
                EXACT.subtract(spent_eps, _dec(row.epsilon)),
                EXACT.subtract(spent_delta, _dec(row.delta)),
            )
    return [m for st in state.values() for m in st.mismatches]


def _first_cap(
    events: Sequence[Any], key: tuple[str, str], cap_row: Any
) -> tuple[Decimal, Decimal] | None:
    """The earliest logged cap of `key`, else its cap row's, else None."""
    for _rid, action, detail_json in events:
        if action == "cap_set":
            d = json.loads(detail_json)
            if (d["subject"], d["purpose"]) == key:
                return _dec(d["epsilon_cap"]), _dec(d["delta_cap"])
    if cap_row is None:
        return None
    return _dec(cap_row.epsilon_cap), _dec(cap_row.delta_cap)


class _CapReplay:
    """One (subject, purpose)'s committed (ε, δ) and cap in force while the log replays."""

    def __init__(self, key: tuple[str, str], cap: tuple[Decimal, Decimal] | None) -> None:
        self.key, self.cap = key, cap
        self.eps, self.delta = Decimal(0), Decimal(0)
        self.mismatches: list[Mismatch] = []

    def add(self, eps: Decimal, delta: Decimal) -> None:
        """Move the committed total by (ε, δ) (negative: released)."""
        self.eps, self.delta = EXACT.add(self.eps, eps), EXACT.add(self.delta, delta)

    def judge(self, what: str) -> None:
        """A "central_over_cap" mismatch when the committed total exceeds the cap in force."""
        if self.cap is None or (self.eps <= self.cap[0] and self.delta <= self.cap[1]):
            return
        self.mismatches.append(
            Mismatch(
                "central_over_cap",
                self.key[0],
                f"purpose={self.key[1]} {what}",
                f"eps={self.eps} delta={self.delta}",
                f"cap in force eps={self.cap[0]} delta={self.cap[1]}",
            )
        )
