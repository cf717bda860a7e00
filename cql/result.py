"""What a statement returns to the client: rows with their columns, or an acknowledgement message."""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from storage.arrow_layouts import arrow_type


@dataclass
class Result:
    """Rows with their columns (name, type), or an acknowledgement message.

    A SELECT's rows come as `arrow` (a record batch of the selected columns) rather than `rows`; `row_values()`
    gives either as lists. `paging_state` is set when more rows may follow this page; `plan` says how a SELECT
    read its rows; `keyspace` answers a USE."""

    columns: list[tuple[str, str]] = field(default_factory=list)
    rows: list[list] = field(default_factory=list)
    message: str = ""
    arrow: pa.RecordBatch | None = None
    paging_state: bytes = b""
    plan: str = ""
    keyspace: str = ""  # USE: the keyspace the connection's names without one are in from now on

    def as_arrow(self) -> pa.RecordBatch | None:
        """The rows as a record batch (None for an answer without columns)."""
        if self.arrow is not None or not self.columns:
            return self.arrow
        arrays = [pa.array([row[i] for row in self.rows], arrow_type(kind)) for i, (_, kind) in enumerate(self.columns)]
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema([(n, arrow_type(k)) for n, k in self.columns]))

    def row_values(self) -> list[list]:
        if self.arrow is None:
            return self.rows
        return [list(row) for row in zip(*(column.to_pylist() for column in self.arrow.columns))]
