"""Arrow tables cut into IPC pieces for a gRPC stream come back equal, whatever the piece size."""
from __future__ import annotations

import math

import pyarrow as pa
import pytest

from common.arrow_stream import ipc_pieces, table_from_pieces


def sample(rows: int) -> pa.Table:
    return pa.table({
        "k": pa.array(range(rows), pa.int64()),
        "v": pa.array([None if i % 7 == 0 else f"välue {i}" for i in range(rows)], pa.string()),
        "d": pa.array([math.nan if i % 5 == 0 else -0.0 for i in range(rows)], pa.float64()),
    })


@pytest.mark.parametrize("rows, piece_bytes", [(0, 1 << 20), (1, 7), (100_000, 1 << 20), (100_000, 333)])
def test_pieces_rebuild_the_table(rows, piece_bytes):
    table = sample(rows)
    pieces = list(ipc_pieces(table, piece_bytes))
    assert all(0 < len(p) <= piece_bytes for p in pieces)
    back = table_from_pieces(pieces)
    assert back.schema == table.schema and back.num_rows == rows
    assert back.to_pylist() == table.to_pylist() or _same_with_nan(back, table)


def _same_with_nan(a: pa.Table, b: pa.Table) -> bool:
    same = lambda x, y: x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
    return all(all(same(x[c], y[c]) for c in x) for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True))


def test_a_truncated_stream_is_a_clear_error():
    pieces = list(ipc_pieces(sample(1000), 100))
    with pytest.raises(ValueError, match="not an Arrow IPC stream"):
        table_from_pieces(pieces[: len(pieces) // 2])
    with pytest.raises(ValueError, match="not an Arrow IPC stream"):
        table_from_pieces([b"garbage"])
