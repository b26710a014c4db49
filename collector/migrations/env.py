"""Alembic environment for the ledger.

Run programmatically by `fedldp.collector.ledger.migrate.upgrade` with an open
connection in ``config.attributes["connection"]``, or from the command line
(``alembic -c collector/migrations/alembic.ini -x url=... upgrade head``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context
from fedldp.collector.ledger.schema import metadata

config = context.config


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit(
            "pass the ledger URL: alembic -x url=sqlite:////path/ledger.db upgrade head"
        )
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
