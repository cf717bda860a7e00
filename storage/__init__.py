"""Per-node storage of tablet replicas: last-write-wins rows (cells) and their SQL database (store)."""
from .cells import Cell, ColumnSpec, Row, TableSpec, is_live, merge, next_view_ts, state_equal, visible_values, write_ts
from .store import ApplyResult, NodeStore, OutboxEntry

__all__ = [
    "ApplyResult",
    "Cell",
    "ColumnSpec",
    "NodeStore",
    "OutboxEntry",
    "Row",
    "TableSpec",
    "is_live",
    "merge",
    "next_view_ts",
    "state_equal",
    "visible_values",
    "write_ts",
]
