"""Query results as Arrow: pages fetched lazily with CQL paging, streamed pages, whole Arrow tables and DataFrames.

A page is one Arrow record batch. `pages` asks for one page per call and resumes from the page's paging state, on
any node (the node keeps nothing between pages); `stream` reads the pages of one server stream and, if that node
goes away in the middle, resumes on the next address from the last page it got.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import grpc
import pyarrow as pa

from common.arrow_stream import batch_from_ipc
from common.values import values_from_proto, values_to_proto
from storage.arrow_layouts import arrow_type
from vbcpb import vbc_pb2 as pb

from vbc import client

DEFAULT_PAGE_ROWS = 5000


@dataclass
class Page:
    """One page of a statement's answer: `rows` (None for an answer without rows), and where the next page starts."""

    columns: list[tuple[str, str]]
    rows: pa.RecordBatch | None
    message: str = ""
    paging_state: bytes = b""
    plan: str = ""


def page_of(response: pb.ExecuteResponse) -> Page:
    """A response as a Page; rows a server sent as protobuf rows (not asked for Arrow) are converted."""
    columns = [(c.name, c.type) for c in response.columns]
    if response.arrow_rows:
        rows = batch_from_ipc(response.arrow_rows)
    elif columns:
        values = [values_from_proto(row) for row in response.rows]
        rows = batch_of_rows(columns, values)
    else:
        rows = None
    return Page(columns, rows, response.message, response.paging_state, response.plan)


def batch_of_rows(columns: list[tuple[str, str]], rows: list[list]) -> pa.RecordBatch:
    """Rows (lists of values) as a record batch with the columns' Arrow types."""
    arrays = [pa.array([row[i] for row in rows], arrow_type(kind)) for i, (_, kind) in enumerate(columns)]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema([(n, arrow_type(k)) for n, k in columns]))


def _request(addr: str, statement: str, params, page_size: int, paging_state: bytes,
             timeout: float) -> pb.ExecuteRequest:
    request = pb.ExecuteRequest(page_size=page_size, paging_state=paging_state, arrow_results=True)
    if params:
        request.prepared_id = client.prepare(addr, statement, timeout).id
        request.params.extend(values_to_proto(list(row)) for row in params)
    else:
        request.statement = statement
    return request


def fetch_page(addr: str, statement: str, page_size: int = DEFAULT_PAGE_ROWS, paging_state: bytes = b"",
               params=None, timeout: float = client.DEFAULT_TIMEOUT) -> Page:
    """One page (at most `page_size` rows) of `statement` from the node at `addr`, from `paging_state` on."""
    for attempt in (1, 2):
        request = _request(addr, statement, params, page_size, paging_state, timeout)
        try:
            return page_of(client.client_stub(addr).Execute(request, timeout=timeout))
        except grpc.RpcError as error:
            if attempt == 2 or not params or not client.is_unprepared(error):
                raise
            client.forget_prepared(addr, statement)
    raise AssertionError("unreachable")


def pages(addresses: str | Iterable[str], statement: str, page_size: int = DEFAULT_PAGE_ROWS, params=None,
          timeout: float = client.DEFAULT_TIMEOUT) -> Iterator[Page]:
    """The pages of `statement`, each fetched when the previous one has been used (one Execute call per page, on
    the first node of `addresses` that answers)."""
    state = b""
    while True:
        page = client.call_any(addresses, lambda addr: fetch_page(addr, statement, page_size, state, params, timeout),
                               idempotent=True)
        yield page
        if not page.paging_state:
            return
        state = page.paging_state


def stream(addresses: str | Iterable[str], statement: str, page_size: int = DEFAULT_PAGE_ROWS, params=None,
           timeout: float = client.DEFAULT_TIMEOUT) -> Iterator[Page]:
    """The pages of `statement` as one server stream (no round trip per page); a node that goes away mid-stream
    is replaced by the next address, which resumes after the last page received."""
    state, last_error = b"", None
    for addr in client.as_addresses(addresses):
        try:
            request = _request(addr, statement, params, page_size, state, timeout)
            for response in client.client_stub(addr).ExecuteStream(request, timeout=timeout):
                page = page_of(response)
                yield page
                state = page.paging_state
            return
        except grpc.RpcError as error:
            if not client.is_unreachable(addr, error, idempotent=True):
                raise
            last_error = error
    assert last_error is not None
    raise last_error


def query_arrow(addresses: str | Iterable[str], statement: str, params=None,
                timeout: float = client.DEFAULT_TIMEOUT) -> pa.Table:
    """Every row of a SELECT as one `pyarrow.Table` (columns typed as the table's)."""
    batches, schema = [], None
    for page in stream(addresses, statement, params=params, timeout=timeout):
        if page.rows is not None:
            schema = page.rows.schema
            if page.rows.num_rows:
                batches.append(page.rows)
    if schema is None:
        raise ValueError(f"{statement!r} answers no rows (it is not a SELECT)")
    return pa.Table.from_batches(batches, schema=schema)


def query_dataframe(addresses: str | Iterable[str], statement: str, params=None,
                    timeout: float = client.DEFAULT_TIMEOUT):
    """Every row of a SELECT as a pandas `DataFrame`."""
    return query_arrow(addresses, statement, params, timeout).to_pandas()
