"""Policy lineage: each policy id's metric name and budget window, recorded once.

Revision ID: 0002_policy_lineage
Revises: 0001
Create Date: 2026-12-01

Spend is keyed by (subject, policy id, window start), so every version of one
policy id must share one window length, and one metric name must belong to one
policy id (DESIGN.md, "Ledger": one (subject, metric) has one budget whatever
policy versions are in force). The collector records both the first time it
activates a version of a policy id and refuses any later version that differs.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_policy_lineage"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create `policy_lineage` (one row per policy id; a metric name appears once)."""
    op.create_table(
        "policy_lineage",
        sa.Column("policy_id", sa.Text, primary_key=True),
        sa.Column("metric_name", sa.Text, nullable=False),
        sa.Column("window_seconds", sa.BigInteger, nullable=False),
        sa.Column("first_version", sa.BigInteger, nullable=False),
        sa.Column("recorded_at", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("metric_name", name="uq_policy_lineage_metric_name"),
    )


def downgrade() -> None:
    """Drop `policy_lineage` (forgets every recorded window; for development only)."""
    op.drop_table("policy_lineage")
