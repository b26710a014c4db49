"""pem's statistic as append-only chunk rows (collector/ledger/statistic_chunks.py,
migration 0008), on a SQLite file and a real PostgreSQL database.

* Each commit adds one chunk row per statistics row it moves, holding exactly
  the reports it accepted (so what it writes does not grow with the window),
  and never decodes or re-encodes the window's statistic (a mechanism that
  keeps JSON, the broken variant, does and is caught).
* Exactly once: a retried report (DUPLICATE) adds nothing; a transaction that
  reruns after writing its chunk (a concurrent update of another statistics
  row) leaves one chunk; a failed chunk write leaves no report, charge or count.
* The merged statistic equals a recompute from the raw rows; reconcile is clean
  and catches a chunk deleted, repeated or overlapping.
* Windows begun under the old JSON form (a ledger written before 0008, then
  migrated) read as one statistic with what is added after.
* Sharded ledgers merge every shard's chunks; exports carry them as JSON.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from collector_testkit import Deployment
from fedldp.aggregator.estimation import FrequencyReport
from fedldp.aggregator.reports import (
    ReportError,
    audit_statistics,
    export_statistics,
    load_export,
    merge_partials,
    partials_from_ledger,
    report_from_ledgers,
)
from fedldp.client.mechanisms import CategoryOutput
from fedldp.client.mechanisms.pem import PEM
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.ledger import (
    ACCEPTED,
    DUPLICATE,
    CheckedReport,
    Ledger,
    open_ledger,
)
from fedldp.collector.ledger import ingest as ingest_module
from fedldp.collector.ledger import statistic_chunks as chunks_module
from fedldp.collector.ledger.migrate import alembic_config
from fedldp.collector.ledger.schema import statistic_chunks, statistics
from fedldp.collector.ledger.shards import open_sharded

WORDS = ["ok", "hi", "yo", "hey", "ok", "ok"]


@pytest.fixture(scope="module")
def pem_policy(deployment: Deployment) -> VerifiedPolicy:
    """pem over strings of up to 3 bytes (5 groups), ε = 4, cap 400 per window."""
    env = deployment.add_open("chunked-words", max_bytes=3, epsilon="4", epsilon_cap="400")
    return deployment.verified(env)


@pytest.fixture(scope="module")
def grr_policy(deployment: Deployment) -> VerifiedPolicy:
    return deployment.verified(deployment.envelopes[0])  # "color": grr, JSON statistics


def pem_reports(
    policy: VerifiedPolicy, count: int, seed: int, *, charged_as: Any = None
) -> list[CheckedReport]:
    """`count` seeded pem reports (seeded ids, digests from their content), under
    `charged_as` (a policy object) if given."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        output = policy.mechanism.perturb(rng.choice(WORDS), rng=rng)
        digest = hashlib.sha256(repr(output).encode()).digest()
        out.append(CheckedReport(rng.randbytes(16), charged_as or policy, output, digest, 0))
    return out


def grr_report(policy: VerifiedPolicy, seed: int) -> CheckedReport:
    rid = random.Random(seed).randbytes(16)
    return CheckedReport(rid, policy, CategoryOutput(1), hashlib.sha256(rid).digest(), 0)


def rows(ledger: Ledger, table: sa.Table) -> list[Any]:
    """Every row of `table`, in primary-key order."""

    def tx(conn: sa.Connection) -> list[Any]:
        return list(conn.execute(sa.select(table).order_by(*table.primary_key.columns)).all())

    return ledger.transaction(tx, write=False)


def merged(ledger: Any, policy: VerifiedPolicy, window: int | None = None) -> str:
    """The canonical JSON of the ledger's merged statistic for `policy`."""
    mech = policy.mechanism
    stat = merge_partials(mech, partials_from_ledger(ledger, policy, window)).statistic
    return mech.statistic_to_json(stat)


def recomputed(ledger: Any, policy: VerifiedPolicy, window: int | None = None) -> str:
    return policy.mechanism.statistic_to_json(ledger.recompute_statistics(policy, window))


def test_each_commit_appends_one_chunk_of_exactly_its_reports(
    ledger: Ledger, pem_policy: VerifiedPolicy, now: int
) -> None:
    mech = pem_policy.mechanism
    assert isinstance(mech, PEM)
    window = pem_policy.window_start(now)
    total = 0
    for i, size in enumerate([40, 1, 7, 90, 1]):  # at most 100 per user (the cap)
        batch = pem_reports(pem_policy, size, seed=i)
        assert ledger.submit(f"user{i}", batch, now=now) == [ACCEPTED] * size
        (row,) = rows(ledger, statistics)
        chunks = rows(ledger, statistic_chunks)
        assert (row.n, row.statistic_json) == (total + size, None)
        assert len(chunks) == i + 1
        last = chunks[-1]
        # The commit wrote its own reports and nothing of the window before it.
        assert (last.n_before, last.n) == (total, size)
        assert len(last.data) == size * (mech.record_size + 2)
        own = mech.new_statistic()
        for r in batch:
            mech.accumulate(own, r.output)
        assert mech.statistic_to_json(mech.statistic_from_chunks(last.data)) == (
            mech.statistic_to_json(own)
        )
        total += size
    assert merged(ledger, pem_policy, window) == recomputed(ledger, pem_policy, window)
    assert audit_statistics(ledger, pem_policy, window).n == total
    assert ledger.reconcile() == []


class _Policy:
    """`policy` charged and counted with another mechanism object."""

    def __init__(self, policy: VerifiedPolicy, mechanism: Any) -> None:
        self._policy = policy
        self.mechanism = mechanism

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


class JsonPEM(PEM):
    """Broken (the form before 0008): keeps its statistic as one JSON row, which each
    commit decodes, merges and re-encodes whole."""

    chunked_statistic = False


def test_a_commit_never_decodes_or_encodes_the_window(
    ledger: Ledger, pem_policy: VerifiedPolicy, now: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger.submit("warm", pem_reports(pem_policy, 50, seed=1), now=now)

    def boom(*args: Any) -> Any:
        raise AssertionError("the window's statistic was decoded or encoded in a commit")

    monkeypatch.setattr(PEM, "statistic_to_json", boom)
    monkeypatch.setattr(PEM, "statistic_from_json", boom)
    assert ledger.submit("more", pem_reports(pem_policy, 5, seed=2), now=now) == [ACCEPTED] * 5
    mech = pem_policy.mechanism
    assert isinstance(mech, PEM)
    broken = JsonPEM(mech.epsilon, mech.domain, g=mech.g)
    old_form = _Policy(pem_policy, broken)
    with pytest.raises(AssertionError, match="decoded or encoded"):
        ledger.submit("old", pem_reports(pem_policy, 1, 3, charged_as=old_form), now=now)


def test_retried_reports_add_nothing(ledger: Ledger, pem_policy: VerifiedPolicy, now: int) -> None:
    first = pem_reports(pem_policy, 6, seed=10)
    assert ledger.submit("ann", first, now=now) == [ACCEPTED] * 6
    assert ledger.submit("ann", first, now=now) == [DUPLICATE] * 6
    assert [(c.n_before, c.n) for c in rows(ledger, statistic_chunks)] == [(0, 6)]
    # Retries mixed with new reports, and one report twice in one request: the
    # chunk holds the new ones once.
    fresh = pem_reports(pem_policy, 3, seed=11)
    outcomes = ledger.submit("ann", [first[0], fresh[0], fresh[1], fresh[1], fresh[2]], now=now)
    assert outcomes == [DUPLICATE, ACCEPTED, ACCEPTED, DUPLICATE, ACCEPTED]
    assert [(c.n_before, c.n) for c in rows(ledger, statistic_chunks)] == [(0, 6), (6, 3)]
    assert [r.n for r in rows(ledger, statistics)] == [9]
    window = pem_policy.window_start(now)
    assert merged(ledger, pem_policy, window) == recomputed(ledger, pem_policy, window)
    assert ledger.reconcile() == []


def test_a_rerun_transaction_leaves_one_chunk(
    ledger_url: str,
    pem_policy: VerifiedPolicy,
    grr_policy: VerifiedPolicy,
    now: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two Ledger objects share shard "s": B moves the grr statistics row A has cached,
    so A's next commit (grr and pem together) fails its compare-and-set AFTER its pem
    chunk was written, rolls back and reruns: one chunk, counted once."""
    a, b = open_ledger(ledger_url, shard="s"), open_ledger(ledger_url, shard="s")
    calls = []

    def counted(*args: Any) -> Any:
        calls.append(1)
        return chunks_module.append_chunks(*args)

    monkeypatch.setattr(ingest_module, "append_chunks", counted)
    try:
        assert a.submit("u1", [grr_report(grr_policy, 1)], now=now) == [ACCEPTED]
        assert b.submit("u2", [grr_report(grr_policy, 2)], now=now) == [ACCEPTED]
        calls.clear()
        retries = a.retries
        batch = [grr_report(grr_policy, 3), *pem_reports(pem_policy, 4, seed=20)]
        assert a.submit("u3", batch, now=now) == [ACCEPTED] * 5
        assert a.retries == retries + 1 and len(calls) == 2  # the rerun happened
        assert [(c.shard, c.n_before, c.n) for c in rows(a, statistic_chunks)] == [("s", 0, 4)]
        window = pem_policy.window_start(now)
        assert merged(a, pem_policy, window) == recomputed(a, pem_policy, window)
        assert a.reconcile() == []
    finally:
        a.close()
        b.close()


def test_a_failed_chunk_write_changes_nothing(
    ledger: Ledger, pem_policy: VerifiedPolicy, now: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger.submit("kim", pem_reports(pem_policy, 3, seed=30), now=now)
    before = (rows(ledger, statistics), rows(ledger, statistic_chunks))
    window = pem_policy.window_start(now)
    real = chunks_module.chunk_statements

    def broken(dialect: str) -> dict[str, str]:
        sql = real(dialect)
        sql["insert_chunk"] = sql["insert_chunk"].replace("n_before", "no_such_column")
        return sql

    monkeypatch.setattr(chunks_module, "chunk_statements", broken)
    late = pem_reports(pem_policy, 2, seed=31)
    with pytest.raises(sa.exc.DBAPIError):
        ledger.submit("lee", late, now=now)
    monkeypatch.undo()
    assert (rows(ledger, statistics), rows(ledger, statistic_chunks)) == before
    assert not any(ledger.has_report(r.report_id) for r in late)
    assert ledger.spent("lee", pem_policy.policy_id, window) == 0
    assert ledger.reconcile() == []
    assert ledger.submit("lee", late, now=now) == [ACCEPTED] * 2  # and it can be sent again


def _tamper(ledger: Ledger, statement: Any) -> None:
    ledger.transaction(lambda conn: conn.execute(statement))


@pytest.mark.parametrize("damage", ["deleted", "repeated", "overlapping", "cut"])
def test_reconcile_and_the_reader_catch_damaged_chunks(
    ledger: Ledger, pem_policy: VerifiedPolicy, now: int, damage: str
) -> None:
    for seed in range(3):
        ledger.submit(f"v{seed}", pem_reports(pem_policy, 4, seed=40 + seed), now=now)
    assert ledger.reconcile() == []
    last = rows(ledger, statistic_chunks)[-1]
    key = statistic_chunks.c.n_before == last.n_before
    if damage == "deleted":
        _tamper(ledger, sa.delete(statistic_chunks).where(key))
    elif damage == "repeated":  # the last commit's chunk once more, after it
        values = {**last._asdict(), "n_before": last.n_before + last.n}
        _tamper(ledger, sa.insert(statistic_chunks).values(**values))
    elif damage == "overlapping":
        _tamper(ledger, sa.update(statistic_chunks).where(key).values(n_before=last.n_before - 1))
    else:  # a record's bytes cut from the data, its n left as it was
        cut = bytes(last.data)[: -(pem_policy.mechanism.record_size + 2)]  # type: ignore[attr-defined]
        _tamper(ledger, sa.update(statistic_chunks).where(key).values(data=cut))
    assert [m.kind for m in ledger.reconcile()] == ["statistic_chunks"]
    with pytest.raises((ReportError, ValueError), match=r"counts|overlap"):
        merged(ledger, pem_policy)


def test_a_window_begun_before_0008_reads_as_one_statistic(
    ledger_url: str, pem_policy: VerifiedPolicy, now: int
) -> None:
    """A window written as one JSON row (the code path before 0008: a mechanism that
    keeps JSON), the ledger taken back to revision 0007 (no chunk table), opened
    again (migrated to head), then continued with chunks: one statistic, equal to
    the raw rows, the old JSON row left as it was."""
    mech = pem_policy.mechanism
    assert isinstance(mech, PEM)
    old_form = _Policy(pem_policy, JsonPEM(mech.epsilon, mech.domain, g=mech.g))
    led = open_ledger(ledger_url, shard="old")
    led.submit("early", pem_reports(pem_policy, 30, seed=50, charged_as=old_form), now=now)
    (row,) = rows(led, statistics)
    assert row.statistic_json is not None and row.n == 30
    led.close()
    cfg = alembic_config()
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0007_central_cap_log_receipt_key")
        assert "statistic_chunks" not in sa.inspect(conn).get_table_names()
    engine.dispose()
    led = open_ledger(ledger_url, shard="old")  # migrates to head
    try:
        late = pem_reports(pem_policy, 12, seed=51)
        assert led.submit("late", late, now=now) == [ACCEPTED] * 12
        (after,) = rows(led, statistics)
        assert (after.n, after.statistic_json) == (42, row.statistic_json)
        assert [(c.n_before, c.n) for c in rows(led, statistic_chunks)] == [(30, 12)]
        window = pem_policy.window_start(now)
        assert merged(led, pem_policy, window) == recomputed(led, pem_policy, window)
        assert audit_statistics(led, pem_policy, window).n == 42
        assert led.reconcile() == []
    finally:
        led.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def shard_urls(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """Two shards: two SQLite files, or a database on each of two PostgreSQL servers."""
    if request.param == "sqlite":
        return [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
    return [
        str(request.getfixturevalue("postgresql_url")),
        str(request.getfixturevalue("postgresql_url_b")),
    ]


def test_sharded_ledgers_merge_every_shards_chunks(
    shard_urls: list[str], pem_policy: VerifiedPolicy, now: int
) -> None:
    with open_sharded(shard_urls, shard="c0") as sharded:
        sizes = [1 + i % 3 for i in range(24)]
        for i, size in enumerate(sizes):
            subject = f"sharded-{i}"
            batch = pem_reports(pem_policy, size, seed=60 + i)
            assert sharded.for_subject(subject).submit(subject, batch, now=now) == [ACCEPTED] * size
        parts = sharded.statistics(pem_policy.policy_id, pem_policy.version)
        assert sorted(p.shard for p in parts) == ["0/c0", "1/c0"]
        assert all(p.chunks and p.statistic_json is None for p in parts)
        assert merged(sharded, pem_policy) == recomputed(sharded, pem_policy)
        assert all(not found for _, found in sharded.reconcile_shards())
        report = report_from_ledgers([("sharded", sharded)], pem_policy)
        assert isinstance(report, FrequencyReport) and report.n == sum(sizes)


def test_an_export_carries_the_chunks_as_json(
    ledger: Ledger, pem_policy: VerifiedPolicy, now: int
) -> None:
    for seed in range(4):
        ledger.submit(f"x{seed}", pem_reports(pem_policy, 5, seed=70 + seed), now=now)
    document = export_statistics(ledger, pem_policy, source="region-a")
    (part,) = document["partials"]
    assert part["n"] == 20 and isinstance(part["statistic"], str)
    loaded = load_export(document, pem_policy)
    mech = pem_policy.mechanism
    assert mech.statistic_to_json(merge_partials(mech, loaded).statistic) == recomputed(
        ledger, pem_policy
    )


def test_chunks_of_two_windows_and_two_shards_stay_apart(
    ledger_url: str, pem_policy: VerifiedPolicy, now: int
) -> None:
    later = now + pem_policy.window_seconds
    a, b = open_ledger(ledger_url, shard="a"), open_ledger(ledger_url, shard="b")
    try:
        a.submit("p", pem_reports(pem_policy, 3, seed=80), now=now)
        b.submit("q", pem_reports(pem_policy, 2, seed=81), now=now)
        a.submit("p", pem_reports(pem_policy, 4, seed=82), now=later)
        parts = a.statistics(pem_policy.policy_id, pem_policy.version)
        assert [(p.window_start, p.shard, p.n, p.chunk_n) for p in parts] == [
            (pem_policy.window_start(now), "a", 3, 3),
            (pem_policy.window_start(now), "b", 2, 2),
            (pem_policy.window_start(later), "a", 4, 4),
        ]
        for window in (pem_policy.window_start(now), pem_policy.window_start(later)):
            assert merged(a, pem_policy, window) == recomputed(a, pem_policy, window)
        assert a.reconcile() == []
    finally:
        a.close()
        b.close()


@pytest.fixture
def migrated_to_0007(ledger_url: str) -> Iterator[sa.Engine]:
    """An empty ledger at revision 0007 (before statistic chunks)."""
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0007_central_cap_log_receipt_key")
    yield engine
    engine.dispose()


def test_migration_0008_adds_the_chunk_table_and_goes_back(
    migrated_to_0007: sa.Engine, ledger_url: str
) -> None:
    def tables() -> Sequence[str]:
        with migrated_to_0007.connect() as conn:
            return sa.inspect(conn).get_table_names()

    assert "statistic_chunks" not in tables()
    open_ledger(ledger_url).close()  # migrates to head
    assert "statistic_chunks" in tables()
    with migrated_to_0007.connect() as conn:
        columns = {c["name"]: c for c in sa.inspect(conn).get_columns("statistic_chunks")}
        pk = sa.inspect(conn).get_pk_constraint("statistic_chunks")["constrained_columns"]
    assert list(columns) == [
        "policy_id",
        "policy_version",
        "window_start",
        "shard",
        "n_before",
        "n",
        "data",
    ]
    assert pk == ["policy_id", "policy_version", "window_start", "shard", "n_before"]
    assert not any(c["nullable"] for c in columns.values())
    with migrated_to_0007.begin() as conn:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0007_central_cap_log_receipt_key")
    assert "statistic_chunks" not in tables()


def test_concurrent_commits_of_one_shard_tile_its_window(
    ledger_url: str, pem_policy: VerifiedPolicy, now: int
) -> None:
    """Four threads on two Ledger objects of one shard commit pem reports at once: the
    chunks tile [0, n) exactly (no gap, no overlap), n counts every report once, and the
    merged statistic equals the raw rows (PostgreSQL READ COMMITTED: the upsert's row
    lock; SQLite: one writer at a time)."""
    _race(ledger_url, pem_policy, now, None)


def test_concurrent_commits_under_serializable_isolation_tile_the_window(
    postgresql_url: str, pem_policy: VerifiedPolicy, now: int
) -> None:
    """The same race on PostgreSQL with SERIALIZABLE transactions (conflicts rerun)."""
    _race(postgresql_url, pem_policy, now, "SERIALIZABLE")


def _race(ledger_url: str, pem_policy: VerifiedPolicy, now: int, isolation: str | None) -> None:
    """The race of the two tests above."""
    ledgers = [open_ledger(ledger_url, shard="same", isolation=isolation) for _ in range(2)]
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(8):
                batch = pem_reports(pem_policy, 5, seed=1000 * worker + i)
                subject = f"w{worker}-{i}"
                assert ledgers[worker % 2].submit(subject, batch, now=now) == [ACCEPTED] * 5
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        chunks = rows(ledgers[0], statistic_chunks)
        assert [r.n for r in rows(ledgers[0], statistics)] == [160]
        assert sorted((c.n_before, c.n) for c in chunks) == [(5 * i, 5) for i in range(32)]
        window = pem_policy.window_start(now)
        assert merged(ledgers[0], pem_policy, window) == recomputed(ledgers[0], pem_policy, window)
        assert ledgers[0].reconcile() == []
    finally:
        for led in ledgers:
            led.close()
