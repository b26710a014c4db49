"""Central reservations: owner and lease, data-opened mark, close reason, log; ledger id.

Revision ID: 0003_central_ownership
Revises: 0002_policy_lineage
Create Date: 2026-12-01

Adds to central_reservations the columns of the ownership model (owner token,
lease expiry), the durable "data opened" mark written before a run reads its
first protected byte, and the reason a reservation was closed; creates the
append-only central_reservation_log and the ledger_info table holding this
ledger's identity (a random UUID, drawn here once).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_central_ownership"
down_revision: str | None = "0002_policy_lineage"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NEW_COLUMNS = ("owner", "lease_expires_at", "data_opened_at", "close_reason")


def upgrade() -> None:
    """Add the ownership columns, the reservation log and the ledger's identity."""
    with op.batch_alter_table("central_reservations") as batch:
        batch.add_column(sa.Column("owner", sa.Text, nullable=True))
        batch.add_column(sa.Column("lease_expires_at", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("data_opened_at", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("close_reason", sa.Text, nullable=True))
    op.create_table(
        "central_reservation_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("reservation_id", sa.Text, nullable=False),
        sa.Column("at", sa.BigInteger, nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("detail_json", sa.Text, nullable=False),
    )
    op.create_index("ix_central_log_reservation", "central_reservation_log", ["reservation_id"])
    info = op.create_table(
        "ledger_info",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.bulk_insert(info, [{"key": "ledger_id", "value": str(uuid.uuid4())}])


def downgrade() -> None:
    """Drop what upgrade added (the log and the ledger's identity are lost)."""
    op.drop_table("ledger_info")
    op.drop_index("ix_central_log_reservation", "central_reservation_log")
    op.drop_table("central_reservation_log")
    with op.batch_alter_table("central_reservations") as batch:
        for name in reversed(_NEW_COLUMNS):
            batch.drop_column(name)
