"""A build_range batch end to end on real stores and a real Spark session: every view row lands at its paired replica."""
from __future__ import annotations

import pytest

from common.injection import Injections
from coordinator.core import view_building
from coordinator.core.errors import Unavailable
from coordinator.core.schema import Replica, TabletMap
from coordinator.core.tokens import MAX_TOKEN, MIN_TOKEN, tablet_of, tablet_range
from replica.rows import storage_spec, upsert_row
from storage import bulk
from storage.ledger import TaskCheckpoint, FinishedTaskLedger
from storage.store import NodeStore
from worker.build_job import BuildJob, Chunking
from worker.executor import BatchControl
from worker.spark_session import NodeSpark, SparkConfig
from worker.tasks import StartBatch

from .replica_fakes import cluster_state

pytestmark = pytest.mark.integration
NODES = ("n1", "n2")


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    node_spark = NodeSpark(SparkConfig(master="local[1]", driver_memory="1g",
                                       data_dir=tmp_path_factory.mktemp("spark")))
    yield node_spark
    node_spark.stop()


@pytest.fixture
def cluster(tmp_path, spark):
    schema = cluster_state(nodes=NODES, rf=2, tablets=4, with_view=True)
    stores = {n: NodeStore.for_data_dir(tmp_path / n) for n in NODES}
    rows = [upsert_row(schema.table, {"key": i // 10, "c": i % 10, "v": str(i)}, ts=1000 + i) for i in range(300)]
    for store in stores.values():
        store.ensure_table(storage_spec(schema.table))
        store.apply(schema.table_id, rows)
    jobs = {n: BuildJob(n, stores[n], spark, lambda fn: fn(schema.state), lambda _version: None,
                        _merge_into(stores), Injections(), read_view_rows=_read_from(stores),
                        delete_view_rows=_delete_from(stores)) for n in NODES}
    yield schema, stores, jobs
    for store in stores.values():
        store.close()


def _merge_into(stores):
    def merge_remote(replica, view, _schema_version, rows):
        stores[replica.node].ensure_table(storage_spec(view))
        bulk.merge_view_rows(stores[replica.node], storage_spec(view), rows)
    return merge_remote


def _read_from(stores):
    def read_remote(replica, view, _schema_version, first, last):
        stores[replica.node].ensure_table(storage_spec(view))
        return bulk.read_token_range(stores[replica.node], storage_spec(view), first, last, include_tombstones=True)
    return read_remote


def _delete_from(stores):
    def delete_remote(replica, view, _schema_version, rows):
        return stores[replica.node].apply(view.id, rows).changed
    return delete_remote


def run_every_task(schema, jobs) -> int:
    scanned = 0
    for task in list(schema.state.tasks.values()):
        control = BatchControl({task.id: task})
        scanned += jobs[task.replica.node](StartBatch(1, task.replica.shard, 1, (task,)), control)
    return scanned


def view_rows(store, schema) -> set:
    return {row.key for row in store.scan(schema.view_id, MIN_TOKEN, MAX_TOKEN)}


def test_every_view_replica_gets_exactly_the_view_of_the_base(cluster):
    schema, stores, jobs = cluster
    assert run_every_task(schema, jobs) == 2 * 300  # each node's replicas together hold every row once
    expected = {(str(i), i // 10, i % 10) for i in range(300)}
    assert all(view_rows(stores[n], schema) == expected for n in NODES)
    assert sum(job.stats.spark_jobs for job in jobs.values()) == len(schema.state.tasks)


def test_a_retried_batch_changes_nothing_and_a_newer_live_write_wins(cluster):
    schema, stores, jobs = cluster
    view = schema.view
    newer = upsert_row(view, {"v": "5", "key": 0, "c": 5}, ts=10**9)
    for store in stores.values():
        store.ensure_table(storage_spec(view))
        store.apply(view.id, [newer])
    run_every_task(schema, jobs)
    before = {n: stores[n].scan(view.id, MIN_TOKEN, MAX_TOKEN, include_tombstones=True) for n in NODES}
    run_every_task(schema, jobs)
    assert all(stores[n].scan(view.id, MIN_TOKEN, MAX_TOKEN, include_tombstones=True) == before[n] for n in NODES)
    kept = next(r for r in before["n1"] if r.key == ("5", 0, 5))
    assert kept.marker_ts == 10**9


def test_a_repair_batch_deletes_stale_view_rows_and_outranks_a_lost_feeders_timestamps(cluster):
    """A view replica holds rows a lost feeder wrote: one its base row no longer implies, and one newer than the base
    row's view_ts. The repair tasks of one tablet delete the first, overwrite the second, and a later live write of
    that base row (at the replica's next view_ts) still wins."""
    schema, stores, jobs = cluster
    run_every_task(schema, jobs)
    view, base = schema.view, schema.table
    token = upsert_row(base, {"key": 0, "c": 0}, 0).token
    tablet = tablet_of(token, 4)
    feeder = schema.state.tablets[base.id].replicas[tablet][1]
    view_tablet = tablet_of(upsert_row(view, {"v": "0", "key": 0, "c": 0}, 0).token, 4)
    fed = schema.state.tablets[view.id].replicas[view_tablet][1]
    lost = [upsert_row(view, {"v": "gone", "key": 0, "c": 0}, ts=5000),  # the base row moved on: stale
            upsert_row(view, {"v": "0", "key": 0, "c": 0}, ts=10**6)]  # right key, a lost feeder's timestamp
    stores[fed.node].apply(view.id, lost)
    stale_token = lost[0].token
    schema.state.tasks.clear()
    view_building.ensure_repair_task(schema.state, view, tablet, feeder, seed=f"{7:032x}")
    assert run_every_task(schema, jobs) > 0
    assert stores[fed.node].get(view.id, stale_token, ("gone", 0, 0)) is None
    repaired = stores[fed.node].get(view.id, lost[1].token, ("0", 0, 0))
    assert repaired.marker_ts > 10**6 and jobs[feeder.node].stats.view_rows_repaired == 1
    floor = stores[feeder.node].get(base.id, token, (0, 0)).view_ts
    assert floor > 10**6


def test_a_tablet_without_rows_finishes_without_a_spark_job(tmp_path):
    schema = cluster_state(nodes=("n1",), rf=1, tablets=2, with_view=True)
    with NodeStore.for_data_dir(tmp_path / "n1") as store:
        store.ensure_table(storage_spec(schema.table))
        job = BuildJob("n1", store, NodeSpark(SparkConfig(master="local[1]")), lambda fn: fn(schema.state),
                       lambda _version: None, _merge_into({"n1": store}), Injections())
        task = next(iter(schema.state.tasks.values()))
        assert job(StartBatch(1, 0, 1, (task,)), BatchControl({task.id: task})) == 0
        assert job.stats.spark_jobs == 0 and job.stats.tablet_scans == 1


def test_a_batch_whose_rows_have_no_view_row_finishes_with_nothing_to_merge(tmp_path, spark):
    """Live base rows without the view's key column (v is NULL) give no view row, so no destination at all."""
    schema = cluster_state(nodes=("n1",), rf=1, tablets=1, with_view=True)
    with NodeStore.for_data_dir(tmp_path / "n1") as store:
        store.ensure_table(storage_spec(schema.table))
        store.apply(schema.table_id, [upsert_row(schema.table, {"key": i, "c": i, "v": None}, ts=10 + i)
                                      for i in range(20)])
        job = BuildJob("n1", store, spark, lambda fn: fn(schema.state), lambda _version: None,
                       _merge_into({"n1": store}), Injections())
        task = next(iter(schema.state.tasks.values()))
        assert job(StartBatch(1, 0, 1, (task,)), BatchControl({task.id: task})) == 20
        assert job.stats.spark_jobs == 1



def test_a_chunked_batch_builds_the_same_view_one_spark_job_per_chunk_and_resumes_at_its_checkpoint(cluster, spark,
                                                                                                   tmp_path):
    schema, stores, _ = cluster
    ledgers = {n: FinishedTaskLedger(tmp_path / f"{n}-ledger.db") for n in NODES}
    reported: dict[str, int] = {}
    jobs = {n: BuildJob(n, stores[n], spark, lambda fn: fn(schema.state), lambda _version: None,
                        _merge_into(stores), Injections(),
                        chunking=Chunking(ledgers[n], lambda: 20, reported.update)) for n in NODES}
    task = next(t for t in schema.state.tasks.values() if t.replica.node == "n1")
    tablet_rows = stores["n1"].count(schema.table_id, *tablet_range(task.tablet_id, 4))
    first, last = tablet_range(task.tablet_id, 4)
    middle = first + (last - first) // 2
    ledgers["n1"].record_progress({task.id: TaskCheckpoint(middle, 1234)})  # a worker stopped half way
    done = jobs["n1"](StartBatch(1, task.replica.shard, 1, (task,)), BatchControl({task.id: task}))
    rest = stores["n1"].count(schema.table_id, middle, last)
    assert done.scanned == rest < tablet_rows and done.per_task == {task.id: 1234 + rest}
    assert jobs["n1"].stats.spark_jobs >= rest // 20 and 1234 < reported[task.id] < 1234 + rest  # the last: at finish
    ledgers["n1"].forget([task.id])
    scanned = sum(jobs[t.replica.node](StartBatch(2, t.replica.shard, 1, (t,)), BatchControl({t.id: t})).scanned
                  for t in schema.state.tasks.values())
    assert scanned == 2 * 300
    expected = {(str(i), i // 10, i % 10) for i in range(300)}
    assert all(view_rows(stores[n], schema) == expected for n in NODES)
    assert sum(job.stats.spark_jobs for job in jobs.values()) > len(schema.state.tasks) + rest // 20
    for ledger in ledgers.values():
        ledger.close()


class KeptRows:
    """`UnreachableReplicas` of a test: what a batch kept, and the holds it made."""

    def __init__(self):
        self.kept, self.held = [], []

    def keep(self, replica, view, _schema_version, rows):
        self.kept.append((replica.node, rows))

    def hold(self, view_id, targets):
        self.held.append((view_id, targets))


def test_rows_for_an_unreachable_view_replica_are_kept_and_held_and_the_batch_still_finishes(cluster, spark):
    schema, stores, jobs = cluster
    view_map = schema.state.tablets[schema.view_id]
    schema.state.tablets[schema.view_id] = TabletMap(schema.view_id, tuple(rs[::-1] for rs in view_map.replicas))
    merge = _merge_into(stores)  # n1 feeds the view's replicas on n2 now, and n2 those on n1

    def merge_unless_n2(replica, view, schema_version, rows):
        if replica.node == "n2":
            raise Unavailable("n2: connection refused")
        merge(replica, view, schema_version, rows)

    kept = KeptRows()
    jobs["n1"] = BuildJob("n1", stores["n1"], spark, lambda fn: fn(schema.state), lambda _version: None,
                          merge_unless_n2, Injections(), unreachable=kept)
    run_every_task(schema, jobs)
    n1_tasks = sum(1 for t in schema.state.tasks.values() if t.replica.node == "n1")
    assert kept.held and all(held == (schema.view_id, ("n2",)) for held in kept.held) and len(kept.held) <= n1_tasks
    assert jobs["n1"].stats.view_rows_kept == sum(rows.num_rows for _, rows in kept.kept)
    expected = {(str(i), i // 10, i % 10) for i in range(300)}
    stores["n2"].ensure_table(storage_spec(schema.view))
    assert view_rows(stores["n1"], schema) == expected and not view_rows(stores["n2"], schema)
    for node, rows in kept.kept:  # what the outbox delivers once n2 answers
        merge(Replica(node, 0), schema.view, 0, rows)
    assert view_rows(stores["n2"], schema) == expected
