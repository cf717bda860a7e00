"""A 3-node cluster whose nodes store their rows in PostgreSQL (one database per node) instead of SQLite."""
from __future__ import annotations

import pytest
import sqlalchemy as sa

from vbc.cluster import ClusterError, new_cluster

from .cluster_harness import LocalCluster
from .postgres import create_database, throwaway_postgres

pytestmark = pytest.mark.integration


def test_a_shared_storage_url_for_several_nodes_is_refused(tmp_path):
    with pytest.raises(ClusterError, match=r"\{node\}"):
        new_cluster(tmp_path, 3, storage_url="postgresql+psycopg://u@h/db")


def test_cluster_on_postgresql_keeps_views_up_to_date(tmp_path):
    with throwaway_postgres() as server:
        for node_id in ("n1", "n2", "n3"):
            create_database(server, f"vbc_{node_id}")
        url = server.rsplit("/", 1)[0] + "/vbc_{node}"
        with LocalCluster(3, tmp_path, storage_url=url) as cluster:
            cluster.execute("CREATE KEYSPACE pg WITH replication = {'rf': 3} AND tablets = {'initial': 4}")
            cluster.execute("CREATE TABLE pg.t (k int, name text, PRIMARY KEY (k))", node="n2")
            cluster.execute("CREATE INDEX ON pg.t (name)", node="n3")
            cluster.execute("BEGIN BATCH " + " ".join(
                f"INSERT INTO pg.t (k, name) VALUES ({i}, 'n{i % 5}');" for i in range(100)) + " APPLY BATCH")
            cluster.execute("UPDATE pg.t SET name = 'zz' WHERE k = 7")
            cluster.execute("DELETE FROM pg.t WHERE k = 8")
            cluster.wait_views_flushed()
            assert len(cluster.query("SELECT * FROM pg.t")) == 99
            index = cluster.query("SELECT * FROM pg.t_name_idx WHERE name = 'zz' ALLOW STALE", node="n1")
            assert index == [{"name": "zz", "k": 7}]
            for node_id in ("n1", "n2", "n3"):
                engine = sa.create_engine(sa.make_url(server).set(database=f"vbc_{node_id}"))
                try:
                    with engine.connect() as conn:
                        tables = conn.execute(sa.text("SELECT count(*) FROM storage_catalog")).scalar()
                finally:
                    engine.dispose()
                assert tables == 2, f"{node_id} stores the table and its index in PostgreSQL"
