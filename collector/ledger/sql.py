"""The ledger's hand-written SQL for the ingestion hot path, per dialect.

The hot path (`ingest.py`) bypasses SQLAlchemy's statement compilation and runs
these fixed statements on the DBAPI cursor. The report INSERT/COPY column list
is generated from `schema.reports` (and checked against it); every statement
(`all_statements`) is compiled by tests/collector/test_schema_drift.py against
a ledger made by the Alembic migrations and one made from `schema.py`, on
SQLite and PostgreSQL, and that test also compares the migrated tables with
`schema.py`: a column renamed in one place only fails the suite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import (
    TypeVar,
)

from fedldp.collector.ledger.schema import (
    reports,
)

T = TypeVar("T")

#: Rows per multi-row INSERT/UPDATE statement: 256, then the binary digits of the rest.
#: Python's sqlite3 releases the GIL around every statement step; with executemany
#: that is once per row, and a committer thread that loses the GIL to busy request
#: handlers waits a switch interval to get it back, so rows go in a few statements.
_ROW_CHUNKS = (256, 128, 64, 32, 16, 8, 4, 2, 1)
#: IN-list sizes of the hot-path reads (powers of two; lists are padded to the next
#: power of two so that each statement's text, hence its prepared plan, is reused).
_IN_IDS = 2048
_IN_KEYS = 512  # three parameters per key
#: The `reports` columns that every report of one policy shares, bound once per
#: INSERT statement (their order in a run's `shared` tuple) ...
_REPORT_POLICY_COLUMNS = (
    "policy_id",
    "policy_version",
    "policy_digest",
    "charge",
    "epsilon_cap",
    "shard",
)
#: ... and the columns bound per report (the order of a run's row tuples): 7
#: parameters per row instead of 13 (docs/performance.md).
_REPORT_OWN_COLUMNS = (
    "report_id",
    "subject",
    "window_start",
    "coarse_time",
    "content_digest",
    "payload",
    "received_at",
)


def _blob_parameter(dialect: str) -> Callable[[bytes], bytes | bytearray]:
    """How the hot path passes a BLOB parameter to the driver.

    SQLite: as a bytearray. Python's sqlite3 sends every parameter that is not
    exactly an int, float, str or bytearray through its adapter protocol, whose
    failed attribute lookups cost more than copying the value (docs/performance.md);
    both bind as the same BLOB. PostgreSQL: bytes as they are.
    """
    return bytearray if dialect == "sqlite" else bytes


def _row_chunk_sizes(count: int) -> Iterator[int]:
    """Sizes from _ROW_CHUNKS adding up to `count` (256s, then one of each smaller)."""
    for size in _ROW_CHUNKS:
        while count >= size and (size == _ROW_CHUNKS[0] or count & size):
            yield size
            count -= size


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _padded_chunks(items: Sequence[T], size: int) -> Iterator[list[T]]:
    """`items` in chunks of at most `size`, each padded to a power of two by
    repeating its last item (repeats in an IN list change nothing)."""
    for i in range(0, len(items), size):
        chunk = list(items[i : i + size])
        chunk += chunk[-1:] * ((1 << (len(chunk) - 1).bit_length()) - len(chunk))
        yield chunk


def _statements(dialect: str) -> dict[str, str]:
    """The fixed statements of the ingestion hot path, in the driver's paramstyle."""
    ph = "?" if dialect == "sqlite" else "%s"
    return {
        "select_generation": "SELECT generation FROM policy_version_generation WHERE id = 1",
        "select_versions": "SELECT policy_id, version, epsilon_cap, window_seconds, not_before,"
        " expires_at, digest, recorded_at FROM policy_versions ORDER BY policy_id, version",
        "insert_conflicts": "INSERT INTO conflicts (report_id, subject, content_digest, seen_at)"
        f" VALUES ({ph}, {ph}, {ph}, {ph})",
        "ensure_spend": "INSERT INTO spend (subject, policy_id, window_start, epsilon_spent,"
        f" report_count, epsilon_cap, updated_at) VALUES ({ph}, {ph}, {ph}, '0', 0, '0', {ph})"
        " ON CONFLICT DO NOTHING",
        "update_spend": f"UPDATE spend SET epsilon_spent = {ph}, report_count = {ph},"
        f" epsilon_cap = {ph}, updated_at = {ph} WHERE subject = {ph} AND policy_id = {ph}"
        f" AND window_start = {ph} AND epsilon_spent = {ph}",
        "ensure_statistics": "INSERT INTO statistics (policy_id, policy_version, window_start,"
        f" shard, n, statistic_json, updated_at) VALUES ({ph}, {ph}, {ph}, {ph}, 0, NULL, {ph})"
        " ON CONFLICT DO NOTHING",
        "update_statistics": f"UPDATE statistics SET n = {ph}, statistic_json = {ph},"
        f" updated_at = {ph} WHERE policy_id = {ph} AND policy_version = {ph}"
        f" AND window_start = {ph} AND shard = {ph}",
        "update_statistics_if": f"UPDATE statistics SET n = {ph}, statistic_json = {ph},"
        f" updated_at = {ph} WHERE policy_id = {ph} AND policy_version = {ph}"
        f" AND window_start = {ph} AND shard = {ph} AND n = {ph} AND statistic_json = {ph}",
    }


def _in_statement(dialect: str, name: str, size: int) -> str:
    """A hot-path read with an IN list of `size` ids or keys.

    On SQLite a list of keys is a VALUES table joined to the primary key (one
    index lookup per key; a row-value IN list would scan the whole table). On
    PostgreSQL the spend and statistics rows are locked FOR UPDATE, in key order.
    """
    if dialect == "sqlite":
        ids = ", ".join(["?"] * size)
        keys = ", ".join(["(?, ?, ?)"] * size)
        return {
            "select_ids": "SELECT report_id, subject, content_digest FROM reports"
            f" WHERE report_id IN ({ids})",
            "select_spend": f"WITH k(s, p, w) AS (VALUES {keys}) SELECT spend.subject,"
            " spend.policy_id, spend.window_start, spend.epsilon_spent, spend.report_count,"
            " spend.epsilon_cap FROM k CROSS JOIN spend ON spend.subject = k.s"
            " AND spend.policy_id = k.p AND spend.window_start = k.w",
            "update_spend_values": "UPDATE spend SET epsilon_spent = v.column1,"
            " report_count = v.column2, epsilon_cap = v.column3, updated_at = v.column4"
            f" FROM (VALUES {', '.join(['(?, ?, ?, ?, ?, ?, ?, ?)'] * size)}) AS v"
            " WHERE spend.subject = v.column5 AND spend.policy_id = v.column6"
            " AND spend.window_start = v.column7 AND spend.epsilon_spent = v.column8",
            "select_statistics": f"WITH k(p, v, w) AS (VALUES {keys}) SELECT st.policy_id,"
            " st.policy_version, st.window_start, st.n, st.statistic_json FROM k"
            " CROSS JOIN statistics AS st ON st.policy_id = k.p AND st.policy_version = k.v"
            " AND st.window_start = k.w AND st.shard = ?",
        }[name]
    ids = ", ".join(["%s"] * size)
    keys = ", ".join(["(%s, %s, %s)"] * size)
    return {
        "select_ids": f"SELECT report_id, subject, content_digest FROM reports"
        f" WHERE report_id IN ({ids})",
        "select_spend": "SELECT subject, policy_id, window_start, epsilon_spent, report_count,"
        f" epsilon_cap FROM spend WHERE (subject, policy_id, window_start) IN ({keys})"
        " ORDER BY subject, policy_id, window_start FOR UPDATE",
        "select_statistics": "SELECT policy_id, policy_version, window_start, n, statistic_json"
        f" FROM statistics WHERE (policy_id, policy_version, window_start) IN ({keys})"
        " AND shard = %s ORDER BY policy_id, policy_version, window_start FOR UPDATE",
    }[name]


def insert_reports_statements() -> dict[int, str]:
    """SQLite's multi-row INSERT of reports for each size in `_ROW_CHUNKS`.

    Parameters: the `_REPORT_POLICY_COLUMNS` values once, then each row's
    `_REPORT_OWN_COLUMNS` values. SQLite has no row locks (BEGIN IMMEDIATE
    already excludes other writers): no FOR UPDATE anywhere on this dialect.
    """
    columns = report_columns()
    shared_marks = ", ".join(["?"] * len(_REPORT_POLICY_COLUMNS))
    own = ", ".join(f"column{i + 1}" for i in range(len(_REPORT_OWN_COLUMNS)))
    row_marks = f"({', '.join(['?'] * len(_REPORT_OWN_COLUMNS))})"
    return {
        size: f"INSERT INTO reports ({', '.join(columns)}) "
        f"SELECT {shared_marks}, {own} FROM (VALUES {', '.join([row_marks] * size)})"
        for size in _ROW_CHUNKS
    }


def copy_reports_statement() -> str:
    """PostgreSQL's COPY of reports (rows: the shared values, then the row's own)."""
    return f"COPY reports ({', '.join(report_columns())}) FROM STDIN"


def report_columns() -> tuple[str, ...]:
    """The `reports` columns in the hot path's order, checked against `schema.reports`."""
    columns = (*_REPORT_POLICY_COLUMNS, *_REPORT_OWN_COLUMNS)
    if sorted(columns) != sorted(c.name for c in reports.columns):
        raise RuntimeError("reports columns and _REPORT_*_COLUMNS disagree")
    return columns


#: The IN-list reads of each dialect (`_in_statement` names).
IN_STATEMENTS = {
    "sqlite": ("select_ids", "select_spend", "update_spend_values", "select_statistics"),
    "postgresql": ("select_ids", "select_spend", "select_statistics"),
}


def all_statements(dialect: str) -> dict[str, str]:
    """Every hand-written statement `dialect`'s hot path runs, by name (IN lists
    and multi-row INSERTs at two sizes); what the schema drift test compiles."""
    out = dict(_statements(dialect))
    for name in IN_STATEMENTS[dialect]:
        for size in (1, 2):
            out[f"{name}[{size}]"] = _in_statement(dialect, name, size)
    if dialect == "sqlite":
        inserts = insert_reports_statements()
        out.update({f"insert_reports[{size}]": inserts[size] for size in (1, 2)})
    else:
        out["copy_reports"] = copy_reports_statement()
    return out
