"""Append-only statistic chunks for statistics that grow with the reports (pem).

Revision ID: 0008_statistic_chunks
Revises: 0007_central_cap_log_receipt_key
Create Date: 2026-12-07

A pem statistic keeps every report, and the collector rewrote a window's whole
`statistics.statistic_json` on each commit, so a commit's cost grew with the
window (issue #33). From this revision a mechanism whose statistic grows with the
reports (`Mechanism.chunked_statistic`) adds one `statistic_chunks` row per
statistics row a commit moves, holding only that commit's accepted reports in
compact binary (`Mechanism.statistic_chunk`), written in the same transaction as
their charge; the `statistics` row keeps counting them in n, and its
statistic_json is left as it was (collector/ledger/statistic_chunks.py).

Rows written before this revision are not converted: the ledger does not record
which mechanism a statistics row belongs to (only the policy does), and the old
JSON stays exact. A reader merges a row's statistic_json (NULL for rows made
after this revision, the old JSON otherwise) with the row's chunks, so a window
begun under 0007 and continued under 0008 reads as one statistic.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_statistic_chunks"
down_revision: str | None = "0007_central_cap_log_receipt_key"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create `statistic_chunks` (empty)."""
    op.create_table(
        "statistic_chunks",
        sa.Column("policy_id", sa.Text, primary_key=True),
        sa.Column("policy_version", sa.BigInteger, primary_key=True),
        sa.Column("window_start", sa.BigInteger, primary_key=True),
        sa.Column("shard", sa.Text, primary_key=True),
        sa.Column("n_before", sa.BigInteger, primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    """Drop `statistic_chunks` (loses every report counted there; development only)."""
    op.drop_table("statistic_chunks")
