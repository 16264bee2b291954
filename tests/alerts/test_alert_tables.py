"""The alerts' own tables (alerts/tables.py) are what the collector's migrations create: reflected from a
migrated database, they match column for column, index for index; and nothing else defines them."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from specwatch.alerts.tables import metadata
from specwatch.collector.models import OTHER_PACKAGES_TABLES, Base


def only_alert_tables(name: str | None, type_: str, parent_names: dict) -> bool:
    return type_ != "table" or name in metadata.tables


def test_migrated_schema_matches_the_alert_tables(db):
    with db.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"include_name": only_alert_tables}), metadata)
    assert diff == []
    reflected = inspect(db)
    for table in metadata.sorted_tables:
        columns = {c["name"]: c["nullable"] for c in reflected.get_columns(table.name)}
        assert columns == {c.name: c.nullable for c in table.columns}, table.name
        indexes = {ix["name"] for ix in reflected.get_indexes(table.name)}
        assert {ix.name for ix in table.indexes} <= indexes, table.name


def test_the_comparison_sees_a_drifted_definition(db):
    """A column the migrations did not create is reported (the check can fail)."""
    from sqlalchemy import Column, MetaData, String

    drifted = MetaData()
    for table in metadata.sorted_tables:
        table.to_metadata(drifted)
    drifted.tables["alert_actions"].append_column(Column("operator", String(64)))
    with db.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"include_name": only_alert_tables}), drifted)
    assert [(d[0], d[2], d[3].name) for d in diff] == [("add_column", "alert_actions", "operator")]


def test_alert_tables_are_defined_once():
    """The collector names them (its migrations create them) but defines none of them."""
    assert set(metadata.tables) == OTHER_PACKAGES_TABLES
    assert not OTHER_PACKAGES_TABLES & set(Base.metadata.tables)
