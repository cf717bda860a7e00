"""Arrow tables as a sequence of Arrow IPC stream pieces small enough for gRPC messages, and back."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

PIECE_BYTES = 1 << 20  # well under gRPC's default 4 MiB message limit
ROWS_PER_BATCH = 65_536


class _Pieces:
    """A write-only file object for pyarrow that keeps what was written since the last `take()`."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self.closed = False

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        data, self._parts = b"".join(self._parts), []
        return data


def ipc_pieces(table: pa.Table, piece_bytes: int = PIECE_BYTES) -> Iterator[bytes]:
    """The IPC stream of `table` (schema first, then record batches) cut into pieces of at most `piece_bytes`."""
    sink = _Pieces()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        yield from _split(sink.take(), piece_bytes)
        for batch in table.to_batches(max_chunksize=ROWS_PER_BATCH):
            writer.write_batch(batch)
            yield from _split(sink.take(), piece_bytes)
    yield from _split(sink.take(), piece_bytes)


def table_from_pieces(pieces: Iterable[bytes]) -> pa.Table:
    """The table whose IPC stream `pieces` are, in order; ValueError when they do not form one stream."""
    data = b"".join(pieces)
    try:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError) as error:
        raise ValueError(f"not an Arrow IPC stream ({len(data)} bytes): {error}") from None


def _split(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


def batch_stream_pieces(schema: pa.Schema, tables: Iterable[pa.Table],
                        piece_bytes: int = PIECE_BYTES) -> Iterator[bytes]:
    """ONE IPC stream of `schema` holding each table of `tables` as one record batch (empty ones left out), cut into
    pieces of at most `piece_bytes`; each table is taken only once the previous one's pieces were taken."""
    sink = _Pieces()
    with pa.ipc.new_stream(sink, schema) as writer:
        yield from _split(sink.take(), piece_bytes)
        for table in tables:
            if table.num_rows:
                writer.write_batch(table.combine_chunks().to_batches()[0])
                yield from _split(sink.take(), piece_bytes)
    yield from _split(sink.take(), piece_bytes)


class _PieceReader:
    """A read-only file object over IPC stream pieces, pulling the next piece when the ones read are used up."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces
        self._buffer = b""
        self._position = 0
        self.closed = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size < 0 or len(self._buffer) - self._position < size:
            self._take_pieces(size)
        end = len(self._buffer) if size < 0 else self._position + size
        data = self._buffer[self._position:end]
        self._position += len(data)
        return data

    def _take_pieces(self, size: int) -> None:
        """Append pieces until `size` bytes are held (all of them when negative), joined once: appending piece by
        piece copied a 5 MB batch about five times."""
        parts, held = [self._buffer[self._position:]], len(self._buffer) - self._position
        while size < 0 or held < size:
            piece = next(self._pieces, None)
            if piece is None:
                break
            parts.append(piece)
            held += len(piece)
        self._buffer, self._position = b"".join(parts), 0

    def close(self) -> None:
        self.closed = True


def batches_from_pieces(pieces: Iterable[bytes]) -> Iterator[pa.RecordBatch]:
    """The record batches of the IPC stream whose pieces `pieces` are, each as soon as its pieces arrived;
    ValueError when they do not form one stream."""
    try:
        reader = pa.ipc.open_stream(pa.PythonFile(_PieceReader(iter(pieces)), mode="r"))
        while True:
            try:
                yield reader.read_next_batch()
            except StopIteration:
                return
    except (pa.ArrowInvalid, OSError) as error:
        raise ValueError(f"not an Arrow IPC stream: {error}") from None


def batch_ipc(batch: pa.RecordBatch) -> bytes:
    """One record batch as Arrow IPC stream bytes."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def batch_from_ipc(data: bytes) -> pa.RecordBatch:
    """The record batch of `batch_ipc` bytes (an empty stream: an empty batch of its schema)."""
    table = pa.ipc.open_stream(data).read_all().combine_chunks()
    return table.to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], schema=table.schema)
