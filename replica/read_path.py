"""The coordinating side of a read: one replica per tablet, Arrow pages in (token, primary key) order.

Tablets cover disjoint token ranges, so a full scan is the tablets' pages one after another in token order: no
merge. Partitions named by '='/IN are read in token order too; only partitions sharing a token (a hash collision)
are merged by primary key. Aggregates are computed by each replica in SQL and combined here.

A read holds the replicas it was planned with only as long as they serve its ranges: each request carries the group0
schema version it was planned at, and a replica that no longer reads from a range (a tablet moved away meanwhile)
refuses it with `RangeMoved`, before or between pages. The read then catches up with group0, plans the rest of that
range again (strictly after the last row it handed on; an aggregate's whole range, not combined yet) and reads on,
up to MAX_REPLANS times per range; after that it fails UNAVAILABLE, never with a short answer.
"""
from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Protocol

import pyarrow as pa

from common.replica_messages import DEFAULT_PAGE_SIZE, ScanPage, ScanRequest
from coordinator.core.errors import CoreError, DeadlineExceeded, NotFound, RangeMoved, Unavailable
from coordinator.core.migrations import read_replicas
from coordinator.core.schema import Filter, Replica, Table
from coordinator.core.tokens import tablet_of, tablet_range
from coordinator.core.types import sort_key
from storage.reads import Aggregate, combine

from replica.rows import partition_token
from replica.transport import ReplicaTransport, describe

log = logging.getLogger(__name__)

MAX_REPLANS = 10  # plans of one token range again after RangeMoved refusals, before the read fails UNAVAILABLE


class LocalScans(Protocol):
    def scan(self, request: ScanRequest) -> Iterator[ScanPage]:
        """The pages of a scan of this node's replica."""

    def catch_up(self, version: int) -> None:
        """Return once this node applied group0 schema `version`."""


@dataclass(frozen=True)
class ReadQuery:
    """What to read of one table: `columns` (after `token`), every partition or the `partitions` named (partition
    key values), rows satisfying `filters`, strictly after `after` = (token, primary key), at most `limit` rows.

    `deadline` (time.monotonic) bounds the whole read: past it the read stops with DEADLINE_EXCEEDED saying how far
    it got; `doing` names the read in that message."""

    columns: tuple[str, ...]
    partitions: list[tuple] | None = None
    filters: tuple[Filter, ...] = ()
    after: tuple[int, tuple] | None = None
    limit: int | None = None
    page_rows: int = DEFAULT_PAGE_SIZE
    deadline: float | None = None
    doing: str = "reading"


@dataclass(frozen=True)
class _Range:
    """One replica read of a query: a token range (a tablet, or one partition's token) and its replicas."""

    request: ScanRequest
    replicas: tuple[Replica, ...]


class ReadCoordinator:
    """Reads rows of a table or view from the replicas, one replica per tablet, falling back to the next."""

    def __init__(self, node_id: str, read_state: Callable, local: LocalScans, transport: ReplicaTransport,
                 clock: Callable[[], float] = time.monotonic):
        self.node_id = node_id
        self._read_state = read_state
        self._local = local
        self._transport = transport
        self._clock = clock

    def pages(self, table: Table, query: ReadQuery) -> Iterator[pa.RecordBatch]:
        """The rows as record batches (`token`, then `query.columns`), in (token, primary key) order."""
        ranges = self._ranges(table, query)
        remaining = query.limit
        for position, group in enumerate(ranges):
            self._check_deadline(query, f"{position} of {len(ranges)} token ranges read")
            first = group[0].request
            batches = (self._merged(table, group, remaining) if len(group) > 1 else self._range_pages(
                table, first if first.limit == remaining else replace(first, limit=remaining), group[0].replicas))
            for batch in batches:
                self._check_deadline(query, f"{position} of {len(ranges)} token ranges read")
                if remaining is not None:
                    batch = batch.slice(0, remaining)
                    remaining -= batch.num_rows
                if batch.num_rows:
                    yield batch
                if remaining == 0:
                    return

    def aggregate(self, table: Table, query: ReadQuery, aggregates: tuple[Aggregate, ...]) -> list:
        """The aggregates over the rows of `query` (its columns, after and limit are not used)."""
        ranges = [r for group in self._ranges(table, query) for r in group]
        if query.partitions is None:
            ranges = _coalesced(ranges)
        partials = []
        for position, one in enumerate(ranges):
            self._check_deadline(query, f"{position} of {len(ranges)} token ranges aggregated")
            partials.extend(self._range_partials(table, replace(one.request, aggregates=aggregates), one.replicas))
        types = {c.name: c.type for c in table.columns}
        return combine(aggregates, types, partials)

    def _ranges(self, table: Table, query: ReadQuery) -> list[list[_Range]]:
        """The replica reads of `query`, grouped: each group one token (or tablet), groups in token order."""
        version, layout = self._layout(table)
        def request(first: int, last: int, after, partition_key: tuple | None = None) -> ScanRequest:
            return ScanRequest(table.id, first, last, partition_key, query.limit, query.page_rows, after,
                               query.columns, query.filters, schema_version=version)

        after_token = None if query.after is None else query.after[0]
        if query.partitions is None:
            groups = []
            for tablet, replicas in enumerate(layout):
                first, last = tablet_range(tablet, len(layout))
                if after_token is not None and after_token > last:
                    continue
                after = query.after if after_token is not None and after_token >= first else None
                groups.append([_Range(request(first, last, after), replicas)])
            return groups
        by_token: dict[int, list[_Range]] = {}
        for key in dict.fromkeys(tuple(k) for k in query.partitions):
            token = partition_token(table, dict(zip(table.partition_key, key)))
            if after_token is not None and token < after_token:
                continue
            after = query.after if token == after_token else None
            one = _Range(request(token, token, after, key), layout[tablet_of(token, len(layout))])
            by_token.setdefault(token, []).append(one)
        return [by_token[token] for token in sorted(by_token)]

    def _merged(self, table: Table, group: list[_Range], limit: int | None) -> Iterator[pa.RecordBatch]:
        """Partitions sharing one token: read whole and ordered by primary key (what a hash collision needs)."""
        batches = [b for one in group
                   for b in self._range_pages(table, replace(one.request, limit=limit), one.replicas)]
        if not batches:
            return
        rows = pa.Table.from_batches(batches).combine_chunks()
        keys = rows.select(list(table.primary_key)).to_pylist()
        order = sorted(range(rows.num_rows), key=lambda i: tuple(sort_key(keys[i][c]) for c in table.primary_key))
        yield from rows.take(order).to_batches()

    def _layout(self, table: Table) -> tuple[int, tuple[tuple[Replica, ...], ...]]:
        """The schema version and the read replicas per tablet of `table`, from one read of the group0 state."""
        version, layout = self._read_state(lambda s: (s.schema_version, read_layout(s, table.id)))
        if layout is None:
            raise NotFound(f"{table.qualified_name} was dropped while this read was being prepared")
        return version, layout

    def _range_pages(self, table: Table, request: ScanRequest,
                     replicas: tuple[Replica, ...]) -> Iterator[pa.RecordBatch]:
        """The pages of one planned range; a replica's RangeMoved plans the rest of it again (see the module)."""
        progress = _Progress(table, request)
        parts = [_Range(request, replicas)]
        for replans in itertools.count():
            try:
                for part in parts:
                    rest = progress.rest(part.request)
                    if rest is None:
                        return
                    for page in self._first_replica_pages(rest, part.replicas):
                        progress.passed(page.batch)
                        yield page.batch
                return
            except RangeMoved as moved:
                parts = self._replanned(table, progress.remaining(moved), parts, moved, replans)

    def _range_partials(self, table: Table, request: ScanRequest, replicas: tuple[Replica, ...]) -> list:
        """The partial aggregates of one planned range (one per part); after a RangeMoved the whole range is planned
        and aggregated again: none of its partials were combined yet."""
        parts = [_Range(request, replicas)]
        for replans in itertools.count():
            try:
                return [next(self._first_replica_pages(part.request, part.replicas)).partials for part in parts]
            except RangeMoved as moved:
                parts = _coalesced(self._replanned(table, request, parts, moved, replans))

    def _replanned(self, table: Table, request: ScanRequest, refused: list[_Range], moved: RangeMoved,
                   replans: int) -> list[_Range]:
        """`request`'s range planned again on the replicas that read from it now, one part per tablet: first caught
        up past the version the `refused` plan was made at (the refusing replica had applied a newer one; every
        change of a tablet map or transition bumps the version)."""
        first, last = request.first_token, request.last_token
        if replans >= MAX_REPLANS:
            raise Unavailable(f"tokens {first}..{last} of {table.qualified_name} kept moving: their replicas refused "
                              f"the read {replans + 1} times as tablets moved away; run the statement again "
                              f"(last refusal: {moved.message})")
        log.info("read of %s tokens %d..%d planned again: %s", table.qualified_name, first, last, moved.message)
        self._local.catch_up(max(part.request.schema_version for part in refused) + 1)
        version, layout = self._layout(table)
        return _parts(replace(request, schema_version=version), layout)

    def _first_replica_pages(self, request: ScanRequest, replicas: tuple[Replica, ...]) -> Iterator[ScanPage]:
        """Pages from the first replica that delivers a first page; later pages stream without buffering.

        A replica failing before its first page is skipped for the next one (the local replica is tried
        first); a failure after it ends the read, since rows were already handed on.
        """
        errors = []
        for replica in _prefer_local(replicas, self.node_id):
            try:
                pages = iter(self._scan_one(replica.node, request))
                first = next(pages, None)
            except RangeMoved:
                raise  # the plan is stale: the next replica of it may be too (the caller plans again)
            except CoreError as error:
                errors.append(f"{replica.node}: {describe(error)}")
                continue
            return itertools.chain([] if first is None else [first], pages)
        raise Unavailable(f"no replica could serve tokens {request.first_token}..{request.last_token}: "
                          f"{'; '.join(errors)}")

    def _scan_one(self, node: str, request: ScanRequest) -> Iterator[ScanPage]:
        if node == self.node_id:
            return self._local.scan(request)
        return self._transport.scan(node, request)

    def _check_deadline(self, query: ReadQuery, progress: str) -> None:
        if query.deadline is not None and self._clock() > query.deadline:
            raise DeadlineExceeded(f"the deadline passed while {query.doing} ({progress}); give the statement more "
                                   "time (vbc exec --timeout S, or the client's timeout) or narrow it")


class _Progress:
    """How far the read of one planned range got: the rows handed on, and the (token, key) of the last one (None
    when its key could not be told from the columns read: the range cannot be resumed then)."""

    def __init__(self, table: Table, request: ScanRequest):
        self.table, self.request = table, request
        self.rows = 0
        self.after = request.after
        self.resumable = True

    def passed(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self.rows += batch.num_rows
            self.after = _last_position(self.table, self.request, batch)
            self.resumable = self.after is not None

    def rest(self, part: ScanRequest) -> ScanRequest | None:
        """`part` (of the range) limited to the rows still wanted; None once the range's limit is used up."""
        if self.request.limit is None:
            return part
        left = self.request.limit - self.rows
        return None if left <= 0 else replace(part, limit=left)

    def remaining(self, moved: RangeMoved) -> ScanRequest:
        """The range strictly after the last row handed on (the whole range when none was)."""
        if not self.resumable:
            raise Unavailable(f"{self.table.qualified_name}: a replica stopped serving tokens "
                              f"{self.request.first_token}..{self.request.last_token} in the middle of a read that "
                              f"cannot be resumed (its rows do not carry their primary key): {moved.message}")
        return replace(self.request, after=self.after)


def _last_position(table: Table, request: ScanRequest, batch: pa.RecordBatch) -> tuple[int, tuple] | None:
    """(token, primary key) of the batch's last row; key columns not read come from the request's partition, None
    when one is in neither."""
    row = batch.num_rows - 1
    partition = dict(zip(table.partition_key, request.partition_key or ()))
    key = []
    for column in table.primary_key:
        if column in batch.schema.names:
            key.append(batch[column][row].as_py())
        elif column in partition:
            key.append(partition[column])
        else:
            return None
    return batch["token"][row].as_py(), tuple(key)


def _parts(request: ScanRequest, layout: tuple[tuple[Replica, ...], ...]) -> list[_Range]:
    """`request` cut at the tablets of `layout` it overlaps, each part on that tablet's read replicas, resuming
    after `request.after` (parts wholly before it left out)."""
    count = len(layout)
    after_token = None if request.after is None else request.after[0]
    parts = []
    for tablet in range(tablet_of(request.first_token, count), tablet_of(request.last_token, count) + 1):
        first, last = tablet_range(tablet, count)
        first, last = max(first, request.first_token), min(last, request.last_token)
        if after_token is not None and after_token > last:
            continue
        after = request.after if after_token is not None and after_token >= first else None
        parts.append(_Range(replace(request, first_token=first, last_token=last, after=after), layout[tablet]))
    return parts


def _coalesced(ranges: list[_Range]) -> list[_Range]:
    """Adjacent token ranges with the same replicas as one range each (one request, one SQL statement)."""
    merged: list[_Range] = []
    for one in ranges:
        last = merged[-1] if merged else None
        if (last is not None and last.replicas == one.replicas and last.request.after is None
                and one.request.after is None and last.request.last_token + 1 == one.request.first_token):
            merged[-1] = _Range(replace(last.request, last_token=one.request.last_token), last.replicas)
        else:
            merged.append(one)
    return merged


def read_layout(state, table_id: str) -> tuple[tuple[Replica, ...], ...] | None:
    """The replicas a read may use, per tablet (a moving tablet's pending replica once reads switched to it)."""
    tablet_map = state.tablets.get(table_id)
    if tablet_map is None:
        return None
    if not state.transitions:
        return tablet_map.replicas
    return tuple(read_replicas(state, table_id, tablet) for tablet in range(tablet_map.tablet_count))


def _prefer_local(replicas: tuple[Replica, ...], node_id: str) -> list[Replica]:
    return sorted(replicas, key=lambda r: r.node != node_id)
