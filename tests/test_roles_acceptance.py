"""Roles and grants on a secure node with real processes: a role with SELECT on one keyspace reads it and nothing
more until granted; password logins through the CLI; wrong passwords refused, and no password written anywhere."""
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
PASSWORD = "Tr0ub4dor-and-3-horses"
ROOT_PASSWORD = "root's own, given"


def vbc(*args: str, password: str | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in (client.CREDENTIALS_ENV, client.PASSWORD_ENV)}
    if password is not None:
        environment[client.PASSWORD_ENV] = password
    return subprocess.run([sys.executable, "-m", "vbc", *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**environment, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)


def as_root(cluster: LocalCluster, *statements: str) -> None:
    for statement in statements:
        done = vbc("exec", "--cluster", str(cluster.data_dir), statement)
        assert done.returncode == 0, done.stderr


def as_alice(cluster: LocalCluster, *args: str, password: str = PASSWORD) -> subprocess.CompletedProcess:
    return vbc(*args, "--cluster", str(cluster.data_dir), "--user", "alice", password=password)


def test_a_role_reads_what_it_was_granted_and_writes_only_after_grant_modify(tmp_path):
    with LocalCluster(nodes=1, secure=True, root_password=ROOT_PASSWORD) as cluster:
        as_root(cluster,
                "CREATE KEYSPACE ks1 WITH replication = {'rf': 1} AND tablets = {'initial': 2}",
                "CREATE KEYSPACE ks2 WITH replication = {'rf': 1} AND tablets = {'initial': 2}",
                "CREATE TABLE ks1.t (k int PRIMARY KEY, v text)",
                "CREATE TABLE ks2.t (k int PRIMARY KEY, v text)",
                "INSERT INTO ks1.t (k, v) VALUES (1, 'one')",
                f"CREATE ROLE alice WITH PASSWORD = '{PASSWORD}' AND LOGIN = true AND SUPERUSER = false",
                "GRANT SELECT ON KEYSPACE ks1 TO alice")

        read = as_alice(cluster, "exec", "--json", "SELECT * FROM ks1.t")
        assert read.returncode == 0, read.stderr
        assert [json.loads(line) for line in read.stdout.splitlines()] == [{"k": 1, "v": "one"}]
        write = as_alice(cluster, "exec", "INSERT INTO ks1.t (k, v) VALUES (2, 'two')")
        assert write.returncode != 0 and "PERMISSION_DENIED" in write.stderr
        assert "MODIFY" in write.stderr and "TABLE ks1.t" in write.stderr
        other = as_alice(cluster, "exec", "SELECT * FROM ks2.t")
        assert other.returncode != 0 and "PERMISSION_DENIED" in other.stderr and "SELECT" in other.stderr
        inject = as_alice(cluster, "inject", "--list")
        assert inject.returncode != 0 and "PERMISSION_DENIED" in inject.stderr and "superuser" in inject.stderr
        grant = as_alice(cluster, "exec", "GRANT MODIFY ON TABLE ks1.t TO alice")
        assert grant.returncode != 0 and "PERMISSION_DENIED" in grant.stderr

        as_root(cluster, "GRANT MODIFY ON TABLE ks1.t TO alice")
        write = as_alice(cluster, "exec", "INSERT INTO ks1.t (k, v) VALUES (2, 'two')")
        assert write.returncode == 0, write.stderr
        listed = as_alice(cluster, "exec", "--json", "LIST ALL PERMISSIONS OF alice")
        assert {(r["resource"], r["permission"]) for r in map(json.loads, listed.stdout.splitlines())} == {
            ("KEYSPACE ks1", "SELECT"), ("TABLE ks1.t", "MODIFY")}

        as_root(cluster, "REVOKE MODIFY ON TABLE ks1.t FROM alice")
        write = as_alice(cluster, "exec", "INSERT INTO ks1.t (k, v) VALUES (3, 'three')")
        assert write.returncode != 0 and "PERMISSION_DENIED" in write.stderr
        status = as_alice(cluster, "status", "--json")  # a login may see the status
        assert status.returncode == 0, status.stderr

        wrong = as_alice(cluster, "exec", "SELECT * FROM ks1.t", password="not-" + PASSWORD)
        assert wrong.returncode != 0 and "UNAUTHENTICATED" in wrong.stderr
        anonymous = rpc.ClientStub(grpc.secure_channel(cluster.node("n1")["client"], grpc.ssl_channel_credentials(
            (cluster.data_dir / "credentials" / "ca.crt").read_bytes())))
        with pytest.raises(grpc.RpcError) as nobody:
            anonymous.Execute(pb.ExecuteRequest(statement="SELECT * FROM ks1.t"), timeout=10)
        assert nobody.value.code() == grpc.StatusCode.UNAUTHENTICATED

        assert (cluster.data_dir / "credentials" / "root.password").read_text().strip() == ROOT_PASSWORD
        assert (cluster.data_dir / "credentials" / "root.password").stat().st_mode & 0o777 == 0o600
        roles = vbc("exec", "--cluster", str(cluster.data_dir), "--user", "root", "--json", "LIST ROLES",
                    password=ROOT_PASSWORD)
        assert roles.returncode == 0, roles.stderr
        assert {r["role"]: r["super"] for r in map(json.loads, roles.stdout.splitlines())} == {
            "alice": False, "root": True}

        certs.create_client_cert(cluster.data_dir / "credentials", "bob", out_dir=tmp_path / "bob",
                                 ca_key=cluster.data_dir / "ca" / "ca.key")  # kept apart from the credentials
        bob = vbc("exec", "--addr", cluster.addr("n1"), "--credentials", str(tmp_path / "bob"), "LIST ROLES")
        assert bob.returncode != 0 and "UNAUTHENTICATED" in bob.stderr and "no role 'bob'" in bob.stderr
        status = vbc("status", "--cluster", str(cluster.data_dir), "--json")
        assert status.returncode == 0
        outputs = status.stdout + read.stdout + listed.stdout + roles.stdout + wrong.stderr
        assert PASSWORD not in outputs
        cluster.stop_node("n1")  # every journal, database and log flushed
        files = [p for p in cluster.data_dir.rglob("*") if p.is_file()]
        assert any(p.name == "node.log" for p in files) and len(files) > 10
        holding = [str(p) for p in files if PASSWORD.encode() in p.read_bytes()]
        assert holding == [], f"the password was written to {holding}"
