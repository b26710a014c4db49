"""Restore epochs block central reservations until an operator confirms central spend.

Revision ID: 0006_restore_central_block
Revises: 0005_policy_versions
Create Date: 2026-12-01

Central caps have no window, so the restore gap cannot cover a central
reservation lost with the backup. A restore epoch whose `central_confirmed_at`
is NULL refuses every central reservation of the ledger until an operator
re-enters the central spend made after the backup, or confirms none was made
(`fedldp ledger confirm-central`, docs/operations.md "Backup and restore").
Rows recorded before this revision start unconfirmed (the safe side).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_restore_central_block"
down_revision: str | None = "0005_policy_versions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add `restore_epochs.central_confirmed_at` (NULL: central spend unconfirmed)."""
    with op.batch_alter_table("restore_epochs") as batch:
        batch.add_column(sa.Column("central_confirmed_at", sa.BigInteger, nullable=True))


def downgrade() -> None:
    """Drop the column (lifts every block on central reservations; development only)."""
    with op.batch_alter_table("restore_epochs") as batch:
        batch.drop_column("central_confirmed_at")
