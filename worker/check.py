"""The consistency checker: a view against its function of the base table, view tablet replica by replica, in Spark.

View replica r of a view tablet is paired with replica r of every base tablet (the write path's pairing rule:
`replica.view_updates.pair_index`), so for each pairing position r the check reads the base replicas at r and
the view replicas at r, computes the expected view rows from the base rows with the one compiled view
definition (`worker.spark_views.view_rows`, as the build does) and full-outer-joins them with the stored view
rows on the view's primary key: a row only expected is MISSING, a row only stored is EXTRA, a row whose values
differ (NULL-safe, NaN equal to NaN) is DIFFERENT. Timestamps are not compared.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from coordinator.core.errors import InvalidArgument
from coordinator.core.schema import Replica, Table
from coordinator.core.tokens import tablet_range
from storage.arrow_layouts import value_column_name

from worker.spark_session import NodeSpark
from worker.spark_views import MERGE, quote, staged_frame, tablet_sql, view_rows

ReadRange = Callable[[Replica, Table, int, int, int], pa.Table]  # (replica, table, schema_version, first, last)
KINDS = ("MISSING", "EXTRA", "DIFFERENT")
DEFAULT_EXAMPLES = 5


@dataclass(frozen=True)
class CheckPlan:
    """What a check reads, taken from one group0 snapshot."""

    base: Table
    view: Table
    base_replicas: tuple[tuple[Replica, ...], ...]
    view_replicas: tuple[tuple[Replica, ...], ...]
    schema_version: int
    built: bool


def check_plan(state, keyspace: str, name: str) -> CheckPlan:
    view = state.require_table(keyspace, name)
    if view.view is None:
        raise InvalidArgument(f"{view.qualified_name} is a base table; vbc check takes a view or an index")
    base = state.tables[view.view.base_id]
    return CheckPlan(base, view, state.tablets[base.id].replicas, state.tablets[view.id].replicas,
                     state.schema_version, state.view_is_built(view.id))


@dataclass
class Difference:
    kind: str
    replica: str
    key: str
    expected: str = ""
    found: str = ""


@dataclass
class CheckResult:
    view: str
    state: str
    base_rows: int = 0
    view_rows: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    examples: list[Difference] = field(default_factory=list)
    replicas_checked: int = 0
    seconds: float = 0.0

    @property
    def consistent(self) -> bool:
        return not any(self.counts.values())


def check_view(plan: CheckPlan, read_range: ReadRange, spark: NodeSpark,
               max_examples: int = DEFAULT_EXAMPLES) -> CheckResult:
    """Compare every view tablet replica of `plan.view` with the rows its paired base replicas imply."""
    started = time.monotonic()
    result = CheckResult(plan.view.qualified_name, "BUILT" if plan.built else "BUILDING")
    replication = len(plan.view_replicas[0]) if plan.view_replicas else 0
    for pair in range(replication):
        base_rows = _read_all(plan.base, plan.base_replicas, pair, plan.schema_version, read_range)
        stored = _read_all(plan.view, plan.view_replicas, pair, plan.schema_version, read_range)
        result.base_rows += base_rows.num_rows
        result.view_rows += stored.num_rows
        result.replicas_checked += len(plan.view_replicas)
        if base_rows.num_rows or stored.num_rows:
            _compare(plan, pair, base_rows, stored, spark, max_examples, result)
    result.seconds = time.monotonic() - started
    return result


def _read_all(table: Table, replicas: tuple[tuple[Replica, ...], ...], pair: int, version: int,
              read_range: ReadRange) -> pa.Table:
    parts = []
    for tablet, tablet_replicas in enumerate(replicas):
        first, last = tablet_range(tablet, len(replicas))
        parts.append(read_range(tablet_replicas[pair], table, version, first, last))
    return pa.concat_tables(parts)


def _compare(plan: CheckPlan, pair: int, base_rows: pa.Table, stored: pa.Table, spark: NodeSpark,
             max_examples: int, result: CheckResult) -> None:
    view = plan.view
    keys = [value_column_name(n) for n in view.primary_key]
    values = [value_column_name(c.name) for c in view.regular_columns]
    with staged_frame(spark, base_rows) as base_frame, \
            staged_frame(spark, stored.select(["token", *keys, *values])) as stored_frame:
        expected = view_rows(base_frame, plan.base, view, MERGE)
        expected = expected.selectExpr("token", *[f"{quote(k)}" for k in keys],
                                       *[f"{quote(v)} AS {quote('e_' + v)}" for v in values], "TRUE AS __e")
        found = stored_frame.selectExpr("token AS __token_s", *[quote(k) for k in keys],
                                        *[f"{quote(v)} AS {quote('s_' + v)}" for v in values], "TRUE AS __s")
        joined = expected.join(found, on=keys, how="full_outer")
        differs = " OR ".join(f"NOT ({quote('e_' + v)} <=> {quote('s_' + v)})" for v in values) or "FALSE"
        kind = (f"CASE WHEN __s IS NULL THEN 'MISSING' WHEN __e IS NULL THEN 'EXTRA' "
                f"WHEN {differs} THEN 'DIFFERENT' END")
        tablet = tablet_sql("COALESCE(token, __token_s)", len(plan.view_replicas))
        diffs = joined.selectExpr("*", f"{kind} AS __kind", f"{tablet} AS __tablet").where("__kind IS NOT NULL")
        for row in diffs.groupBy("__kind").count().collect():
            result.counts[row["__kind"]] += row["count"]
        for name in KINDS:
            wanted = max_examples - _examples_of(result, name)
            if not result.counts[name] or wanted <= 0:
                continue
            for row in diffs.where(f"__kind = '{name}'").limit(wanted).collect():
                result.examples.append(_difference(plan, pair, row.asDict(), keys, values))


def _examples_of(result: CheckResult, kind: str) -> int:
    return sum(1 for e in result.examples if e.kind == kind)


def _difference(plan: CheckPlan, pair: int, row: dict, keys: list[str], values: list[str]) -> Difference:
    replica = plan.view_replicas[row["__tablet"]][pair]
    key = ", ".join(f"{k[2:]}={row[k]!r}" for k in keys)
    expected = ", ".join(f"{v[2:]}={row['e_' + v]!r}" for v in values) if row["__e"] else ""
    found = ", ".join(f"{v[2:]}={row['s_' + v]!r}" for v in values) if row["__s"] else ""
    return Difference(row["__kind"], str(replica), f"({key})", f"({expected})" if row["__e"] else "",
                      f"({found})" if row["__s"] else "")
