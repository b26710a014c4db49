"""Initial ledger schema: reports, spend, conflicts, statistics, central caps and reservations.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id_type() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    """Create every table (exact decimals as TEXT)."""
    op.create_table(
        "reports",
        sa.Column("report_id", sa.LargeBinary(16), primary_key=True),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("policy_id", sa.Text, nullable=False),
        sa.Column("policy_version", sa.BigInteger, nullable=False),
        sa.Column("policy_digest", sa.LargeBinary(32), nullable=False),
        sa.Column("window_start", sa.BigInteger, nullable=False),
        sa.Column("coarse_time", sa.BigInteger, nullable=False),
        sa.Column("charge", sa.Text, nullable=False),
        sa.Column("epsilon_cap", sa.Text, nullable=False),
        sa.Column("content_digest", sa.LargeBinary(32), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("shard", sa.Text, nullable=False),
        sa.Column("received_at", sa.BigInteger, nullable=False),
    )
    op.create_index(
        "ix_reports_policy_window", "reports", ["policy_id", "policy_version", "window_start"]
    )
    op.create_table(
        "spend",
        sa.Column("subject", sa.Text, primary_key=True),
        sa.Column("policy_id", sa.Text, primary_key=True),
        sa.Column("window_start", sa.BigInteger, primary_key=True),
        sa.Column("epsilon_spent", sa.Text, nullable=False),
        sa.Column("report_count", sa.BigInteger, nullable=False),
        sa.Column("epsilon_cap", sa.Text, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "conflicts",
        sa.Column("id", _id_type(), primary_key=True, autoincrement=True),
        sa.Column("report_id", sa.LargeBinary(16), nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("content_digest", sa.LargeBinary(32), nullable=False),
        sa.Column("seen_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "statistics",
        sa.Column("policy_id", sa.Text, primary_key=True),
        sa.Column("policy_version", sa.BigInteger, primary_key=True),
        sa.Column("window_start", sa.BigInteger, primary_key=True),
        sa.Column("shard", sa.Text, primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.Column("statistic_json", sa.Text, nullable=True),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "central_caps",
        sa.Column("subject", sa.Text, primary_key=True),
        sa.Column("purpose", sa.Text, primary_key=True),
        sa.Column("epsilon_cap", sa.Text, nullable=False),
        sa.Column("delta_cap", sa.Text, nullable=False),
        sa.Column("epsilon_committed", sa.Text, nullable=False),
        sa.Column("delta_committed", sa.Text, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "central_reservations",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("purpose", sa.Text, nullable=False),
        sa.Column("epsilon", sa.Text, nullable=False),
        sa.Column("delta", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("epsilon_spent", sa.Text, nullable=True),
        sa.Column("delta_spent", sa.Text, nullable=True),
        sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
        sa.Column("metadata_json", sa.Text, nullable=False),
        sa.Column("events_json", sa.Text, nullable=True),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("closed_at", sa.BigInteger, nullable=True),
    )
    op.create_index("ix_central_subject_purpose", "central_reservations", ["subject", "purpose"])


def downgrade() -> None:
    """Drop every table (destroys the ledger; for development only)."""
    for name in (
        "central_reservations",
        "central_caps",
        "statistics",
        "conflicts",
        "spend",
        "reports",
    ):
        op.drop_table(name)
