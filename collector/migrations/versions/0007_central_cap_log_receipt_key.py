"""Central caps get a history in the reservation log; reservations bind their receipt key.

Revision ID: 0007_central_cap_log_receipt_key
Revises: 0006_restore_central_block
Create Date: 2026-12-07

Reconcile judged every (subject, purpose)'s committed central spend against the
cap recorded *now*, so lowering a cap below what was already spent (a release
policy may lower a cap, to 0 to close a purpose) made reconcile fail forever.
Every change of a central cap is now an event of `central_reservation_log`
(action "cap_set", reservation_id "", detail {subject, purpose, epsilon_cap,
delta_cap}), in the same ordered log as the reservations' transitions, so
reconcile replays the log and judges each reservation against the cap in force
when it was made (collector/ledger/reconcile.py).

This revision appends one "cap_set" event per existing central cap (its value at
the upgrade, detail "source": "migration 0007"): caps before the upgrade were not
recorded, so reservations made before it are judged against that earliest
recorded cap (docs/collector.md, "Reconcile").

`central_reservations.receipt_key_id` (new, nullable) is the key id (SHA-256 hex
of the raw Ed25519 public key) of the only key that may sign the receipt of the
reservation's run; "" when the run signs no receipt; NULL on rows made before
this revision (`fedldp verify` then checks the signer only against its trusted
keys and says so).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_central_cap_log_receipt_key"
down_revision: str | None = "0006_restore_central_block"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add `receipt_key_id`; log each existing central cap as its first "cap_set"."""
    with op.batch_alter_table("central_reservations") as batch:
        batch.add_column(sa.Column("receipt_key_id", sa.Text, nullable=True))
    conn = op.get_bind()
    caps = conn.execute(
        sa.text(
            "SELECT subject, purpose, epsilon_cap, delta_cap FROM central_caps "
            "ORDER BY subject, purpose"
        )
    ).all()
    now = int(time.time())
    for subject, purpose, eps_cap, delta_cap in caps:
        detail = {
            "subject": subject,
            "purpose": purpose,
            "epsilon_cap": eps_cap,
            "delta_cap": delta_cap,
            "source": "migration 0007",
        }
        conn.execute(
            sa.text(
                "INSERT INTO central_reservation_log (reservation_id, at, action, detail_json) "
                "VALUES ('', :at, 'cap_set', :detail)"
            ),
            {"at": now, "detail": json.dumps(detail, sort_keys=True)},
        )


def downgrade() -> None:
    """Drop `receipt_key_id` and the "cap_set" events (development only)."""
    op.execute("DELETE FROM central_reservation_log WHERE action = 'cap_set'")
    with op.batch_alter_table("central_reservations") as batch:
        batch.drop_column("receipt_key_id")
