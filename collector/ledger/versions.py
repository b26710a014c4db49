"""Policy lineage and recorded policy versions: what caps a charge is checked against."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import (
    Any,
)

import sqlalchemy as sa
from fedldp.collector.ledger.engine import (
    LedgerCore,
    _Driver,
    _SaConn,
)
from fedldp.collector.ledger.model import (
    LedgerPolicy,
    PolicyLineage,
    PolicyVersion,
    _dec,
    _s,
)
from fedldp.collector.ledger.schema import (
    policy_lineage,
    policy_version_generation,
    policy_versions,
)


def smallest_cap(
    versions: Iterable[PolicyVersion], window_start: int, window_seconds: int
) -> Decimal | None:
    """The smallest cap among `versions` in force during the window; None if none is."""
    caps = [v.epsilon_cap for v in versions if v.overlaps(window_start, window_seconds)]
    return min(caps) if caps else None


def lowered_window(
    candidate: PolicyVersion, recorded: Sequence[PolicyVersion], now: int
) -> int | None:
    """The first window that has begun at `now` in which `candidate` would lower the
    cap in force below every recorded version in force during it; None if none.

    Windows are the candidate's (every version of a policy id has one length,
    `claim_lineage`). A window with no recorded version in force has had no charge
    under this ledger's rule (every version that accepts reports is recorded first),
    so a candidate lowers nothing there. The smallest recorded cap only changes
    where a recorded version's first or last window starts or ends, so those
    windows and the candidate's first are the only ones checked.
    """
    w = candidate.window_seconds
    first = candidate.not_before // w
    last = min(-(-candidate.expires_at // w) - 1, now // w)  # begun: k * w <= now
    points = {first}
    for v in recorded:
        points.update((v.not_before // w, -(-v.expires_at // w)))
    for k in sorted(p for p in points if first <= p <= last):
        cap = smallest_cap(recorded, k * w, w)
        if cap is not None and candidate.epsilon_cap < cap:
            return k * w
    return None


@dataclass(frozen=True)
class _Versions:
    """The recorded versions as last read, by policy id, with their generation."""

    generation: int
    by_policy: Mapping[str, tuple[PolicyVersion, ...]]
    #: (policy id, window start, window length) -> `smallest_cap` (memo, bounded)
    caps: dict[tuple[str, int, int], Decimal | None] = field(default_factory=dict)


def _policy_version(row: Sequence[Any]) -> PolicyVersion:
    """A `select_versions` row as a PolicyVersion."""
    pid, version, cap, window, not_before, expires_at, digest, recorded_at = row
    return PolicyVersion(
        pid,
        int(version),
        _dec(cap),
        int(window),
        int(not_before),
        int(expires_at),
        bytes(digest),
        int(recorded_at),
    )


def _lineage(row: Any) -> PolicyLineage:
    return PolicyLineage(
        row.policy_id,
        row.metric_name,
        int(row.window_seconds),
        int(row.first_version),
        int(row.recorded_at),
    )


class PolicyVersions(LedgerCore):
    """Policy lineages and recorded versions, and the cap in force they imply."""

    _versions: _Versions

    def _init_versions(self) -> None:
        """Read the recorded versions into the cache (one read transaction)."""
        #: The recorded policy versions (`record_versions`) as last read, and the
        #: smallest cap per (policy id, window start, window length) worked out from
        #: them; both replaced together when a transaction reads a newer generation.
        self._versions = _Versions(-1, {})
        self.transaction(lambda conn: self._load_versions(_SaConn(conn)), write=False)

    # -- policy lineage --

    def claim_lineage(
        self, policy_id: str, metric_name: str, window_seconds: int, version: int, *, now: int
    ) -> PolicyLineage:
        """Record (policy id, metric name, window) unless recorded; the lineage that decides.

        Returns `policy_id`'s recorded lineage (just recorded by this call, or
        earlier), or, when `policy_id` has none and another policy id holds
        `metric_name`, that policy id's lineage: `PolicyLineage.refusal` says
        whether this version fits. Concurrent claims (collectors sharing one
        PostgreSQL ledger, or processes on one SQLite file) agree: the primary key
        and the unique metric name let exactly one insert win, and every other
        claim reads the winner's row (SQLite: BEGIN IMMEDIATE serializes them;
        PostgreSQL READ COMMITTED: ON CONFLICT DO NOTHING waits for the winner's
        commit and the next statement sees it; SERIALIZABLE: the loser's
        transaction is rerun).
        """
        if not policy_id or not metric_name:
            raise ValueError("policy_id and metric_name must be non-empty")
        if window_seconds <= 0:
            raise ValueError("window_seconds must be positive")

        def tx(conn: sa.Connection) -> PolicyLineage:
            conn.execute(
                self._insert_ignore(policy_lineage),
                [
                    {
                        "policy_id": policy_id,
                        "metric_name": metric_name,
                        "window_seconds": window_seconds,
                        "first_version": version,
                        "recorded_at": now,
                    }
                ],
            )
            for column, value in (
                (policy_lineage.c.policy_id, policy_id),
                (policy_lineage.c.metric_name, metric_name),
            ):
                row = conn.execute(sa.select(policy_lineage).where(column == value)).first()
                if row is not None:
                    return _lineage(row)
            raise RuntimeError(f"policy lineage of {policy_id!r} neither recorded nor found")

        return self.transaction(tx)

    def lineages(self) -> list[PolicyLineage]:
        """Every recorded policy lineage, by policy id."""

        def tx(conn: sa.Connection) -> list[PolicyLineage]:
            q = sa.select(policy_lineage).order_by(policy_lineage.c.policy_id)
            return [_lineage(r) for r in conn.execute(q)]

        return self.transaction(tx, write=False)

    # -- policy versions --

    def record_versions(
        self, versions: Sequence[PolicyVersion], *, clock: Callable[[], int]
    ) -> dict[tuple[str, int], str]:
        """Record each version not recorded yet, in one transaction; the refused ones.

        Returns {(policy id, version): why} for the versions that must not be
        activated; every other one is recorded (or was already, with the same
        digest). Refused, with a stable reason word first:

        * ``version_conflict``: the ledger holds other bytes (digest) for this
          (policy id, version), recorded by another collector;
        * ``cap_lowered``: the version is new to this ledger and its cap is below
          the cap in force (the smallest recorded cap) of a window of its validity
          that has already begun (`lowered_window`): spend made in that window
          before it was recorded could exceed it. Sign it with a `not_before` in a
          window that has not begun yet.

        Versions recorded together count as recorded at once (no charge can fall
        between them). The rule is decided at `clock()` read after every charge in
        progress has ended and before any other starts: on PostgreSQL the
        transaction first locks the spend table (EXCLUSIVE mode: charges lock
        their spend rows, so they wait, and the generation they read after that
        lock is this one's); on SQLite the writer lock does the same. A
        recorded version bumps the generation, so every collector's next charge
        transaction re-reads the versions.
        """

        def tx(conn: sa.Connection) -> dict[tuple[str, int], str]:
            if self.dialect == "postgresql":
                conn.exec_driver_sql("LOCK TABLE spend IN EXCLUSIVE MODE")
            now = clock()
            recorded: dict[str, list[PolicyVersion]] = defaultdict(list)
            for row in _SaConn(conn).execute(self._sql["select_versions"], ()):
                v = _policy_version(row)
                recorded[v.policy_id].append(v)
            known = {(v.policy_id, v.version): v for vs in recorded.values() for v in vs}
            refused: dict[tuple[str, int], str] = {}
            new: list[PolicyVersion] = []
            for v in sorted(versions, key=lambda x: (x.policy_id, x.version)):
                key = (v.policy_id, v.version)
                prior = known.get(key)
                if prior is not None:
                    if prior.digest != v.digest:
                        refused[key] = (
                            f"version_conflict: policy {v.policy_id!r} v{v.version} is recorded "
                            "in the ledger with other contents (another signed envelope for "
                            "the same version); publish one envelope per version"
                        )
                    continue
                lowered = lowered_window(v, recorded.get(v.policy_id, ()), now)
                if lowered is not None:
                    refused[key] = (
                        f"cap_lowered: policy {v.policy_id!r} v{v.version} (cap {v.epsilon_cap}) "
                        f"would lower the cap in force of the window starting at {lowered}, "
                        "which began before the version was recorded: spend already made "
                        "in it may exceed the new cap; sign it with not_before in a window "
                        "that has not begun (a lower cap takes effect from a window start)"
                    )
                    continue
                new.append(dataclasses.replace(v, recorded_at=now))
            if new:
                conn.execute(
                    sa.insert(policy_versions),
                    [
                        {
                            "policy_id": v.policy_id,
                            "version": v.version,
                            "epsilon_cap": _s(v.epsilon_cap),
                            "window_seconds": v.window_seconds,
                            "not_before": v.not_before,
                            "expires_at": v.expires_at,
                            "digest": v.digest,
                            "recorded_at": v.recorded_at,
                        }
                        for v in new
                    ],
                )
                conn.execute(
                    sa.update(policy_version_generation)
                    .where(policy_version_generation.c.id == 1)
                    .values(generation=policy_version_generation.c.generation + 1)
                )
            return refused

        return self.transaction(tx)

    def policy_versions(self) -> list[PolicyVersion]:
        """Every recorded policy version, by (policy id, version)."""

        def tx(conn: sa.Connection) -> list[PolicyVersion]:
            return [
                _policy_version(r) for r in _SaConn(conn).execute(self._sql["select_versions"], ())
            ]

        return self.transaction(tx, write=False)

    def cap_in_force(self, policy: LedgerPolicy, window_start: int) -> Decimal:
        """The cap a charge of `policy` in this window is checked against now: its cap
        lowered to the smallest cap of the recorded versions in force during the
        window (re-read when their generation changed). A restore gap is not
        applied here (GetBudget shows it separately)."""

        def tx(conn: sa.Connection) -> None:
            db = _SaConn(conn)
            if self._read_generation(db) != self._versions.generation:
                self._load_versions(db)

        self.transaction(tx, write=False)
        return self._cap_in_force(policy, window_start)

    def _cap_in_force(
        self, policy: LedgerPolicy, window_start: int, versions: _Versions | None = None
    ) -> Decimal:
        """The policy's cap, lowered to the smallest cap of the recorded versions of
        its policy id in force during the window (`versions`: the cached ones)."""
        vs = self._versions if versions is None else versions
        key = (policy.policy_id, window_start, policy.window_seconds)
        try:
            recorded = vs.caps[key]
        except KeyError:
            recorded = smallest_cap(
                vs.by_policy.get(policy.policy_id, ()), window_start, policy.window_seconds
            )
            if len(vs.caps) >= 4096:
                vs.caps.clear()
            vs.caps[key] = recorded
        cap = policy.epsilon_cap
        return cap if recorded is None or cap <= recorded else recorded

    def _read_generation(self, db: _Driver | _SaConn, *, charging: bool = False) -> int:
        """The recorded versions' generation (one primary-key read). A charge
        (`charging`) under PostgreSQL's SERIALIZABLE reads it FOR SHARE: a
        transaction whose snapshot predates a version's recording then fails with
        a serialization error and reruns with a fresh snapshot."""
        sql = self._sql["select_generation"]
        if charging and self.isolation == "SERIALIZABLE" and self.dialect == "postgresql":
            sql += " FOR SHARE"
        ((generation,),) = db.execute(sql, ())
        return int(generation)

    def _load_versions(self, db: _Driver | _SaConn) -> None:
        """Read every recorded version and its generation (one transaction) into the cache."""
        generation = self._read_generation(db)
        by_policy: dict[str, list[PolicyVersion]] = defaultdict(list)
        for row in db.execute(self._sql["select_versions"], ()):
            v = _policy_version(row)
            by_policy[v.policy_id].append(v)
        self._versions = _Versions(generation, {k: tuple(v) for k, v in by_policy.items()})
