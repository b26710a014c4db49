"""The ledger's tables (SQLAlchemy Core), the single source for queries.

Compatibility rules (this is stored data): a column's meaning never changes; new
columns are nullable or have a default; every change is an Alembic migration in
collector/migrations/versions that `open_ledger` applies. Amounts of privacy
(ε, δ) are exact decimal strings (TEXT) in every dialect: never a float, and
never SQLite's NUMERIC affinity, which would round them to doubles.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

#: One row per accepted report: the raw evidence that reconcile recomputes from.
reports = sa.Table(
    "reports",
    metadata,
    sa.Column("report_id", sa.LargeBinary(16), primary_key=True),
    sa.Column("subject", sa.Text, nullable=False),
    sa.Column("policy_id", sa.Text, nullable=False),
    sa.Column("policy_version", sa.BigInteger, nullable=False),
    sa.Column("policy_digest", sa.LargeBinary(32), nullable=False),
    sa.Column("window_start", sa.BigInteger, nullable=False),
    sa.Column("coarse_time", sa.BigInteger, nullable=False),
    sa.Column("charge", sa.Text, nullable=False),  # exact decimal ε charged for this report
    sa.Column(
        "epsilon_cap", sa.Text, nullable=False
    ),  # the verified policy's cap it was charged under
    sa.Column("content_digest", sa.LargeBinary(32), nullable=False),
    sa.Column(
        "payload", sa.Text, nullable=False
    ),  # the randomized output, JSON (never a raw value)
    sa.Column("shard", sa.Text, nullable=False),
    sa.Column("received_at", sa.BigInteger, nullable=False),
    sa.Index("ix_reports_policy_window", "policy_id", "policy_version", "window_start"),
)

#: Running ε spent per (subject, policy id, window): what the cap is checked against.
spend = sa.Table(
    "spend",
    metadata,
    sa.Column("subject", sa.Text, primary_key=True),
    sa.Column("policy_id", sa.Text, primary_key=True),
    sa.Column("window_start", sa.BigInteger, primary_key=True),
    sa.Column("epsilon_spent", sa.Text, nullable=False),
    sa.Column("report_count", sa.BigInteger, nullable=False),
    sa.Column("epsilon_cap", sa.Text, nullable=False),  # cap of the last charge (informational)
    sa.Column("updated_at", sa.BigInteger, nullable=False),
)

#: A report id reused with other content (or by another subject): refused, recorded.
conflicts = sa.Table(
    "conflicts",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("report_id", sa.LargeBinary(16), nullable=False),
    sa.Column("subject", sa.Text, nullable=False),
    sa.Column("content_digest", sa.LargeBinary(32), nullable=False),
    sa.Column("seen_at", sa.BigInteger, nullable=False),
)

#: Additive sufficient statistics, one row per collector shard (no hot row across collectors).
statistics = sa.Table(
    "statistics",
    metadata,
    sa.Column("policy_id", sa.Text, primary_key=True),
    sa.Column("policy_version", sa.BigInteger, primary_key=True),
    sa.Column("window_start", sa.BigInteger, primary_key=True),
    sa.Column("shard", sa.Text, primary_key=True),
    sa.Column("n", sa.BigInteger, nullable=False),
    sa.Column("statistic_json", sa.Text, nullable=True),  # NULL until the first report
    sa.Column("updated_at", sa.BigInteger, nullable=False),
)

#: Append-only statistics (migration 0008_statistic_chunks), for mechanisms whose
#: statistic grows with the reports (`Mechanism.chunked_statistic`: pem): each commit
#: adds one row per statistics row it moves, holding only that commit's accepted
#: reports (`Mechanism.statistic_chunk`), in the same transaction as their charge,
#: and adds their count to the `statistics` row's n. `n_before` is that n before the
#: commit: the chunks of one statistics row hold disjoint ranges [n_before,
#: n_before + n) of its reports. A reader merges the row's statistic_json (NULL,
#: or what a collector wrote before 0008) and its chunks
#: (collector/ledger/statistic_chunks.py).
statistic_chunks = sa.Table(
    "statistic_chunks",
    metadata,
    sa.Column("policy_id", sa.Text, primary_key=True),
    sa.Column("policy_version", sa.BigInteger, primary_key=True),
    sa.Column("window_start", sa.BigInteger, primary_key=True),
    sa.Column("shard", sa.Text, primary_key=True),
    sa.Column("n_before", sa.BigInteger, primary_key=True),
    sa.Column("n", sa.BigInteger, nullable=False),
    sa.Column("data", sa.LargeBinary, nullable=False),
)

#: Central-release caps per (subject, purpose), set by an operator, with running totals.
central_caps = sa.Table(
    "central_caps",
    metadata,
    sa.Column("subject", sa.Text, primary_key=True),
    sa.Column("purpose", sa.Text, primary_key=True),
    sa.Column("epsilon_cap", sa.Text, nullable=False),
    sa.Column("delta_cap", sa.Text, nullable=False),
    sa.Column("epsilon_committed", sa.Text, nullable=False),  # reserved + settled
    sa.Column("delta_committed", sa.Text, nullable=False),
    sa.Column("updated_at", sa.BigInteger, nullable=False),
)

#: Every central reservation and its history (reserved, then settled or cancelled).
central_reservations = sa.Table(
    "central_reservations",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("subject", sa.Text, nullable=False),
    sa.Column("purpose", sa.Text, nullable=False),
    sa.Column("epsilon", sa.Text, nullable=False),
    sa.Column("delta", sa.Text, nullable=False),
    sa.Column("status", sa.Text, nullable=False),  # 'reserved' | 'settled' | 'cancelled'
    sa.Column("epsilon_spent", sa.Text, nullable=True),
    sa.Column("delta_spent", sa.Text, nullable=True),
    sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
    sa.Column("metadata_json", sa.Text, nullable=False),
    sa.Column("events_json", sa.Text, nullable=True),
    sa.Column("created_at", sa.BigInteger, nullable=False),
    sa.Column("closed_at", sa.BigInteger, nullable=True),
    # Ownership (migration 0003_central_ownership): the run that claimed the reservation, and
    # until when its lease runs (renewed while it works); NULL on rows made before.
    sa.Column("owner", sa.Text, nullable=True),
    sa.Column("lease_expires_at", sa.BigInteger, nullable=True),
    # When the run declared that it opens the protected data (written BEFORE the first
    # read): from then on the reservation can only be settled as spent, never cancelled.
    sa.Column("data_opened_at", sa.BigInteger, nullable=True),
    # Why it was closed: "released", "failed after data was opened: ...", "operator: ...".
    sa.Column("close_reason", sa.Text, nullable=True),
    # The key id (SHA-256 hex of the raw Ed25519 public key) of the only key that may sign
    # this run's receipt; "" when the run signs none; NULL on rows made before migration
    # 0007_central_cap_log_receipt_key (verify then trusts any --trusted-key, and says so).
    sa.Column("receipt_key_id", sa.Text, nullable=True),
    sa.Index("ix_central_subject_purpose", "subject", "purpose"),
)

#: Each policy id's metric name and budget window, recorded the first time a version
#: of it is activated (`Ledger.claim_lineage`). Spend is keyed by (subject, policy
#: id, window start): a version with another window length would charge other
#: windows, and a second policy id for one metric would be a second budget, so
#: the collector refuses both. A metric name belongs to one policy id.
policy_lineage = sa.Table(
    "policy_lineage",
    metadata,
    sa.Column("policy_id", sa.Text, primary_key=True),
    sa.Column("metric_name", sa.Text, nullable=False),
    sa.Column("window_seconds", sa.BigInteger, nullable=False),
    sa.Column("first_version", sa.BigInteger, nullable=False),  # the version that recorded it
    sa.Column("recorded_at", sa.BigInteger, nullable=False),
    sa.UniqueConstraint("metric_name", name="uq_policy_lineage_metric_name"),
)

#: Every transition of every central reservation (reserved, data_opened, settled,
#: cancelled, settled_stale, reentered), append-only: the operator's actions are events
#: too. Every change of a central cap is an event here as well (action "cap_set",
#: reservation_id "", detail {subject, purpose, epsilon_cap, delta_cap}), written while
#: the cap row is locked like every transition that moves its committed total, so the
#: id order is the order in which caps and reservations took effect: reconcile replays
#: it to judge each reservation against the cap in force when it was made.
central_reservation_log = sa.Table(
    "central_reservation_log",
    metadata,
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
    sa.Index("ix_central_log_reservation", "reservation_id"),
)

#: Facts about the ledger itself; "ledger_id" (a UUID drawn when the table is created)
#: names this ledger in signed receipts, so a receipt cannot be checked against another.
ledger_info = sa.Table(
    "ledger_info",
    metadata,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

#: Backups and restores (`fedldp ledger backup` / `restore`, collector/ledger/restore.py).
#: A restored ledger refuses charges in every window overlapping [backup_time,
#: restore_time]; restore_time NULL marks an unrestored backup copy (gap open-ended).
#: central_confirmed_at NULL: central spend since the backup is unconfirmed, and every
#: central reservation is refused until `fedldp ledger confirm-central` sets it.
restore_epochs = sa.Table(
    "restore_epochs",
    metadata,
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
    sa.Column("central_confirmed_at", sa.BigInteger, nullable=True),
)

#: Every policy version a collector activated (`Ledger.record_versions`), by any
#: collector on this ledger: its cap, window and validity [not_before, expires_at).
#: A report is charged against the smallest cap among the recorded versions of its
#: policy id whose validity overlaps its window, whatever versions the charging
#: collector itself knows (docs/policies.md, "Versions and budgets", rule 3).
policy_versions = sa.Table(
    "policy_versions",
    metadata,
    sa.Column("policy_id", sa.Text, primary_key=True),
    sa.Column("version", sa.BigInteger, primary_key=True),
    sa.Column("epsilon_cap", sa.Text, nullable=False),  # exact decimal
    sa.Column("window_seconds", sa.BigInteger, nullable=False),
    sa.Column("not_before", sa.BigInteger, nullable=False),
    sa.Column("expires_at", sa.BigInteger, nullable=False),
    sa.Column("digest", sa.LargeBinary(32), nullable=False),  # SHA-256 of the signed payload
    sa.Column("recorded_at", sa.BigInteger, nullable=False),  # first activation (its clock)
)

#: One row (id 1): a counter bumped in every transaction that records a version, so a
#: charge transaction re-reads `policy_versions` only when its cached generation is old.
policy_version_generation = sa.Table(
    "policy_version_generation",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("generation", sa.BigInteger, nullable=False),
)
