"""LDP ingestion: check-and-charge and store reports, in group-commit transactions."""

from __future__ import annotations

import decimal
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import chain
from typing import (
    TYPE_CHECKING,
    Any,
    NamedTuple,
    NoReturn,
    TypeVar,
)

import sqlalchemy as sa
from fedldp.client.mechanisms.base import SealedOutput
from fedldp.collector.ledger import restore
from fedldp.collector.ledger.engine import (
    _ConcurrentUpdateError,
    _Driver,
    _StoredIdError,
)
from fedldp.collector.ledger.model import (
    ACCEPTED,
    BUDGET_EXHAUSTED,
    CONFLICT,
    DUPLICATE,
    EXACT,
    CheckedReport,
    LedgerPolicy,
    OutcomeValue,
    SubmitBatch,
    _dec,
    _s,
)
from fedldp.collector.ledger.sql import (
    _IN_IDS,
    _IN_KEYS,
    _ROW_CHUNKS,
    _blob_parameter,
    _chunks,
    _padded_chunks,
    _row_chunk_sizes,
    copy_reports_statement,
    insert_reports_statements,
)
from fedldp.collector.ledger.statistic_chunks import append_chunks
from fedldp.collector.ledger.versions import (
    PolicyVersions,
    _Versions,
)
from fedldp.collector.wire import output_to_json

if TYPE_CHECKING:
    from fedldp.client.mechanisms.base import Output


T = TypeVar("T")

#: After a group met a report id stored before, this many groups read their ids
#: before deciding (see `Ledger.submit_many`).
_READ_IDS_AFTER_A_REPEAT = 64
#: The cap of a window a restore gap refuses: every charge exceeds it (ε > 0).
_NOTHING_FITS = Decimal(-1)


@dataclass
class _SpendState:
    spent: Decimal
    count: int
    cap: Decimal
    read_text: str  # epsilon_spent as read: the compare-and-set condition of the update
    dirty: bool = False


class _Run(NamedTuple):
    """Consecutive reports of one batch under one policy, as `_plan_group` made them."""

    key: tuple[str, str, int]  # the spend row: (subject, policy id, window start)
    stat_key: tuple[str, int, int]  # the statistics row: (policy id, version, window start)
    epsilon: Decimal  # charged per report
    cap: Decimal  # the cap in force (`Ledger._window_cap`) as of the plan's generation
    policy: LedgerPolicy
    reports: list[CheckedReport]
    #: the policy's `_REPORT_POLICY_COLUMNS` values (one tuple object per policy)
    shared: tuple[Any, ...]
    rows: list[tuple[Any, ...]]  # each report's `_REPORT_OWN_COLUMNS` values
    outputs: list[Output]


@dataclass
class _GroupPlan:
    """A group transaction's inputs that depend on the requests alone, not on the
    ledger's state: made once, before the transaction, and reused by its reruns."""

    ids: set[bytes]
    repeated: bool  # some id occurs twice in the group
    latest_now: int
    generation: int  # of the recorded versions the runs' caps were worked out with
    keys: set[tuple[str, str, int]] = field(default_factory=set)  # every run's spend row
    runs: list[list[_Run]] = field(default_factory=list)  # per batch, in order
    # statistics row -> the first policy seen for it, and every output of the group
    # for it accumulated (with their count)
    policies: dict[tuple[str, int, int], LedgerPolicy] = field(default_factory=dict)
    statistics: dict[tuple[str, int, int], tuple[Any, int]] = field(default_factory=dict)


class _Decisions(NamedTuple):
    """What `_decide` settled for a group, for `Ingestion._submit_rows` to write."""

    outcomes: list[list[OutcomeValue]]  # per batch, per report, in order
    #: id(policy's shared values) -> (those values, the accepted reports' rows)
    new_reports: dict[int, tuple[tuple[Any, ...], list[tuple[Any, ...]]]]
    new_conflicts: list[tuple[bytes, str, bytes, int]]
    #: (policy id, version, window) -> the outputs accepted now, for statistics
    accepted: dict[tuple[str, int, int], list[Output]]
    #: Ids of reports refused for the cap without reading the stored ids: they are
    #: not inserted, so the primary key cannot tell whether one is a DUPLICATE.
    refused: list[bytes]


def _decide(
    batches: Sequence[SubmitBatch],
    plan: _GroupPlan,
    state: Mapping[tuple[str, str, int], _SpendState],
    known: dict[bytes, tuple[str, bytes]],
    *,
    unique: bool,
    read_ids: bool,
) -> _Decisions:
    """Each report's outcome, in order, charging `state` in place (marked dirty) and
    adding accepted ids to `known` (when not `unique`). Every sum and comparison runs
    in EXACT: any rounding raises."""
    outcomes: list[list[OutcomeValue]] = []
    new_reports: dict[int, tuple[tuple[Any, ...], list[tuple[Any, ...]]]] = {}
    new_conflicts: list[tuple[bytes, str, bytes, int]] = []
    accepted: dict[tuple[str, int, int], list[Output]] = {}
    refused: list[bytes] = []
    with decimal.localcontext(EXACT):
        for b, runs in zip(batches, plan.runs, strict=True):
            out: list[OutcomeValue] = []
            subject, now = b.subject, b.now
            for run in runs:
                outputs = accepted.get(run.stat_key)
                if outputs is None:
                    outputs = accepted[run.stat_key] = []
                slot = new_reports.get(id(run.shared))
                if slot is None:
                    slot = new_reports[id(run.shared)] = (run.shared, [])
                rows = slot[1]
                eps, cap = run.epsilon, run.cap
                if unique:
                    st = state[run.key]
                    # The whole run fits under the cap (the common case): the
                    # same outcome as charging its reports one by one, in order.
                    total = st.spent + eps * len(run.rows)
                    if total <= cap:
                        st.spent, st.count, st.cap, st.dirty = (
                            total,
                            st.count + len(run.rows),
                            cap,
                            True,
                        )
                        rows.extend(run.rows)
                        outputs.extend(run.outputs)
                        out.extend([ACCEPTED] * len(run.rows))
                        continue
                for report, row, output in zip(run.reports, run.rows, run.outputs, strict=True):
                    rid, digest = report[0], report[3]
                    if not unique:
                        prior = known.get(rid)
                        if prior is not None:
                            if prior == (subject, digest):
                                out.append(DUPLICATE)
                            else:
                                out.append(CONFLICT)
                                new_conflicts.append((rid, subject, digest, now))
                            continue
                    st = state[run.key]
                    total = st.spent + eps
                    if total > cap:
                        out.append(BUDGET_EXHAUSTED)
                        if not read_ids:
                            refused.append(rid)
                        continue
                    st.spent, st.count, st.cap, st.dirty = total, st.count + 1, cap, True
                    if not unique:
                        known[rid] = (subject, digest)
                    rows.append(row)
                    outputs.append(output)
                    out.append(ACCEPTED)
            outcomes.append(out)
    return _Decisions(outcomes, new_reports, new_conflicts, accepted, refused)


class Ingestion(PolicyVersions):
    """Check-and-charge and store reports (`submit`, `submit_many`): the hot path."""

    _insert_reports_sql: dict[int, str]
    _copy_reports_sql: str
    _stats_cache: dict[tuple[str, int, int], tuple[int, str]]
    _stats_lock: threading.Lock
    stored_id_reruns: int
    _read_ids_groups: int

    def _init_ingestion(self) -> None:
        """The ingestion state: its INSERT/COPY statements and caches (empty)."""
        # Reports go in with multi-row INSERTs on SQLite (32766 bound variables at
        # most since 3.32), one policy's reports per statement, its shared columns
        # bound once; with COPY on PostgreSQL.
        self._insert_reports_sql = insert_reports_statements()
        self._copy_reports_sql = copy_reports_statement()
        # (policy id, version, window) -> (n, statistic_json) of this shard's row as
        # last committed by this Ledger (see `_merge_statistics`).
        self._stats_cache = {}
        self._stats_lock = threading.Lock()
        #: groups rerun because a report id had been stored before (observability)
        self.stored_id_reruns = 0
        self._read_ids_groups = 0  # groups still to read their ids first

    def _window_cap(
        self, policy: LedgerPolicy, window_start: int, versions: _Versions | None = None
    ) -> Decimal:
        """The cap charges in this window are checked against: the cap in force
        (`_cap_in_force`), or below zero (nothing fits: BUDGET_EXHAUSTED) when the
        window overlaps the gap of a restore from a backup (restore.py states the
        rule)."""
        gaps = self.restore_gaps
        if gaps and restore.refused_by(gaps, window_start, policy.window_seconds):
            return _NOTHING_FITS
        return self._cap_in_force(policy, window_start, versions)

    def submit(
        self, subject: str, reports_in: Sequence[CheckedReport], *, now: int
    ) -> list[OutcomeValue]:
        """Charge and store `reports_in` for `subject` in one transaction.

        Returns one Outcome per report, in order: ACCEPTED (stored and charged
        now), DUPLICATE (same id and content as a stored report: nothing charged),
        BUDGET_EXHAUSTED (charging it would exceed the policy's cap for the
        window, or the window overlaps a restore gap, restore.py: nothing stored)
        or CONFLICT (id used before with other content or
        by another subject: nothing stored; the attempt is recorded). Acknowledge
        only after this returns: it returns after the commit.
        """
        return self.submit_many([SubmitBatch(subject, reports_in, now)])[0]

    def submit_many(self, batches: Sequence[SubmitBatch]) -> list[list[OutcomeValue]]:
        """`submit` for several requests in one transaction (group commit)."""
        if not any(b.reports for b in batches):
            return [[] for _ in batches]
        for b in batches:
            if not b.subject:
                raise ValueError("subject must be non-empty")
        # What depends on the requests alone is worked out before the transaction:
        # with several collector processes on one SQLite file, while another
        # process holds the writer lock (sqlite_ingest.py), not inside it.
        plan = self._plan_group(batches)
        cached: dict[tuple[str, int, int], tuple[int, str]] = {}
        # Reading a group's ids before deciding (to answer DUPLICATE or CONFLICT)
        # is costly inside the transaction (docs/performance.md), and most groups
        # have none stored before. So unless the group repeats an id itself or a recent
        # group met a stored one, its reports are decided as new; the primary key
        # still refuses a stored id at the insert, and then the transaction rolls
        # back and reruns reading the ids (`_StoredIdError`): the same outcomes.
        read_ids = [plan.repeated or self._read_ids_groups > 0]
        self._read_ids_groups = max(0, self._read_ids_groups - 1)

        def tx(db: _Driver) -> list[list[OutcomeValue]]:
            cached.clear()  # a rerun starts from what this attempt reads
            reading, read_ids[0] = read_ids[0], True  # every rerun reads them
            return self._submit_rows(db, batches, plan, cached, read_ids=reading)

        try:
            if self._ingest is not None:
                outcomes = self._ingest_transaction(tx)
            else:
                outcomes = self.transaction(lambda conn: self._with_driver(conn.connection, tx))
        except BaseException:
            self._forget_statistics(cached)
            raise
        # Committed: what this transaction wrote is the latest state of its rows.
        with self._stats_lock:
            if len(self._stats_cache) > 4096:  # one row per (policy, version, window)
                self._stats_cache.clear()
            self._stats_cache.update(cached)
        return outcomes

    def _with_driver(self, dbapi_connection: Any, fn: Callable[[_Driver], T]) -> T:
        """`fn` on a `_Driver` over `dbapi_connection` (closed afterwards)."""
        db = _Driver(dbapi_connection, self._dbapi_error)
        try:
            return fn(db)
        finally:
            db.close()

    def _ingest_transaction(self, fn: Callable[[_Driver], T]) -> T:
        """`transaction` on SQLite's ingestion connection (sqlite_ingest.py):
        BEGIN IMMEDIATE, `fn`, COMMIT (durable: synchronous=FULL); reruns `fn`
        like `transaction` does."""
        ingest = self._ingest
        assert ingest is not None

        def attempt() -> T:
            with ingest.lock:
                conn = ingest.connection()

                def in_transaction(db: _Driver) -> T:
                    db.run("BEGIN IMMEDIATE", ())
                    try:
                        result = fn(db)
                        db.run("COMMIT", ())
                    except BaseException:
                        conn.rollback()
                        raise
                    return result

                return self._with_driver(conn, in_transaction)

        return self._retrying(attempt)

    def _plan_group(self, batches: Sequence[SubmitBatch]) -> _GroupPlan:
        """The part of a group's transaction that depends on the requests alone (no
        ledger state): each batch's runs of one policy with their rows as they will
        be inserted, and every output accumulated per statistics row."""
        # A CheckedReport is the tuple (report_id, policy, output, content_digest,
        # coarse_time): the loop indexes and unpacks it rather than call its
        # properties (a Python call each).
        ids = {r[0] for b in batches for r in b.reports}
        versions = self._versions  # one snapshot of the cache for the whole plan
        plan = _GroupPlan(
            ids=ids,
            repeated=len(ids) != sum(len(b.reports) for b in batches),
            latest_now=max(b.now for b in batches),
            generation=versions.generation,
        )
        blob = _blob_parameter(self.dialect)
        shard = self.shard
        # (id(policy), window) -> its `_REPORT_POLICY_COLUMNS` values (the cap is the
        # one in force in the window); policies are compared by identity
        # (VerifiedPolicy instances are immutable and alive during the call).
        shared_values: dict[tuple[int, int], tuple[Any, ...]] = {}
        # id(output) -> its stored form: the service passes one object for equal
        # category outputs (outputs are alive, hence ids distinct, during the call).
        payloads: dict[int, str] = {}
        for b in batches:
            subject, now = b.subject, b.now
            runs: list[_Run] = []
            current: LedgerPolicy | None = None
            rows: list[tuple[Any, ...]] = []
            outputs: list[Output] = []
            run_reports: list[CheckedReport] = []
            for report in b.reports:
                rid, pol, output, digest, ct = report
                if pol is not current:  # a new run: what its reports share
                    current = pol
                    pid, version, window = pol.policy_id, pol.version, pol.window_start(now)
                    shared = shared_values.get((id(pol), window))
                    if shared is None:
                        shared = shared_values[(id(pol), window)] = (
                            pid,
                            version,
                            blob(pol.digest),
                            _s(pol.charge),
                            _s(self._cap_in_force(pol, window, versions)),
                            shard,
                        )
                    stat_key = (pid, version, window)
                    plan.policies.setdefault(stat_key, pol)
                    rows, outputs, run_reports = [], [], []
                    runs.append(
                        _Run(
                            (subject, pid, window),
                            stat_key,
                            pol.charge,
                            self._window_cap(pol, window, versions),
                            pol,
                            run_reports,
                            shared,
                            rows,
                            outputs,
                        )
                    )
                    plan.keys.add((subject, pid, window))
                payload = payloads.get(id(output))
                if payload is None:
                    payload = payloads[id(output)] = output_to_json(output)
                run_reports.append(report)
                outputs.append(output)
                rows.append((blob(rid), subject, window, ct, blob(digest), payload, now))
            plan.runs.append(runs)
        # Every output accumulated per statistics row, as if all were accepted (the
        # common case; `_merge_statistics` accumulates again when some were not).
        by_key: dict[tuple[str, int, int], list[Output]] = defaultdict(list)
        for runs in plan.runs:
            for run in runs:
                by_key[run.stat_key].extend(run.outputs)
        for key, outputs in by_key.items():
            if outputs and type(outputs[0]) is SealedOutput:
                # A shuffle-model policy: its payloads are ciphertexts, stored for the
                # shuffler only, never accumulated (docs/shuffle.md); no statistics row.
                continue
            mech = plan.policies[key].mechanism
            stat = mech.new_statistic()
            accumulate = mech.accumulate
            for o in outputs:
                accumulate(stat, o)
            plan.statistics[key] = (stat, len(outputs))
        return plan

    def _submit_rows(
        self,
        db: _Driver,
        batches: Sequence[SubmitBatch],
        plan: _GroupPlan,
        written: dict[tuple[str, int, int], tuple[int, str]],
        *,
        read_ids: bool,
    ) -> list[list[OutcomeValue]]:
        """The state-dependent part of a group's transaction (the writer lock is held):
        decide each report's outcome from the stored ids and spend rows, and write.
        Everything that depends on the requests alone is in `plan`, made before."""
        known = self._stored_ids(db, plan.ids) if read_ids else {}
        if known:
            self._read_ids_groups = _READ_IDS_AFTER_A_REPEAT
        # No id stored before and none in two of the group's requests (the common
        # case): no report can be a DUPLICATE or a CONFLICT, none needs a lookup.
        unique = not known and not plan.repeated
        state = self._locked_spend(db, plan, known, unique)
        decided = _decide(batches, plan, state, known, unique=unique, read_ids=read_ids)
        if decided.refused and self._stored_ids(db, set(decided.refused)):
            self._stored_id_met()
        try:
            self._insert_reports(db, decided.new_reports)
        except sa.exc.IntegrityError as exc:  # an id is stored (or was just inserted)
            if read_ids:
                raise
            self._stored_id_met(exc)
        if decided.new_conflicts:
            db.executemany(self._sql["insert_conflicts"], decided.new_conflicts)
        self._write_spend(db, state, plan.latest_now)
        # (A run may have accepted nothing: its statistics row stays as it is.)
        # (Sealed outputs have no statistics: `_plan_group` made no entry for them.)
        stats = plan.statistics
        accepted = {k: outs for k, outs in decided.accepted.items() if outs and k in stats}
        if accepted:
            self._merge_statistics(db, plan, accepted, plan.latest_now, written)
        return decided.outcomes

    def _locked_spend(
        self,
        db: _Driver,
        plan: _GroupPlan,
        known: Mapping[bytes, tuple[str, bytes]],
        unique: bool,
    ) -> dict[tuple[str, str, int], _SpendState]:
        """Lock and read the spend rows the group may charge (every run's when `unique`,
        else only those of runs with a report not stored yet), then make sure the runs'
        caps were worked out with the recorded versions' current generation."""
        if unique:
            keys = plan.keys
        else:
            keys = {
                run.key
                for runs in plan.runs
                for run in runs
                if any(r[0] not in known for r in run.reports)
            }
        state = self._lock_spend(db, sorted(keys), plan.latest_now)
        # The recorded versions' generation, read AFTER the spend rows are locked: a
        # transaction recording a version (`record_versions`) holds the spend table
        # locked on PostgreSQL and the writer lock on SQLite, so either it committed
        # before this read (and this read sees its generation) or it waits for this
        # transaction to end. Caps worked out with an older generation are redone.
        generation = self._read_generation(db, charging=True)
        if generation != plan.generation:
            if generation != self._versions.generation:
                self._load_versions(db)
            self._recap(plan)
        return state

    def _write_spend(
        self, db: _Driver, state: Mapping[tuple[str, str, int], _SpendState], now: int
    ) -> None:
        """Write the changed spend rows back; _ConcurrentUpdateError (the transaction
        reruns) when any of them moved since it was read."""
        dirty = [
            (_s(st.spent), st.count, _s(st.cap), now, k[0], k[1], k[2], st.read_text)
            for k, st in state.items()
            if st.dirty
        ]
        if not dirty:
            return
        # An atomic conditional update (compare-and-set on the value read under
        # FOR UPDATE): if anything changed the row meanwhile, nothing is
        # written and the whole transaction reruns.
        if self.dialect == "sqlite":
            changed = 0
            for spend_rows in _chunks(dirty, _ROW_CHUNKS[0]):
                changed += db.run(
                    self._in_sql("update_spend_values", len(spend_rows)),
                    list(chain.from_iterable(spend_rows)),
                )
        else:
            changed = db.executemany(self._sql["update_spend"], dirty)
        if changed != len(dirty):
            raise _ConcurrentUpdateError(f"{len(dirty) - changed} spend row(s) moved")

    def _recap(self, plan: _GroupPlan) -> None:
        """Work out the runs' caps again with the cached versions (a newer generation)."""
        versions = self._versions
        shared_now: dict[int, tuple[Any, ...]] = {}
        for runs in plan.runs:
            for i, run in enumerate(runs):
                window = run.key[2]
                shared = shared_now.get(id(run.shared))
                if shared is None:
                    cap_text = _s(self._cap_in_force(run.policy, window, versions))
                    shared = shared_now[id(run.shared)] = (*run.shared[:4], cap_text, run.shared[5])
                cap = self._window_cap(run.policy, window, versions)
                runs[i] = run._replace(cap=cap, shared=shared)
        plan.generation = versions.generation

    def _stored_id_met(self, cause: BaseException | None = None) -> NoReturn:
        """A group decided without reading its ids met a stored one: rerun it reading
        them, and so the next `_READ_IDS_AFTER_A_REPEAT` groups too."""
        self._read_ids_groups = _READ_IDS_AFTER_A_REPEAT
        self.stored_id_reruns += 1
        raise _StoredIdError("a report id was stored before") from cause

    def _insert_reports(
        self, db: _Driver, new_reports: Mapping[int, tuple[tuple[Any, ...], list[tuple[Any, ...]]]]
    ) -> None:
        """Insert the accepted reports: per policy, its shared values and the rows."""
        for shared, rows in new_reports.values():
            if not rows:
                continue
            if self.dialect == "sqlite":
                # Multi-row INSERTs of a few fixed sizes: one statement step (hence
                # one release of the GIL, see _ROW_CHUNKS) per up to 256 rows.
                done = 0
                for size in _row_chunk_sizes(len(rows)):
                    chunk = rows[done : done + size]
                    done += size
                    db.run(self._insert_reports_sql[size], [*shared, *chain.from_iterable(chunk)])
            else:
                # COPY: one stream, ≈ 4× less time per row than a pipelined
                # executemany (bench in docs/collector.md). A concurrent insert of the
                # same id fails it with 23505 (an IntegrityError), and the
                # transaction reruns.
                db.copy(self._copy_reports_sql, [shared + row for row in rows])

    def _stored_ids(self, db: _Driver, ids: set[bytes]) -> dict[bytes, tuple[str, bytes]]:
        """(subject, content digest) of every stored report among `ids`."""
        known: dict[bytes, tuple[str, bytes]] = {}
        blob = _blob_parameter(self.dialect)
        for chunk in _padded_chunks(list(ids), _IN_IDS):
            params = list(map(blob, chunk))
            for rid, subj, digest in db.execute(self._in_sql("select_ids", len(chunk)), params):
                known[bytes(rid)] = (subj, bytes(digest))
        return known

    def _lock_spend(
        self, db: _Driver, keys: Sequence[tuple[str, str, int]], now: int
    ) -> dict[tuple[str, str, int], _SpendState]:
        """Lock the spend rows of `keys` (FOR UPDATE), creating missing ones; their state.

        Rows are read first and only the missing ones inserted (ON CONFLICT DO
        NOTHING, then read again): a subject's row exists after its first report,
        so the common transaction has no insert here.
        """
        state: dict[tuple[str, str, int], _SpendState] = {}
        if not keys:
            return state
        self._read_spend(db, keys, state)
        missing = [k for k in keys if k not in state]
        if missing:
            db.executemany(
                self._sql["ensure_spend"], [(subj, pid, win, now) for subj, pid, win in missing]
            )
            self._read_spend(db, missing, state)
            lost = [k for k in missing if k not in state]
            if lost:  # cannot happen: the rows were just ensured inside this transaction
                raise RuntimeError(f"spend rows vanished inside a transaction: {len(lost)}")
        return state

    def _read_spend(
        self,
        db: _Driver,
        keys: Sequence[tuple[str, str, int]],
        state: dict[tuple[str, str, int], _SpendState],
    ) -> None:
        for chunk in _padded_chunks(keys, _IN_KEYS):
            rows = db.execute(
                self._in_sql("select_spend", len(chunk)), [v for key in chunk for v in key]
            )
            for subj, pid, win, spent_text, count, cap in rows:
                state[(subj, pid, int(win))] = _SpendState(
                    _dec(spent_text), int(count), _dec(cap), spent_text
                )

    def _merge_statistics(
        self,
        db: _Driver,
        plan: _GroupPlan,
        accepted: Mapping[tuple[str, int, int], list[Output]],
        now: int,
        written: dict[tuple[str, int, int], tuple[int, str]],
    ) -> None:
        """Add the accepted outputs to this shard's statistics rows.

        new = stored ⊕ (this group's accepted outputs accumulated into an empty
        statistic: `plan`'s when every output of the row was accepted), as JSON
        (`mechanism.statistic_to_json`). A row's (n, statistic_json) as of the last
        commit of this Ledger is kept in memory: for such a row the read is skipped
        and the UPDATE is conditional on the row still holding exactly that n and
        text (if anything else wrote it, the cache entry is dropped and the
        transaction reruns, reading the row). Other rows are created if missing and
        read under the transaction's lock. `plan`'s statistics are never modified
        (a rerun uses them again). Mechanisms whose statistic grows with the reports
        (pem) append a chunk row instead (statistic_chunks.py).
        """
        plan_parts = (plan.policies, plan.statistics)
        keys = append_chunks(db, self.dialect, self.shard, now, plan_parts, accepted)
        with self._stats_lock:
            base = {k: self._stats_cache[k] for k in keys if k in self._stats_cache}
        fresh = [k for k in keys if k not in base]
        stored: dict[tuple[str, int, int], tuple[int, str | None]] = dict(base)
        if fresh:
            db.executemany(
                self._sql["ensure_statistics"],
                [(pid, ver, win, self.shard, now) for pid, ver, win in fresh],
            )
            for chunk in _padded_chunks(fresh, _IN_KEYS):
                rows = db.execute(
                    self._in_sql("select_statistics", len(chunk)),
                    [*(v for key in chunk for v in key), self.shard],
                )
                for pid, ver, win, n, text in rows:
                    stored[(pid, int(ver), int(win))] = (int(n), text)
        plain: list[tuple[Any, ...]] = []
        checked: list[tuple[Any, ...]] = []
        for key in keys:
            outputs = accepted[key]
            mech = plan.policies[key].mechanism
            stat, count = plan.statistics[key]
            if len(outputs) != count:  # some were not accepted: these outputs only
                stat = mech.new_statistic()
                accumulate = mech.accumulate
                for o in outputs:
                    accumulate(stat, o)
            n0, text0 = stored[key]
            if text0 is not None:
                merged = mech.statistic_from_json(text0)
                mech.merge_statistics(merged, stat)
                stat = merged
            n1, text1 = n0 + len(outputs), mech.statistic_to_json(stat)
            written[key] = (n1, text1)
            row = (n1, text1, now, key[0], key[1], key[2], self.shard)
            if key in base:
                checked.append((*row, n0, text0))
            else:
                plain.append(row)
        if plain:
            db.executemany(self._sql["update_statistics"], plain)
        if checked:
            done = db.executemany(self._sql["update_statistics_if"], checked)
            if done != len(checked):
                self._forget_statistics(base)
                raise _ConcurrentUpdateError("a statistics row moved since it was cached")

    def _forget_statistics(self, keys: Iterable[tuple[str, int, int]]) -> None:
        with self._stats_lock:
            for key in list(keys):
                self._stats_cache.pop(key, None)
