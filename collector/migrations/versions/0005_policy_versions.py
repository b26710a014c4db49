"""Policy versions: every activated version's cap and validity, and a generation counter.

Revision ID: 0005_policy_versions
Revises: 0004_restore_epochs
Create Date: 2026-12-01

The cap a report is charged under is the smallest cap of the versions of its
policy id in force during its window. A collector that knew only its own policy
folder missed versions another collector (or an earlier run of itself) had
activated, and a lower cap published mid-window reached back to no spend. Every
collector now records each version it activates here (`Ledger.record_versions`)
and charges against the smallest cap among the recorded versions whose validity
overlaps the window; `policy_version_generation` (one row) is bumped whenever a
version is recorded, so collectors re-read the table only when it changed
(docs/collector.md, "Policy activation").
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_policy_versions"
down_revision: str | None = "0004_restore_epochs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create `policy_versions` and `policy_version_generation` (its one row at 0)."""
    op.create_table(
        "policy_versions",
        sa.Column("policy_id", sa.Text, primary_key=True),
        sa.Column("version", sa.BigInteger, primary_key=True),
        sa.Column("epsilon_cap", sa.Text, nullable=False),
        sa.Column("window_seconds", sa.BigInteger, nullable=False),
        sa.Column("not_before", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.Column("digest", sa.LargeBinary(32), nullable=False),
        sa.Column("recorded_at", sa.BigInteger, nullable=False),
    )
    generation = op.create_table(
        "policy_version_generation",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
    )
    op.bulk_insert(generation, [{"id": 1, "generation": 0}])


def downgrade() -> None:
    """Drop both tables (forgets every recorded version; for development only)."""
    op.drop_table("policy_version_generation")
    op.drop_table("policy_versions")
