"""Table schemas, rows of timestamped cells and their last-write-wins merge (pure, standard library only).

Merge rule (deterministic, so replicas converge whatever order they apply writes in):

* the row marker and the row tombstone keep the highest timestamp;
* for each regular column the cell with the higher timestamp wins;
* at equal timestamps a deletion (value None) wins over a value;
* at equal timestamps between two values the greater value wins under the canonical order:
  first by type rank (boolean < integer < double < text), then by value within the type,
  with False < True, integers numerically, doubles by IEEE-754 totalOrder
  (-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN) and text by its UTF-8 bytes
  (which is Unicode code-point order).

A row is live when its marker is newer than its tombstone (a tie: the deletion wins). Cells written at or
before the tombstone are kept by merge but never visible.
"""
from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

COLUMN_TYPES = ("int", "bigint", "text", "boolean", "double", "timestamp")

_TABLE_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("column name must not be empty")
        if self.type not in COLUMN_TYPES:
            raise ValueError(f"column {self.name!r}: unknown type {self.type!r}; expected one of {COLUMN_TYPES}")


@dataclass(frozen=True)
class TableSpec:
    table_id: str
    partition_key: tuple[ColumnSpec, ...]
    clustering_key: tuple[ColumnSpec, ...] = ()
    regular: tuple[ColumnSpec, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "partition_key", tuple(self.partition_key))
        object.__setattr__(self, "clustering_key", tuple(self.clustering_key))
        object.__setattr__(self, "regular", tuple(self.regular))
        if not _TABLE_ID.fullmatch(self.table_id):
            raise ValueError(f"table id must be 32 lowercase hex characters, got {self.table_id!r}")
        if not self.partition_key:
            raise ValueError("a table needs at least one partition key column")
        names = [column.name for column in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate column names in {names}")

    @property
    def key_columns(self) -> tuple[ColumnSpec, ...]:
        return self.partition_key + self.clustering_key

    @property
    def columns(self) -> tuple[ColumnSpec, ...]:
        return self.partition_key + self.clustering_key + self.regular

    def column(self, name: str) -> ColumnSpec:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"table {self.table_id} has no column {name!r}")


@dataclass(frozen=True, init=False)
class Cell:
    value: object
    ts: int

    def __init__(self, value: object, ts: int) -> None:
        # Filling __dict__ at once: a frozen dataclass's own __init__ sets each field through object.__setattr__,
        # several times slower, and the write path builds cells by the million.
        self.__dict__.update(value=value, ts=ts)

    @property
    def is_deletion(self) -> bool:
        return self.value is None


class CellMap(Mapping[str, Cell]):
    """An immutable, hashable mapping of column name to Cell (so Row stays a value object)."""

    __slots__ = ("_cells",)

    def __init__(self, cells: Mapping[str, Cell] | None = None) -> None:
        self._cells = dict(sorted((cells or {}).items()))

    def __getitem__(self, name: str) -> Cell:
        return self._cells[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cells)

    def __len__(self) -> int:
        return len(self._cells)

    def __hash__(self) -> int:
        return hash(tuple(self._cells.items()))

    # Direct delegation: the Mapping mixin versions are several times slower on the write path.
    def __contains__(self, name: object) -> bool:
        return name in self._cells

    def get(self, name: str, default: Cell | None = None) -> Cell | None:
        return self._cells.get(name, default)

    def keys(self):
        return self._cells.keys()

    def items(self):
        return self._cells.items()

    def values(self):
        return self._cells.values()

    def __repr__(self) -> str:
        return f"CellMap({self._cells!r})"


@dataclass(frozen=True, init=False)
class Row:
    token: int
    key: tuple
    marker_ts: int | None = None
    tomb_ts: int | None = None
    cells: Mapping[str, Cell] = field(default_factory=CellMap)
    view_ts: int | None = None

    def __init__(self, token: int, key: tuple, marker_ts: int | None = None, tomb_ts: int | None = None,
                 cells: Mapping[str, Cell] | None = None, view_ts: int | None = None) -> None:
        self.__dict__.update(  # at once, as Cell does
            token=token,
            key=key if type(key) is tuple else tuple(key),
            marker_ts=marker_ts,
            tomb_ts=tomb_ts,
            cells=cells if type(cells) is CellMap else CellMap(cells),
            view_ts=view_ts,
        )


def value_order_key(value: object) -> tuple:
    """The canonical sort key of a non-None cell value (see the module docstring)."""
    if isinstance(value, bool):
        return (0, value)
    if isinstance(value, int):
        return (1, value)
    if isinstance(value, float):
        return (2, _float_total_order(value))
    if isinstance(value, str):
        return (3, value.encode("utf-8"))
    raise TypeError(f"unsupported cell value type {type(value).__name__}")


def _float_total_order(value: float) -> int:
    bits = struct.unpack(">q", struct.pack(">d", value))[0]
    # Negative doubles order in reverse of their bit patterns: flip all but the sign bit.
    return bits ^ 0x7FFFFFFFFFFFFFFF if bits < 0 else bits


def _cell_order_key(cell: Cell) -> tuple:
    if cell.is_deletion:
        return (cell.ts, 1, ())
    return (cell.ts, 0, value_order_key(cell.value))


def winning_cell(a: Cell, b: Cell) -> Cell:
    return a if _cell_order_key(a) >= _cell_order_key(b) else b


def _max_optional(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def same_key(a: tuple, b: tuple) -> bool:
    """Key equality that treats NaN components as equal to each other."""
    return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))


def _same_value(x: object, y: object) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y


def merge(a: Row, b: Row) -> Row:
    """Per-cell last-write-wins merge of two versions of the same row; keeps `a`'s view_ts."""
    if a.token != b.token or not same_key(a.key, b.key):
        raise ValueError(f"cannot merge rows with different keys: {(a.token, a.key)} and {(b.token, b.key)}")
    cells = dict(a.cells)
    for name, cell in b.cells.items():
        cells[name] = winning_cell(cells[name], cell) if name in cells else cell
    return Row(
        token=a.token,
        key=a.key,
        marker_ts=_max_optional(a.marker_ts, b.marker_ts),
        tomb_ts=_max_optional(a.tomb_ts, b.tomb_ts),
        cells=CellMap(cells),
        view_ts=a.view_ts,
    )


def changes_state(old: Row, mutation: Row) -> bool:
    """Whether merge(old, mutation) differs from old's state (cheaper than merging and comparing)."""
    if _newer(mutation.marker_ts, old.marker_ts) or _newer(mutation.tomb_ts, old.tomb_ts):
        return True
    for name, cell in mutation.cells.items():
        current = old.cells.get(name)
        if current is None or _cell_order_key(cell) > _cell_order_key(current):
            return True
    return False


def _newer(candidate: int | None, current: int | None) -> bool:
    return candidate is not None and (current is None or candidate > current)


def is_empty(row: Row) -> bool:
    return row.marker_ts is None and row.tomb_ts is None and not row.cells


def is_live(row: Row) -> bool:
    return row.marker_ts is not None and (row.tomb_ts is None or row.marker_ts > row.tomb_ts)


def visible_values(row: Row) -> dict[str, object]:
    """Regular column values written after the row tombstone and not deleted."""
    return {
        name: cell.value
        for name, cell in row.cells.items()
        if cell.value is not None and (row.tomb_ts is None or cell.ts > row.tomb_ts)
    }


def write_ts(row: Row) -> int:
    """The highest timestamp anywhere in the row (marker, tombstone, cells)."""
    stamps = [cell.ts for cell in row.cells.values()]
    if row.marker_ts is not None:
        stamps.append(row.marker_ts)
    if row.tomb_ts is not None:
        stamps.append(row.tomb_ts)
    if not stamps:
        raise ValueError(f"row {row.key!r} carries no timestamp")
    return max(stamps)


def next_view_ts(old: Row | None, mutation: Row) -> int:
    """The replica-local version of the view updates produced by applying `mutation` on top of `old`."""
    if old is None or old.view_ts is None:
        return write_ts(mutation)
    return max(write_ts(mutation), old.view_ts + 1)


def fed_after_stream(streamed: Row | None, stored: Row) -> Row | None:
    """A pending replica's row once a tablet stream merged its source's (`streamed`, None: the source had none) into
    it: with its view_ts raised above the source's, when its state is not the source's (it holds a write the source
    missed, whose view updates the source never made); None when both hold the same state. The raised view_ts orders
    the view updates it makes now after every one the source made for the row."""
    if streamed is not None and state_equal(streamed, stored):
        return None
    own = stored.view_ts if stored.view_ts is not None else write_ts(stored)
    if streamed is None:
        return with_view_ts(stored, own)
    theirs = streamed.view_ts if streamed.view_ts is not None else write_ts(streamed)
    return with_view_ts(stored, max(own, theirs + 1))


def _state_key(row: Row) -> tuple:
    cells = tuple((name, _cell_order_key(cell)) for name, cell in sorted(row.cells.items()))
    return (row.token, row.marker_ts, row.tomb_ts, cells)


def state_equal(a: Row, b: Row) -> bool:
    """Whether two rows hold the same merged state (view_ts is ignored)."""
    return same_key(a.key, b.key) and _state_key(a) == _state_key(b)


def with_view_ts(row: Row, view_ts: int | None) -> Row:
    return Row(row.token, row.key, row.marker_ts, row.tomb_ts, row.cells, view_ts)
