"""Alembic environment: runs on the connection `collector.db.upgrade` hands over,
or on `sqlalchemy.url` when alembic is run by hand."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from specwatch.collector.models import Base
from specwatch.collector.tiers import partitions

config = context.config


def run_migrations(connection) -> None:
    # on PostgreSQL autogenerate must not propose dropping the day partitions (not ORM tables)
    options = partitions.autogenerate_options(connection.dialect.name)
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True, **options)
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    run_migrations(connection)
else:
    with create_engine(config.get_main_option("sqlalchemy.url")).connect() as conn:
        run_migrations(conn)
