"""A view built through a standalone Spark cluster, and through Spark Connect, both started from the pip `pyspark`
distribution on 127.0.0.1: a master and a worker (`bin/spark-class ... Master` / `... Worker`) for a node given
`--spark-master spark://HOST:PORT` (its driver advertising the node's host), and a Connect server
(`sbin/start-connect-server.sh`) for a node given `--spark-remote sc://HOST:PORT` (which starts no JVM)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pyspark
import pytest

from vbc import client
from vbc.cluster import allocate_ports

from .cluster_harness import LocalCluster, wait_until

pytestmark = pytest.mark.integration

SPARK_HOME = Path(pyspark.__file__).parent
ROWS = 3_000
START_TIMEOUT = 180.0


def spark_class(main_class: str, *args: str, log: Path) -> subprocess.Popen:
    environment = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
                   "SPARK_NO_DAEMONIZE": "1"}
    with open(log, "wb") as output:
        return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), main_class, *args], env=environment,
                                stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM the process group (the JVM and anything it started), SIGKILL it if it lingers."""
    for signum, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 20)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def alive_workers(ui_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as answer:
        return int(json.load(answer).get("aliveworkers", 0))


@contextmanager
def standalone_spark(directory: Path):
    """A Spark master and one worker (1 core, 1 GiB) on 127.0.0.1; yields the master's URL and its UI port."""
    port, ui_port, worker_ui_port = allocate_ports(3)
    processes = [spark_class("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                             "--webui-port", str(ui_port), log=directory / "master.log")]
    try:
        processes.append(spark_class("org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                                     "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                                     "--webui-port", str(worker_ui_port), "--work-dir", str(directory / "work"),
                                     log=directory / "worker.log"))
        wait_until(lambda: alive_workers(ui_port) == 1, START_TIMEOUT, "the Spark worker to register")
        yield f"spark://127.0.0.1:{port}", ui_port
    finally:
        for process in reversed(processes):
            stop(process)


@contextmanager
def connect_server(directory: Path):
    """A Spark Connect server (local[1]) on 127.0.0.1 in the foreground; yields its sc:// URL."""
    (port,) = allocate_ports(1)
    environment = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
                   "SPARK_NO_DAEMONIZE": "1", "SPARK_LOG_DIR": str(directory / "logs"),
                   "SPARK_PID_DIR": str(directory)}
    with open(directory / "connect.log", "wb") as output:
        process = subprocess.Popen([str(SPARK_HOME / "sbin" / "start-connect-server.sh"), "--master", "local[1]",
                                    "--driver-memory", "1g", "--conf", "spark.ui.enabled=false",
                                    "--conf", f"spark.connect.grpc.binding.port={port}",
                                    "--conf", "spark.connect.grpc.binding.address=127.0.0.1"],
                                   env=environment, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: listening(port), START_TIMEOUT, "the Spark Connect server to listen")
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop(process)


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def build_a_view(cluster: LocalCluster) -> None:
    addresses = cluster.addresses()
    client.execute(addresses, "CREATE KEYSPACE sc WITH replication = {'rf': 1} AND tablets = {'initial': 2}")
    client.execute(addresses, "CREATE TABLE sc.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    client.execute(addresses, "INSERT INTO sc.tab (key, c, v) VALUES (?, ?, ?)",
                   params=[[i // 10, i % 10, str(i)] for i in range(ROWS)])
    client.execute(addresses, "CREATE MATERIALIZED VIEW sc.mv AS SELECT * FROM sc.tab WHERE c IS NOT NULL "
                              "AND key IS NOT NULL AND v IS NOT NULL PRIMARY KEY (c, key)")
    client.wait_built(addresses, "sc.mv", START_TIMEOUT)
    check = client.check(addresses, "sc.mv")
    assert check["consistent"] and check["view_rows"] == ROWS, check


def test_a_view_is_built_through_spark_connect_without_a_jvm_in_the_node(tmp_path):
    with connect_server(tmp_path) as remote, \
            LocalCluster(1, tmp_path / "cluster", spark_options=["--spark-remote", remote],
                         spark_prestart=False) as cluster:
        build_a_view(cluster)
        assert f"spark connect session to {remote} started" in cluster.log("n1")
        node = cluster.node("n1")["pid"]
        children = Path(f"/proc/{node}/task/{node}/children").read_text().split()
        assert not [pid for pid in children if "java" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()]


def test_a_view_is_built_through_a_standalone_spark_cluster(tmp_path):
    with standalone_spark(tmp_path) as (master, ui_port), \
            LocalCluster(1, tmp_path / "cluster", spark_options=["--spark-master", master, "--spark-memory", "512m"],
                         spark_prestart=False) as cluster:
        build_a_view(cluster)
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as answer:
            applications = json.load(answer)["activeapps"]
        assert [app["name"] for app in applications] == ["vbc-view-builder"]  # the node's driver, on the cluster
        assert f"--spark-master {master}" in " ".join(cluster.node("n1")["command"])
