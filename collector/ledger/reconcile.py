"""Reconcile: recompute every running total from the raw rows and list disagreements."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
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
    central_reservations,
    policy_lineage,
    reports,
    spend,
    statistics,
)
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
        compares each statistics n with the stored report count; recomputes
        central commitments from the reservations. An empty list means the ledger is consistent.
        """
        return self.transaction(self._reconcile_tx, write=False)

    def _reconcile_tx(self, conn: sa.Connection) -> list[Mismatch]:
        raw, count_by_policy = _report_sums(conn)
        return [
            *self._spend_mismatches(conn, raw),
            *_statistic_mismatches(conn, count_by_policy),
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
    """Each central cap row's committed (ε, δ) against its reservations' sum, and that
    sum against the cap."""
    out: list[Mismatch] = []
    committed: dict[tuple[str, str], list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for r in conn.execute(sa.select(central_reservations)):
        acc2 = committed[(r.subject, r.purpose)]
        if r.status == "reserved":
            eps, delta = _dec(r.epsilon), _dec(r.delta)
        elif r.status == "settled":
            eps, delta = _dec(r.epsilon_spent), _dec(r.delta_spent)
        else:
            continue
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
        if eps_raw > _dec(cap_row.epsilon_cap) or delta_raw > _dec(cap_row.delta_cap):
            out.append(
                Mismatch(
                    "central_over_cap",
                    ckey[0],
                    scope,
                    f"eps={eps_raw} delta={delta_raw}",
                    f"cap eps={cap_row.epsilon_cap} delta={cap_row.delta_cap}",
                )
            )

    return out
