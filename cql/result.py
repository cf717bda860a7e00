"""What a statement returns to the client: rows with their columns, or an acknowledgement message."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Result:
    """Rows with their columns (name, type), or an acknowledgement message."""

    columns: list[tuple[str, str]] = field(default_factory=list)
    rows: list[list] = field(default_factory=list)
    message: str = ""


def paged(columns: list, rows: Iterator[list], page_size: int | None) -> Iterator[Result]:
    """`rows` cut into Results of at most `page_size` rows (one Result when no page size); never zero Results."""
    if not page_size:
        yield Result(columns=columns, rows=list(rows))
        return
    page: list = []
    sent = False
    for row in rows:
        page.append(row)
        if len(page) >= page_size:
            yield Result(columns=columns, rows=page)
            page, sent = [], True
    if page or not sent:
        yield Result(columns=columns, rows=page)
