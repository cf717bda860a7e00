"""RF changes that move data, against real node processes: RF 2 -> 3 -> 2 during a build with concurrent writes, and
RF 1 -> 2 after a view was built.

One 3-node cluster for the module. Each scenario ends with the view BUILT, `vbc check` clean, and every node
answering a full scan of the base with exactly the expected rows (a node reads its own replica first, so the
replicas that were added answer too).
"""
from __future__ import annotations

import pytest

from vbc import client

from .cluster_harness import LocalCluster, wait_until
from .test_tablet_migration_acceptance import Writer, create_view
from .test_view_building_acceptance import _logs_on_failure, assert_correct, injected, insert_rows, run, wait_hit

pytestmark = pytest.mark.integration

NODES = ("n1", "n2", "n3")
CHANGE_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def _cluster(tmp_path_factory):
    with LocalCluster(3, tmp_path_factory.mktemp("rf-cluster"), shards=1) as started:
        client.balancer(started.addresses(), "off")  # the leader-kill scenario places a tablet by hand
        yield started


@pytest.fixture
def cluster(_cluster, request):
    with _logs_on_failure(request, _cluster):
        yield _cluster


def make_base(cluster: LocalCluster, ks: str, rows: int, rf: int) -> dict[tuple[int, int], str]:
    run(cluster, f"CREATE KEYSPACE {ks} WITH replication = {{'rf': {rf}}} AND tablets = {{'initial': 2}}")
    run(cluster, f"CREATE TABLE {ks}.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    insert_rows(cluster, ks, range(rows))
    return {(i // 10, i % 10): str(i) for i in range(rows)}


def alter_rf(cluster: LocalCluster, ks: str, rf: int) -> str:
    _, _, message = run(cluster, f"ALTER KEYSPACE {ks} WITH replication = {{'rf': {rf}}}")
    for table in (f"{ks}.tab", f"{ks}.mv"):
        wait_until(lambda: all(len(t["replicas"]) == rf and "stage" not in t
                               for t in client.tablets(cluster.addresses(), table)),
                   CHANGE_TIMEOUT, f"every tablet of {table} to have {rf} replicas")
    return message


def assert_every_node_scans(cluster: LocalCluster, ks: str, expected: dict[tuple[int, int], str]) -> None:
    want = sorted((key, c, v) for (key, c), v in expected.items())
    for node in NODES:
        got = sorted((r["key"], r["c"], r["v"]) for r in client.query(cluster.addr(node), f"SELECT * FROM {ks}.tab",
                                                                       timeout=120))
        assert got == want, f"{node}: {len(got)} rows, expected {len(want)}"


def test_rf_2_to_3_and_back_to_2_during_a_build_with_concurrent_writes(cluster):
    ks = "rf1"
    expected = make_base(cluster, ks, 2000, rf=2)
    holder = client.tablets(cluster.addresses(), f"{ks}.tab")[0]["replicas"][0].split(":")[0]
    with injected(cluster, "worker_pause_build_range", NODES):
        create_view(cluster, ks)
        wait_hit(cluster, "worker_pause_build_range", holder)
        with Writer(cluster, ks, expected, seed=7) as writer:
            message = alter_rf(cluster, ks, 3)
            assert "in the background" in message, message
            alter_rf(cluster, ks, 2)
        assert writer.error is None and writer.writes > 0, writer.error
    assert_correct(cluster, ks)
    assert_every_node_scans(cluster, ks, writer.expected)


def test_rf_1_to_2_after_the_view_was_built(cluster):
    ks = "rf2"
    expected = make_base(cluster, ks, 1500, rf=1)
    create_view(cluster, ks)
    assert_correct(cluster, ks)
    alter_rf(cluster, ks, 2)
    assert_correct(cluster, ks)
    assert_every_node_scans(cluster, ks, expected)
    for table in (f"{ks}.tab", f"{ks}.mv"):
        assert all(len({r.split(":")[0] for r in t["replicas"]}) == 2 for t in client.tablets(cluster.addresses(), table))


def test_a_leader_killed_in_the_middle_of_a_migration_is_followed_by_one_that_finishes_it(cluster):
    ks = "rf3"
    expected = make_base(cluster, ks, 1500, rf=1)
    with injected(cluster, "worker_pause_build_range", NODES):
        create_view(cluster, ks)
        source = client.tablets(cluster.addresses(), f"{ks}.tab")[0]["replicas"][0].split(":")[0]
        leader = cluster.wait_for_leader()
        destination = next(n for n in NODES if n not in (source, leader))  # a dead pending replica rolls back
        with injected(cluster, "pause_tablet_migration_stage", NODES):
            migration_id = client.move_tablet(cluster.addresses(), f"{ks}.tab", 0, source, destination)
            wait_hit(cluster, "pause_tablet_migration_stage", leader)
            cluster.stop_node(leader, kill=True)
            cluster.wait_for_leader(exclude=[leader])
        cluster.start_node(leader)
        result = client.wait_migration(cluster.addresses(), migration_id, CHANGE_TIMEOUT)
        assert result["state"] == "done", result
        assert client.tablets(cluster.addresses(), f"{ks}.tab")[0]["replicas"][0].split(":")[0] == destination
    assert_correct(cluster, ks)
    assert_every_node_scans(cluster, ks, expected)
