"""Restore epochs: the gap between a backup and its restore, where no charge is taken.

Revision ID: 0004_restore_epochs
Revises: 0003_central_ownership
Create Date: 2026-12-01

A ledger restored from a backup has lost every charge committed after the
backup; a subject could spend that budget again. `fedldp ledger restore` records
[backup_time, restore_time] here, and the ledger refuses every charge in a
budget window that overlaps that gap, until the window ends (docs/operations.md,
"Backup and restore"). A row whose restore_time is NULL marks a backup copy that
was never restored with the command: its gap is open-ended, so it charges nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_restore_epochs"
down_revision: str | None = "0003_central_ownership"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create `restore_epochs` (one row per backup copy or restore)."""
    op.create_table(
        "restore_epochs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("backup_time", sa.BigInteger, nullable=False),
        sa.Column("restore_time", sa.BigInteger, nullable=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    """Drop `restore_epochs` (re-opens every gap to charges; for development only)."""
    op.drop_table("restore_epochs")
