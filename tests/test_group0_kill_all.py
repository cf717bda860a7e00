"""Every member of group0 SIGKILLed at once, three times, under a stream of DDL and role changes (real processes,
TLS): after each restart every acknowledged statement is there, and every node holds the same group0 state (the
digest of every replicated field, at the same applied index)."""
from __future__ import annotations

import os
import signal
import threading

import grpc
import pytest

from vbc import client
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc

from .cluster_harness import LocalCluster, wait_until

pytestmark = pytest.mark.integration

ROUNDS = 3
STATEMENTS_BEFORE_KILL = 6  # acknowledged statements of a round before the members are killed
RESTART_TIMEOUT = 120.0
KEYSPACE = "killed"


class DdlStream:
    """Tables and roles created from a thread of its own until stopped; the names of the acknowledged ones."""

    def __init__(self, cluster: LocalCluster, tag: str):
        self._cluster = cluster
        self._tag = tag
        self._stop = threading.Event()
        self.tables: list[str] = []
        self.roles: list[str] = []
        self._thread = threading.Thread(target=self._run, name=f"ddl-{tag}", daemon=True)

    def __enter__(self) -> DdlStream:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def acknowledged(self) -> int:
        return len(self.tables) + len(self.roles)

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            name = f"{self._tag}_{number}"
            self._try(f"CREATE TABLE {KEYSPACE}.t_{name} (k int PRIMARY KEY, v text)", self.tables,
                      f"{KEYSPACE}.t_{name}")
            self._try(f"CREATE ROLE role_{name} WITH PASSWORD = 'pw-{name}-long-enough' AND LOGIN = true",
                      self.roles, f"role_{name}")

    def _try(self, statement: str, acknowledged: list[str], name: str) -> None:
        try:
            self._cluster.execute(statement, timeout=10)
        except Exception:  # noqa: BLE001 - the members are being killed: the outcome is unknown, not checked
            return
        acknowledged.append(name)


def kill_every_member(cluster: LocalCluster) -> None:
    """SIGKILL every node's process group at once, then wait for each to be gone."""
    pids = [node["pid"] for node in cluster.nodes]
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for node in cluster.nodes:
        cluster.stop_node(node["id"], kill=True)


def digests(cluster: LocalCluster) -> dict[str, tuple[int, str]]:
    """(applied index, group0 state digest) of every node, asked with node n1's certificate (LocalStatus is for the
    cluster's nodes)."""
    answers = {}
    credentials = client.credentials_from(cluster.data_dir / "n1")
    for node in cluster.nodes:
        with grpc.secure_channel(node["grpc"], credentials) as channel:
            status = rpc.InternodeStub(channel).LocalStatus(pb.LocalStatusRequest(state_digest=True), timeout=10)
        answers[node["id"]] = (status.digest_applied_index, status.state_digest)
    return answers


def same_state_everywhere(cluster: LocalCluster) -> dict | None:
    answers = digests(cluster)
    return answers if len(set(answers.values())) == 1 else None


def test_every_member_killed_at_once_loses_no_acknowledged_statement(tmp_path):
    with LocalCluster(3, tmp_path / "cluster", secure=True, spark_prestart=False) as cluster:
        cluster.execute(f"CREATE KEYSPACE {KEYSPACE} WITH replication = {{'rf': 3}} AND tablets = {{'initial': 1}}")
        tables: list[str] = []
        roles: list[str] = []
        for round_number in range(ROUNDS):
            with DdlStream(cluster, f"r{round_number}") as stream:
                wait_until(lambda: stream.acknowledged() >= STATEMENTS_BEFORE_KILL, RESTART_TIMEOUT,
                           f"{STATEMENTS_BEFORE_KILL} acknowledged statements")
                kill_every_member(cluster)
            tables += stream.tables
            roles += stream.roles
            for node in cluster.nodes:
                cluster.start_node(node["id"], timeout=RESTART_TIMEOUT)
            cluster.wait_for_leader(timeout=RESTART_TIMEOUT)
            state = wait_until(lambda: same_state_everywhere(cluster), RESTART_TIMEOUT,
                               "every node at the same applied index with the same group0 state")
            listed = {row["role"] for row in cluster.query("LIST ROLES")}
            assert set(roles) <= listed, f"round {round_number}: acknowledged roles lost: {set(roles) - listed}"
            for table in tables:
                assert client.tablets(cluster.addresses(), table), f"round {round_number}: {table} lost"
            assert len(set(state.values())) == 1
