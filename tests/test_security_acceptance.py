"""A secure cluster from `vbc cluster up` with real processes: everything works through the cluster directory's
credentials; plaintext and other CAs' certificates are refused at the handshake; client certificates may not call
the node-to-node services; an insecure node says so in `vbc status`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from common import certs
from tests.cluster_harness import LocalCluster
from vbc import client
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def vbc(*args: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != client.CREDENTIALS_ENV}
    return subprocess.run([sys.executable, "-m", "vbc", *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**environment, "PYTHONPATH": str(ROOT)})


def test_a_secure_cluster_works_through_its_credentials_and_refuses_everyone_else(tmp_path):
    with LocalCluster(nodes=3, secure=True) as cluster:
        target = ("--cluster", str(cluster.data_dir))
        credentials = cluster.data_dir / "credentials"
        assert {"ca.crt", "client.root.crt", "client.root.key"} <= {p.name for p in credentials.iterdir()}
        assert all((Path(n["data_dir"]) / "node.crt").exists() for n in cluster.nodes)

        for statement in ("CREATE KEYSPACE sec WITH replication = {'rf': 3} AND tablets = {'initial': 4}",
                          "CREATE TABLE sec.t (k int, c int, v text, PRIMARY KEY (k, c))",
                          "INSERT INTO sec.t (k, c, v) VALUES (1, 1, 'a')",
                          "INSERT INTO sec.t (k, c, v) VALUES (2, 1, 'b')",
                          "CREATE MATERIALIZED VIEW sec.by_v AS SELECT * FROM sec.t WHERE v IS NOT NULL AND c IS NOT NULL "
                          "PRIMARY KEY (v, k, c)"):
            done = vbc("exec", *target, statement)
            assert done.returncode == 0, done.stderr
        built = vbc("wait-built", *target, "sec.by_v", "--timeout", "240")
        assert built.returncode == 0, built.stderr
        checked = vbc("check", *target, "sec.by_v")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        rows = vbc("exec", *target, "--json", "SELECT * FROM sec.by_v WHERE v = 'b'")
        assert [json.loads(line) for line in rows.stdout.splitlines()] == [{"v": "b", "k": 2, "c": 1}]
        status = json.loads(vbc("status", *target, "--json").stdout)
        assert len(status["nodes"]) == 3 and not any(node["insecure"] for node in status["nodes"])
        with_folder = vbc("exec", "--addr", cluster.addr("n2"), "--credentials", str(credentials),
                          "SELECT COUNT(*) FROM sec.t")
        assert with_folder.returncode == 0 and "2" in with_folder.stdout, with_folder.stderr
        without = vbc("exec", "--addr", cluster.addr("n2"), "--timeout", "5", "SELECT COUNT(*) FROM sec.t")
        assert without.returncode != 0 and "UNAVAILABLE" in without.stderr

        for address in cluster.addresses():
            with pytest.raises(grpc.RpcError) as plaintext:
                rpc.ClientStub(grpc.insecure_channel(address)).Execute(pb.ExecuteRequest(statement="SELECT 1"),
                                                                       timeout=5)
            assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE

        other = tmp_path / "other-ca"
        certs.create_ca(other)
        certs.create_client_cert(other, "root")
        stranger = grpc.secure_channel(cluster.addr("n1"), grpc.ssl_channel_credentials(
            **certs.client_tls_material(other, "root")._asdict()))
        with pytest.raises(grpc.RpcError) as handshake:
            rpc.ClientStub(stranger).Execute(pb.ExecuteRequest(statement="SELECT COUNT(*) FROM sec.t"), timeout=5)
        assert handshake.value.code() == grpc.StatusCode.UNAVAILABLE

        user = grpc.secure_channel(cluster.addr("n1"), client.credentials_from(credentials))
        for call, request in ((rpc.InternodeStub(user).ReplicaWrite, pb.MutationBatch(table_id="ab" * 16)),
                              (rpc.WorkerStub(user).WorkOnViewBuildingTasks, pb.WorkRequest(term=1, task_ids=["x"]))):
            with pytest.raises(grpc.RpcError) as refused:
                call(request, timeout=5)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "is for the cluster's nodes only" in refused.value.details() and "'root'" in refused.value.details()
        assert cluster.query("SELECT COUNT(*) FROM sec.t") == [{"count": 2}], "the refused write changed nothing"


def test_an_insecure_node_says_so_in_status():
    with LocalCluster(nodes=1, spark_prestart=False) as cluster:
        assert cluster.status()["nodes"][0]["insecure"] is True
        assert "--insecure" in cluster.node("n1")["command"]
        assert "WITHOUT TLS" in cluster.log("n1")
