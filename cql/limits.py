"""Size limits of client requests, checked before any parsing: statement text, one value, rows per execution."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.core.errors import InvalidArgument

MAX_LIMIT = 2**31 - 1  # SELECT ... LIMIT n: CQL's LIMIT is a 32-bit int


@dataclass(frozen=True)
class Limits:
    """What one request may hold (`vbc node start --max-statement-bytes/--max-value-bytes/--max-batch-rows`).

    Defaults: statement text 4 MiB (UTF-8), one value 16 MiB (a text's UTF-8 bytes), 50,000 rows per execution
    (bind-value sets of one Execute, or statements of one BATCH). gRPC messages may reach 64 MiB.
    """

    max_statement_bytes: int = 4 * 2**20
    max_value_bytes: int = 16 * 2**20
    max_batch_rows: int = 50_000

    def __post_init__(self) -> None:
        for name in ("max_statement_bytes", "max_value_bytes", "max_batch_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    def check_statement(self, text: str) -> None:
        """INVALID_ARGUMENT when the statement text is longer than `max_statement_bytes`."""
        if len(text) * 4 <= self.max_statement_bytes:
            return  # a UTF-8 character takes at most 4 bytes: no need to encode
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_statement_bytes:
            raise InvalidArgument(f"the statement is {size:,} bytes, over the limit of {self.max_statement_bytes:,} "
                                  "(max_statement_bytes): use bind markers (?) with value sets, or smaller batches")

    def check_rows(self, rows: int, what: str = "bind-value sets") -> None:
        """INVALID_ARGUMENT when one execution carries more than `max_batch_rows` rows."""
        if rows > self.max_batch_rows:
            raise InvalidArgument(f"{rows:,} {what} in one execution, over the limit of {self.max_batch_rows:,} "
                                  "(max_batch_rows): split it into smaller executions")

    def check_values(self, rows: Iterable[Iterable[object]]) -> None:
        """INVALID_ARGUMENT for a text value longer than `max_value_bytes` (the first one found is named)."""
        for row_number, row in enumerate(rows, start=1):
            for position, value in enumerate(row, start=1):
                if isinstance(value, str) and len(value) * 4 > self.max_value_bytes:
                    self._check_text(value, row_number, position)

    def _check_text(self, value: str, row_number: int, position: int) -> None:
        size = len(value.encode("utf-8", "surrogatepass"))
        self.check_value_bytes(size, f"value {position} of value set {row_number}")

    def check_value_bytes(self, size: int, what: str) -> None:
        """INVALID_ARGUMENT when a value of `size` bytes (`what` names it) is over `max_value_bytes`."""
        if size > self.max_value_bytes:
            raise InvalidArgument(f"{what} is {size:,} bytes, over the limit of {self.max_value_bytes:,} "
                                  "(max_value_bytes)")
