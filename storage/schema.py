"""The store's tables: DDL (`ensure_table`, `drop_table`) and the catalog of their specs."""
from __future__ import annotations

import sqlalchemy as sa

from .arrow_layouts import ts_column_name, value_column_name
from .cells import TableSpec
from .engine import StoreEngine
from .physical import PhysicalTable, spec_from_json, spec_to_json
from .upsert import physical_table_name


def _extends(stored: TableSpec, spec: TableSpec) -> bool:
    """Whether `stored` is `spec` or `spec` with regular columns added at the end."""
    return stored.key_columns == spec.key_columns and stored.regular[:len(spec.regular)] == spec.regular


class StoreSchema(StoreEngine):
    """The DDL part of `NodeStore`, and its cache of `PhysicalTable`s."""

    _catalog: sa.Table  # made by NodeStore.__init__
    _tables: dict[str, PhysicalTable]  # by table id, filled on first use

    def physical_table(self, table_id: str) -> PhysicalTable:
        """The SQL table of `table_id` (KeyError when this store has no such table)."""
        return self._physical(table_id)

    def ensure_table(self, spec: TableSpec) -> None:
        """Create the table if missing; an existing table may gain regular columns, nothing else may change.

        A spec the stored one extends (an older definition, from a write that read the schema before an ALTER
        TABLE) changes nothing."""
        physical = PhysicalTable(spec)
        with self._write_transaction() as conn:
            existing = self._stored_spec(conn, spec.table_id)
            if existing is not None and _extends(existing, spec):
                self._ensure_tombstone_index(conn, physical)
                return
            if existing is None:
                physical.table.create(conn, checkfirst=True)
                conn.execute(self._catalog.insert().values(table_id=spec.table_id, spec=spec_to_json(spec)))
            elif existing != spec:
                self._add_regular_columns(conn, existing, physical)
                conn.execute(
                    self._catalog.update()
                    .where(self._catalog.c.table_id == spec.table_id)
                    .values(spec=spec_to_json(spec))
                )
            self._ensure_tombstone_index(conn, physical)
        self._tables[spec.table_id] = physical

    @staticmethod
    def _ensure_tombstone_index(conn: sa.Connection, physical: PhysicalTable) -> None:
        """The index of deleted rows, also on a table stored before tables had it (built once, here)."""
        for index in physical.table.indexes:
            index.create(conn, checkfirst=True)

    def _add_regular_columns(self, conn: sa.Connection, existing: TableSpec, physical: PhysicalTable) -> None:
        spec = physical.spec
        added = spec.regular[len(existing.regular):]
        if existing.key_columns != spec.key_columns or spec.regular[:len(existing.regular)] != existing.regular:
            raise ValueError(
                f"table {spec.table_id} exists with an incompatible schema; only appending regular columns is supported"
            )
        preparer = conn.dialect.identifier_preparer
        table_name = preparer.format_table(physical.table)
        for column in added:
            for name in (value_column_name(column.name), ts_column_name(column.name)):
                sql_column = physical.table.c[name]
                column_sql = f"{preparer.format_column(sql_column)} {sql_column.type.compile(dialect=conn.dialect)}"
                conn.exec_driver_sql(f"ALTER TABLE {table_name} ADD COLUMN {column_sql}")

    def drop_table(self, table_id: str) -> None:
        with self._write_transaction() as conn:
            sa.Table(physical_table_name(table_id), sa.MetaData()).drop(conn, checkfirst=True)
            conn.execute(self._catalog.delete().where(self._catalog.c.table_id == table_id))
        self._tables.pop(table_id, None)

    def table_ids(self) -> set[str]:
        """The ids of every table this store holds."""
        with self._read() as conn:
            return set(conn.execute(sa.select(self._catalog.c.table_id)).scalars())

    def has_table(self, table_id: str) -> bool:
        with self._read() as conn:
            return self._stored_spec(conn, table_id) is not None

    def table_spec(self, table_id: str) -> TableSpec:
        return self._physical(table_id).spec

    def _stored_spec(self, conn: sa.Connection, table_id: str) -> TableSpec | None:
        text = conn.execute(sa.select(self._catalog.c.spec).where(self._catalog.c.table_id == table_id)).scalar()
        return None if text is None else spec_from_json(text)

    def _physical(self, table_id: str) -> PhysicalTable:
        physical = self._tables.get(table_id)
        if physical is not None:
            return physical
        with self._read() as conn:
            spec = self._stored_spec(conn, table_id)
        if spec is None:
            raise KeyError(f"unknown table {table_id}")
        physical = PhysicalTable(spec)
        self._tables.setdefault(table_id, physical)
        return physical
