"""What replicas send each other, as domain values: a batch of rows for one replica, a scan request, a page of rows.

These live below the replica role (in `common`) so that both the replica role and the transport adapter that
carries them between nodes (`common.internode`) can use them; they import only the storage row type.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from coordinator.core.schema import Filter
from storage.cells import Row
from storage.reads import Aggregate

DEFAULT_PAGE_SIZE = 10_000


@dataclass(frozen=True)
class RowBatch:
    """Rows of one table or view bound for one replica shard.

    `schema_version` is the sender's schema version (the receiver catches up to it first); `timestamp` is the
    coordinator's write timestamp of a base write, observed by the receiving node's clock (0 for view updates).
    A base write's rows may come as `columns` instead, an Arrow table in storage.arrow_layouts' mutation layout
    (then `rows` is empty). With `view_rows`, `columns` are a view building batch's rows of a view
    (`storage.arrow_layouts.view_rows_schema`), merged as a build merges them (`storage.bulk.merge_view_rows`).
    A `staged` batch (`columns` only) is a bulk load's: the replica keeps it in its staging area
    (`replica.staging`) instead of applying it.
    """

    table_id: str
    shard: int
    rows: tuple[Row, ...]
    schema_version: int
    timestamp: int = 0
    columns: pa.Table | None = None
    view_rows: bool = False
    staged: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", tuple(self.rows))

    @property
    def size(self) -> int:
        """The number of rows, however they are carried."""
        return len(self.rows) if self.columns is None else self.columns.num_rows


@dataclass(frozen=True)
class ScanRequest:
    """Live rows of one replica with first_token <= token <= last_token, in (token, primary key) order.

    `partition_key` (the partition key values) restricts the scan to one partition; `after` = (token, key or key
    prefix) resumes strictly after that row; `filters` are WHERE terms every row satisfies; `limit` None reads all.
    `columns` names the columns of each page (after `token`; None: every column). With `aggregates`, the answer is
    one page of partial aggregates (`storage.reads.aggregate`) instead of rows. `schema_version` is the group0
    version the coordinator planned the read at: the replica catches up to it and refuses (RangeMoved) a range it no
    longer reads from; 0 (unversioned: a diagnostic scan of one replica's rows) is served as it stands.
    """

    table_id: str
    first_token: int
    last_token: int
    partition_key: tuple | None = None
    limit: int | None = None
    page_size: int = DEFAULT_PAGE_SIZE
    after: tuple[int, tuple] | None = None
    columns: tuple[str, ...] | None = None
    filters: tuple[Filter, ...] = ()
    aggregates: tuple[Aggregate, ...] = ()
    schema_version: int = 0


@dataclass(frozen=True)
class ScanPage:
    """Rows as an Arrow record batch (`token`, then the requested columns), or the partial aggregates."""

    batch: pa.RecordBatch | None = None
    partials: list | None = None
