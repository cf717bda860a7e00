"""The store's rows by key and by token range: `get`, `scan`, `count` and `delete_token_range`."""
from __future__ import annotations

import sqlalchemy as sa

from .arrow_layouts import value_column_name
from .cells import Row, is_live
from .schema import StoreSchema
from .store_types import check_token


class StoreRows(StoreSchema):
    """The row-reading part of `NodeStore` (with the range delete, which reads where to cut)."""

    def get(self, table_id: str, token: int, key: tuple, include_tombstones: bool = False) -> Row | None:
        physical = self._physical(table_id)
        statement = sa.select(physical.table).where(*physical.key_equals(check_token(token), physical.full_key(key)))
        with self._read() as conn:
            values = conn.execute(statement).first()
        if values is None:
            return None
        row = physical.from_sql(values)
        return row if include_tombstones or is_live(row) else None

    def scan(
        self,
        table_id: str,
        first_token: int,
        last_token: int,
        *,
        partition_key: tuple | None = None,
        after: tuple[int, tuple] | None = None,
        limit: int | None = None,
        include_tombstones: bool = False,
    ) -> list[Row]:
        """Rows with first_token <= token <= last_token ordered by (token, key).

        `partition_key` restricts the scan to one partition; `after` = (token, key or key prefix) resumes
        strictly after every row whose key starts with that prefix.
        """
        physical = self._physical(table_id)
        table = physical.table
        conditions = [table.c.token >= check_token(first_token), table.c.token <= check_token(last_token)]
        if partition_key is not None:
            pk_columns = physical.spec.partition_key
            values = physical.coerce_key(partition_key, pk_columns)
            if len(values) != len(pk_columns):
                raise ValueError(f"partition key {partition_key!r} must have {len(pk_columns)} components")
            conditions += [table.c[value_column_name(c.name)] == v for c, v in zip(pk_columns, values)]
        if after is not None:
            after_token, after_key = after
            prefix = (check_token(after_token), *physical.coerce_key(after_key, physical.spec.key_columns))
            conditions.append(sa.tuple_(*physical.key_columns[:len(prefix)]) > sa.tuple_(*prefix))
        if not include_tombstones:
            conditions.append(sa.not_(table.c.tombstone))
        statement = sa.select(table).where(*conditions).order_by(*physical.key_columns).limit(limit)
        with self._read() as conn:
            return [physical.from_sql(values) for values in conn.execute(statement)]

    def count(self, table_id: str, first_token: int | None = None, last_token: int | None = None, *,
              include_tombstones: bool = False) -> int:
        """The number of live rows (all rows if `include_tombstones`), optionally within an inclusive token range."""
        table = self._physical(table_id).table
        conditions = [] if include_tombstones else [sa.not_(table.c.tombstone)]
        if first_token is not None:
            conditions.append(table.c.token >= check_token(first_token))
        if last_token is not None:
            conditions.append(table.c.token <= check_token(last_token))
        with self._read() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(table).where(*conditions)).scalar_one()

    def delete_token_range(self, table_id: str, first_token: int, last_token: int, *,
                           rows_per_transaction: int = 50_000) -> int:
        """Delete every row (live rows and tombstones) with first_token <= token <= last_token; the number deleted.

        In transactions of about `rows_per_transaction` rows each (cut at token boundaries), so live writes
        interleave with a large range's delete. 0 when the store has no table `table_id`."""
        try:
            table = self._physical(table_id).table
        except KeyError:
            return 0
        low, last_token = check_token(first_token), check_token(last_token)
        deleted = 0
        while low is not None and low <= last_token:
            (window_first, window_last), low = self._next_delete_window(table, low, last_token, rows_per_transaction)
            with self._write_transaction() as conn:
                condition = (table.c.token >= window_first, table.c.token <= window_last)
                deleted += conn.execute(table.delete().where(*condition)).rowcount
        return deleted

    def _next_delete_window(self, table: sa.Table, low: int, last_token: int,
                            rows: int) -> tuple[tuple[int, int], int | None]:
        """((first, last) tokens of the next delete, the first token after it or None): about `rows` rows, whole
        tokens only (a token holding more rows goes alone)."""
        statement = (sa.select(table.c.token).where(table.c.token >= low, table.c.token <= last_token)
                     .order_by(table.c.token).offset(max(1, rows)).limit(1))
        with self._read() as conn:
            cut = conn.execute(statement).scalar()
        if cut is None:
            return (low, last_token), None
        if cut == low:
            return (low, low), (low + 1 if low < last_token else None)
        return (low, cut - 1), cut
