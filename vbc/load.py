"""`vbc load KS.TABLE FILE`: a CSV or Parquet file into a table, checked first, then sent in Arrow batches.

The file is read once, streaming (bounded memory), and checked completely before anything is written: its
columns (unknown ones, missing primary key columns), every value's conversion to its column's type, and NULLs
in key columns, each refused naming the file's row (CSV: data row and line; Parquet: row group and row) and
column. The checked rows are kept in a temporary directory, grouped by token range (`TokenSpill`); then they
are sent range after range, `--batch-rows` rows per execution of one prepared `INSERT` with the values as an
Arrow IPC stream, two executions in flight. The executions are staged: a table with views keeps the rows in
its replicas' staging areas, where process_staging tasks move them into the base and derive their view updates;
`load` then waits until none is left for the table (unless told not to wait). A failure midway says how many
rows were committed (executions after the failed one may be applied too); every row is an INSERT, so loading the
file again is harmless.

CSV: a header line names the columns; an unquoted empty field, NULL or null is NULL; a quoted "" is an empty
text; booleans are true/false (or 1/0); timestamps are ISO 8601 or milliseconds since the epoch (what a CQL
timestamp stores; a finer part of an ISO time or a Parquet timestamp is dropped).
"""
from __future__ import annotations

import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from common.arrow_tokens import tablets_of, tokens_of
from storage.arrow_layouts import arrow_type
from vbc import client

DEFAULT_BATCH_ROWS = 20_000
SPILL_RANGES = 64
DEFAULT_IN_FLIGHT = 2  # one batch applied by the cluster while the next is read, converted and sent
CSV_BLOCK_BYTES = 4 << 20
CSV_NULLS = ["", "NULL", "null"]
DEFAULT_STAGED_WAIT = 3600.0  # seconds `load` waits for its staged rows to become visible
STAGED_POLL_S = 0.2  # the longest wait between two looks (the first is 10 ms)


class LoadError(Exception):
    """The file cannot be loaded into the table; `committed` rows were written before (0: nothing)."""

    def __init__(self, message: str, committed: int = 0):
        super().__init__(message)
        self.committed = committed


@dataclass(frozen=True)
class Chunk:
    """Rows of the file as read, and where they are (for messages)."""

    batch: pa.RecordBatch
    first_row: int  # 1-based data row of the file (CSV) or row within the row group (Parquet)
    row_group: int | None = None  # Parquet only

    def where(self, offset: int) -> str:
        row = self.first_row + offset
        if self.row_group is None:
            return f"data row {row:,} (line {row + 1:,})"
        return f"row group {self.row_group}, row {row:,}"


# ------------------------------------------------------------------ reading


def file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".csv", ".txt"):
        return "csv"
    raise LoadError(f"{path}: unknown file type {suffix or '(none)'}; use a .csv or .parquet file")


def file_columns(path: Path, fmt: str) -> list[str]:
    if fmt == "parquet":
        return list(_parquet(path).schema_arrow.names)
    reader = _csv_reader(path)
    try:
        return list(reader.schema.names)
    finally:
        reader.close()


def _parquet(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        raise LoadError(f"{path}: not a readable Parquet file: {error}") from None


def _csv_reader(path: Path, names: list[str] | None = None) -> pacsv.CSVStreamingReader:
    convert = pacsv.ConvertOptions(column_types={n: pa.string() for n in names or []}, null_values=CSV_NULLS,
                                   strings_can_be_null=True, quoted_strings_can_be_null=False)
    try:
        return pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                              convert_options=convert)
    except (pa.ArrowException, OSError) as error:
        raise LoadError(f"{path}: not a readable CSV file: {error}") from None


def chunks(path: Path, fmt: str, names: list[str], batch_rows: int) -> Iterator[Chunk]:
    """The file's rows in record batches of at most `batch_rows`, every CSV column as text."""
    if fmt == "parquet":
        parquet = _parquet(path)
        for group in range(parquet.num_row_groups):
            row = 1
            for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=[group], columns=names):
                yield Chunk(batch, row, group)
                row += batch.num_rows
        return
    reader, row = _csv_reader(path, names), 1
    try:
        for block in reader:
            for start in range(0, block.num_rows, batch_rows):
                batch = block.slice(start, batch_rows)
                yield Chunk(batch, row)
                row += batch.num_rows
    except pa.ArrowInvalid as error:
        raise LoadError(f"{path}: after data row {row - 1:,}: {error}") from None
    finally:
        reader.close()


# ------------------------------------------------------------------ checking and converting


def _cast(column: pa.Array, cql_type: str) -> pa.Array:
    target = arrow_type(cql_type)
    if cql_type == "timestamp":
        return _timestamp_millis(column)
    return column.cast(target, safe=True)


def _timestamp_millis(column: pa.Array) -> pa.Array:
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())
    if pa.types.is_string(column.type):
        numeric = pc.match_substring_regex(column, r"^-?[0-9]+$")
        as_int = pc.if_else(numeric, column, pa.scalar(None, pa.string())).cast(pa.int64())
        as_time = pc.if_else(numeric, pa.scalar(None, pa.string()), column).cast(pa.timestamp("us"))
        as_time = as_time.cast(pa.timestamp("ms"), safe=False).cast(pa.int64())
        return pc.coalesce(as_int, as_time)
    return column.cast(pa.int64(), safe=True)


def _first_bad_row(column: pa.Array, cql_type: str) -> int:
    """The offset of the first value of `column` that does not convert (bisection over prefixes)."""
    low, high = 0, len(column)  # the prefix of length `low` converts; the one of length `high` does not
    while high - low > 1:
        middle = (low + high) // 2
        try:
            _cast(column.slice(0, middle), cql_type)
            low = middle
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            high = middle
    return low


def converted(chunk: Chunk, names: list[str], types: list[str], key: set[str], path: Path) -> pa.Table:
    """The chunk's columns converted to the table's types; LoadError naming the row and column of a bad value."""
    arrays = []
    for name, cql_type in zip(names, types):
        column = chunk.batch.column(name)
        try:
            value = _cast(column, cql_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            offset = _first_bad_row(column, cql_type)
            raise LoadError(f"{path}: {chunk.where(offset)}, column {name!r}: {column[offset].as_py()!r} does not "
                            f"convert to {cql_type} ({error})") from None
        if name in key and value.null_count:
            offset = pc.index(pc.is_null(value), True).as_py()
            raise LoadError(f"{path}: {chunk.where(offset)}, column {name!r}: primary key columns cannot be NULL")
        arrays.append(value)
    return pa.Table.from_arrays(arrays, names=names)


# ------------------------------------------------------------------ the load


@dataclass
class Plan:
    insert: str
    names: list[str]
    types: list[str]
    key: set[str]
    partition_key: list[str]  # empty from a node that does not say: the rows are then sent in file order


def plan_load(addresses: list[str], table: str, path: Path, fmt: str) -> Plan:
    """The prepared INSERT of the file's columns, checked against the table (LoadError naming what is wrong)."""
    names = file_columns(path, fmt)
    if not names or len(set(names)) != len(names):
        raise LoadError(f"{path}: the file must name each column once; it has {names}")
    quoted = ", ".join(f'"{n}"' if not n.isidentifier() or n.lower() != n else n for n in names)
    insert = f"INSERT INTO {table} ({quoted}) VALUES ({', '.join('?' * len(names))})"
    try:
        prepared = client.call_any(addresses, lambda addr: client.prepare(addr, insert), idempotent=True)
    except grpc.RpcError as error:
        raise LoadError(f"{path} does not fit {table}: {client.error_text(error)}") from None
    missing = [k for k in prepared.primary_key if k not in names]
    if missing:
        raise LoadError(f"{path} lacks primary key column(s) {', '.join(missing)} of {table}")
    return Plan(insert, names, [c.type for c in prepared.bind_columns], set(prepared.primary_key),
                list(prepared.partition_key))


def check_file(path: Path, fmt: str, plan: Plan, batch_rows: int, spill: TokenSpill) -> int:
    """First pass: every value converts and no key is NULL; the converted rows go to `spill`. The number of rows."""
    rows = 0
    for chunk in chunks(path, fmt, plan.names, batch_rows):
        spill.add(converted(chunk, plan.names, plan.types, plan.key, path))
        rows += chunk.batch.num_rows
    return rows


class TokenSpill:
    """The checked rows grouped by token range (`SPILL_RANGES` equal ranges) in Arrow IPC files of a directory.

    Sent range after range, each execution's rows fall in one range of the token ring, so a replica's merge
    touches a small part of its table (a table is stored in token order: rows in file order would touch all of
    it with every execution). Memory stays bounded: rows are written out as they are checked.
    """

    def __init__(self, directory: Path, plan: Plan):
        self._directory = directory
        self._plan = plan
        self._writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        self._sinks: list = []

    def add(self, table: pa.Table) -> None:
        if not self._plan.partition_key:
            self._write(0, table)
            return
        types = tuple(self._plan.types[self._plan.names.index(k)] for k in self._plan.partition_key)
        ranges = tablets_of(tokens_of([table.column(k) for k in self._plan.partition_key], types), SPILL_RANGES)
        order = np.argsort(ranges, kind="stable")
        present, starts = np.unique(ranges[order], return_index=True)
        ends = [*starts[1:].tolist(), len(order)]
        for number, start, end in zip(present.tolist(), starts.tolist(), ends):
            self._write(number, table.take(order[start:end]))

    def _write(self, number: int, table: pa.Table) -> None:
        writer = self._writers.get(number)
        if writer is None:
            sink = pa.OSFile(str(self._path(number)), "wb")
            self._sinks.append(sink)
            writer = self._writers[number] = pa.ipc.new_stream(sink, table.schema)
        writer.write_table(table)

    def _path(self, number: int) -> Path:
        return self._directory / f"range-{number:03}.arrows"

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        for sink in self._sinks:
            sink.close()

    def batches(self, batch_rows: int) -> Iterator[pa.Table]:
        """The rows, range after range (so each table spans adjacent ranges), in tables of at most `batch_rows`."""
        pending, size = [], 0
        for batch in self._stored_batches():
            pending.append(batch)
            size += batch.num_rows
            while size >= batch_rows:
                table = pa.Table.from_batches(pending)
                yield table.slice(0, batch_rows)
                rest = table.slice(batch_rows)
                pending, size = rest.to_batches(), rest.num_rows
        if size:
            yield pa.Table.from_batches(pending)

    def _stored_batches(self) -> Iterator[pa.RecordBatch]:
        for number in sorted(self._writers):
            with pa.OSFile(str(self._path(number)), "rb") as source:  # read into buffers of their own
                yield from pa.ipc.open_stream(source)


def execute_timeout(rows: int) -> float:
    """The deadline of one batch: the client's default, plus 10 ms per row (a replica applies row by row)."""
    return client.DEFAULT_TIMEOUT + 0.01 * rows


def send_rows(addresses: list[str], path: Path, spill: TokenSpill, plan: Plan, batch_rows: int,
              progress: Callable[[int], None], in_flight: int = DEFAULT_IN_FLIGHT) -> int:
    """Second pass: the checked rows, `batch_rows` per execution of the prepared INSERT, up to `in_flight`
    executions at once (the next batch is read while the cluster applies the previous ones); the rows committed."""
    committed = 0
    pending: deque[tuple[int, Future]] = deque()
    with ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="vbc-load") as pool:
        try:
            for values in spill.batches(batch_rows):
                pending.append((values.num_rows, pool.submit(
                    client.execute, addresses, plan.insert, params=values, timeout=execute_timeout(values.num_rows),
                    staged=True)))
                while len(pending) >= in_flight:
                    committed += _settle(pending.popleft(), path, committed, progress)
            while pending:
                committed += _settle(pending.popleft(), path, committed, progress)
        finally:
            for _, future in pending:
                future.cancel()
    return committed


def _settle(sent: tuple[int, Future], path: Path, committed: int, progress: Callable[[int], None]) -> int:
    """Wait for one execution; its rows, or LoadError counting the rows committed before it."""
    rows, future = sent
    try:
        future.result()
    except grpc.RpcError as error:
        raise LoadError(f"{path}: an execution of {rows:,} rows failed after {committed:,} rows were committed: "
                        f"{client.error_text(error)}", committed) from None
    progress(rows)
    return rows


def wait_staged(addresses: list[str], table: str, timeout: float = DEFAULT_STAGED_WAIT,
                on_waiting: Callable[[dict], None] = lambda staged: None) -> None:
    """Return once no replica of `table` ("ks.name") holds bulk-loaded rows still to process (StatusResponse's
    `staging`), calling `on_waiting` with the table's staging entry while some do. TimeoutError after `timeout`."""
    name = qualified_name(table)
    deadline, poll = time.monotonic() + timeout, 0.01
    while True:
        staged = next((t for t in client.status(addresses, views_only=True)["staging"] if t["table"] == name), None)
        if staged is None:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"after {timeout:.0f} s {staged['tasks']} process_staging task(s) of {name} are left "
                               f"on {', '.join(staged['replicas'])}: the rows become visible once they are processed "
                               "(see `vbc status`)")
        on_waiting(staged)
        time.sleep(poll)
        poll = min(poll * 1.5, STAGED_POLL_S)


def qualified_name(table: str) -> str:
    """"ks.name" as group0 names the table: unquoted parts lower-cased, quoted ones as written."""
    parts = table.split(".", 1)
    return ".".join(p[1:-1] if len(p) > 1 and p[0] == p[-1] == '"' else p.lower() for p in parts)


def load(addresses: list[str], table: str, path: Path, batch_rows: int = DEFAULT_BATCH_ROWS,
         on_total: Callable[[int], None] = lambda total: None,
         progress: Callable[[int], None] = lambda rows: None, wait: bool = True,
         on_waiting: Callable[[dict], None] = lambda staged: None) -> tuple[int, float]:
    """Load the file into the table: (rows committed, seconds spent sending, and with `wait` until the rows are
    visible). LoadError when it cannot.

    The rows go to the staging area of every replica of a table with views (a table without views, or a tablet in
    transition, takes them directly) and become visible once processed; `wait` returns only then."""
    if not path.is_file():
        raise LoadError(f"{path}: no such file")
    fmt = file_format(path)
    plan = plan_load(addresses, table, path, fmt)
    with tempfile.TemporaryDirectory(prefix="vbc-load-") as directory:
        spill = TokenSpill(Path(directory), plan)
        try:
            total = check_file(path, fmt, plan, batch_rows, spill)
        finally:
            spill.close()
        on_total(total)
        started = time.monotonic()
        committed = send_rows(addresses, path, spill, plan, batch_rows, progress)
    if wait:
        try:
            wait_staged(addresses, table, on_waiting=on_waiting)
        except TimeoutError as error:
            raise LoadError(f"{path}: every row was sent, but {error}", committed) from None
    return committed, time.monotonic() - started
