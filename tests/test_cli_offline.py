"""Tests of the command line, the client helpers and the cluster manager that need no real vbc node."""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import textwrap
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from vbc import cli, client
from vbc import cluster as cluster_mod
from vbc.cli import node as node_commands
from vbc.cli.arguments import json_params, parse_peers, storage_url
from vbc.cli.cluster import given_root_password
from vbc.cli.common import ADDR_ENV
from vbc.cli.data import result_json_lines
from vbc.cli.parser import build_parser
from vbc.render import render_status
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc

from .cluster_harness import LocalCluster, free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_env_address(monkeypatch):
    monkeypatch.delenv(ADDR_ENV, raising=False)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def dead_address() -> str:
    """An address where nothing listens."""
    return f"127.0.0.1:{free_port()}"


# ------------------------------------------------------------------ argument parsing


def test_parse_peers_accepts_the_documented_syntax():
    peers = parse_peers("n2=127.0.0.1:9044/127.0.0.1:9045, n3=host-3:9046/host-3:9047")
    assert peers == {"n2": ("127.0.0.1:9044", "127.0.0.1:9045"), "n3": ("host-3:9046", "host-3:9047")}
    assert parse_peers("") == {}


@pytest.mark.parametrize("text, words", [
    ("n2", "expected ID=GRPC_HOST:PORT/RAFT_HOST:PORT"),
    ("n2=127.0.0.1:1", "expected ID=GRPC_HOST:PORT/RAFT_HOST:PORT"),
    ("=127.0.0.1:1/127.0.0.1:2", "expected ID=GRPC_HOST:PORT/RAFT_HOST:PORT"),
    ("n2=127.0.0.1/127.0.0.1:2", "expected HOST:PORT"),
    ("n2=127.0.0.1:1/127.0.0.1:99999", "port in 1-65535"),
    ("n2=a:1/a:2,n2=b:1/b:2", "given twice"),
])
def test_parse_peers_rejects_bad_syntax_with_a_clear_message(text, words):
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        parse_peers(text)
    assert words in str(caught.value)


@pytest.fixture(autouse=True)
def raft_secret_in_the_environment(monkeypatch):
    """`vbc node start` needs a Raft secret; the tests that start one here are not about it."""
    monkeypatch.setenv("VBC_RAFT_PASSWORD", "a test's secret")


NODE_START = ["node", "start", "--id", "n1", "--data-dir", "/tmp/unused", "--grpc", "127.0.0.1:9042",
              "--raft", "127.0.0.1:9043", "--insecure"]


def test_node_start_with_bad_peers_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, *NODE_START, "--peers", "n2=nowhere")
    assert code == 2
    assert "argument --peers: bad peer 'n2=nowhere'" in err


def test_node_start_listing_itself_as_a_peer_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, *NODE_START, "--peers", "n1=127.0.0.1:1/127.0.0.1:2")
    assert code == 2 and "lists the node itself" in err


@pytest.mark.parametrize("flag, enabled", [([], False), (["--enable-injections"], True)])
def test_node_start_enables_fault_injection_only_with_the_flag(capsys, monkeypatch, tmp_path, flag, enabled):
    import node.wiring

    configs = []
    monkeypatch.setattr(node_commands, "die_with_parent", lambda: None)
    monkeypatch.setattr(node.wiring, "serve", configs.append)
    argv = ["node", "start", "--id", "n1", "--data-dir", str(tmp_path), "--grpc", "127.0.0.1:9042",
            "--raft", "127.0.0.1:9043", "--insecure", *flag]
    assert run_cli(capsys, *argv)[0] == 0
    assert [config.enable_injections for config in configs] == [enabled]


def test_node_start_takes_the_raft_secret_from_its_file_or_the_environment_and_has_no_default(
        capsys, monkeypatch, tmp_path):
    import node.wiring

    configs = []
    monkeypatch.setattr(node_commands, "die_with_parent", lambda: None)
    monkeypatch.setattr(node.wiring, "serve", configs.append)
    monkeypatch.delenv("VBC_RAFT_PASSWORD", raising=False)
    argv = ["node", "start", "--id", "n1", "--data-dir", str(tmp_path), "--grpc", "127.0.0.1:9042",
            "--raft", "127.0.0.1:9043", "--insecure"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and "no Raft secret" in err and configs == []
    secret = tmp_path / "raft.secret"
    secret.write_text("from the file\n")
    monkeypatch.setenv("VBC_RAFT_PASSWORD", "from the environment")
    assert run_cli(capsys, *argv, "--raft-secret-file", str(secret))[0] == 0
    assert run_cli(capsys, *argv)[0] == 0
    assert [config.raft_password for config in configs] == ["from the file", "from the environment"]


def test_a_secure_node_without_its_certificate_does_not_start_and_says_what_to_do(capsys, monkeypatch, tmp_path):
    import node.wiring

    configs = []
    monkeypatch.setattr(node_commands, "die_with_parent", lambda: None)
    monkeypatch.setattr(node.wiring, "serve", configs.append)
    code, _, err = run_cli(capsys, "node", "start", "--id", "n1", "--data-dir", str(tmp_path), "--grpc",
                           "127.0.0.1:9042", "--raft", "127.0.0.1:9043")
    assert code == 1 and configs == []
    assert "no node certificate in" in err and "vbc certs create-node" in err and "--insecure" in err


def test_cluster_up_writes_one_owner_only_raft_secret_that_every_node_command_names(tmp_path):
    cluster = cluster_mod.new_cluster(tmp_path, 3)
    secret = tmp_path / cluster_mod.RAFT_SECRET_NAME
    assert oct(secret.stat().st_mode & 0o777) == oct(0o600) and len(secret.read_text().strip()) == 64
    assert all(node["command"][node["command"].index("--raft-secret-file") + 1] == str(secret)
               for node in cluster["nodes"])
    first = secret.read_text()
    cluster_mod.new_cluster(tmp_path, 3)
    assert secret.read_text() == first, "a second cluster description keeps the secret"


@pytest.mark.parametrize("flag, prestart", [([], True), (["--spark-prestart"], True), (["--no-spark-prestart"], False)])
def test_node_start_prestarts_spark_unless_told_not_to(capsys, monkeypatch, tmp_path, flag, prestart):
    import node.wiring

    configs = []
    monkeypatch.setattr(node_commands, "die_with_parent", lambda: None)
    monkeypatch.setattr(node.wiring, "serve", configs.append)
    assert run_cli(capsys, *NODE_START[:4], "--data-dir", str(tmp_path), *NODE_START[6:], *flag)[0] == 0
    assert [config.spark_prestart for config in configs] == [prestart]


def test_node_start_resolves_its_paths_against_the_working_directory(capsys, monkeypatch, tmp_path):
    import node.wiring

    configs = []
    monkeypatch.setattr(node_commands, "die_with_parent", lambda: None)
    monkeypatch.setattr(node.wiring, "serve", configs.append)
    monkeypatch.chdir(tmp_path)
    argv = [*NODE_START[:4], "--data-dir", "rel/node", *NODE_START[6:], "--storage-url", "sqlite:///db/n1.db"]
    assert run_cli(capsys, *argv)[0] == 0
    (config,) = configs
    assert config.data_dir == tmp_path.resolve() / "rel" / "node" and config.data_dir.is_dir()
    assert config.storage_url == f"sqlite:///{tmp_path.resolve() / 'db' / 'n1.db'}"


@pytest.mark.parametrize("url, absolute", [
    ("sqlite:///data/{node}.db?timeout=5", "sqlite:///{cwd}/data/{node}.db?timeout=5"),
    ("sqlite:////abs/n1.db", "sqlite:////abs/n1.db"),
    ("sqlite://", "sqlite://"),
    ("sqlite:///:memory:", "sqlite:///:memory:"),
    ("postgresql+psycopg://u@h/vbc_{node}", "postgresql+psycopg://u@h/vbc_{node}"),
])
def test_a_relative_sqlite_storage_url_becomes_absolute(monkeypatch, tmp_path, url, absolute):
    monkeypatch.chdir(tmp_path)
    assert storage_url(url) == absolute.replace("{cwd}", str(tmp_path.resolve()))


def test_node_start_needs_its_addresses(capsys):
    code, _, err = run_cli(capsys, "node", "start", "--id", "n1", "--data-dir", "x")
    assert code == 2 and "--grpc" in err


def test_addr_and_cluster_are_mutually_exclusive(capsys):
    code, _, err = run_cli(capsys, "status", "--addr", "127.0.0.1:1", "--cluster", "somewhere")
    assert code == 2 and "not allowed with argument" in err


def test_a_client_command_without_target_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, "exec", "SELECT * FROM ks.t")
    assert code == 2 and "give --addr HOST:PORT or --cluster DIR" in err


def test_bad_addr_and_table_are_usage_errors(capsys):
    assert run_cli(capsys, "exec", "--addr", "nohost", "x")[0] == 2
    code, _, err = run_cli(capsys, "tablets", "--addr", "127.0.0.1:1", "just_a_table")
    assert code == 2 and "expected KS.TABLE" in err


def test_inject_argument_rules(capsys):
    assert run_cli(capsys, "inject", "--addr", "127.0.0.1:1", "point")[0] == 2  # no action
    assert run_cli(capsys, "inject", "--addr", "127.0.0.1:1", "point", "--enable", "--disable")[0] == 2
    code, _, err = run_cli(capsys, "inject", "--addr", "127.0.0.1:1", "--enable")
    assert code == 2 and "NAME" in err
    code, _, err = run_cli(capsys, "inject", "--addr", "127.0.0.1:1", "p", "--disable", "--one-shot")
    assert code == 2 and "go with --enable" in err
    assert run_cli(capsys, "inject", "--addr", "127.0.0.1:1", "p", "--enable", "--mode", "explode")[0] == 2


def test_help_exits_zero(capsys):
    assert run_cli(capsys, "--help")[0] == 0
    assert run_cli(capsys, "cluster", "up", "--help")[0] == 0


# ------------------------------------------------------------------ no node listening


def test_exec_against_nothing_fails_with_the_grpc_error(capsys):
    code, out, err = run_cli(capsys, "exec", "--addr", dead_address(), "--timeout", "5", "SELECT * FROM ks.t")
    assert code == 1 and out == ""
    assert err.startswith("error: UNAVAILABLE: ")


def test_vbc_addr_environment_variable_is_the_default_target(capsys, monkeypatch):
    monkeypatch.setenv(ADDR_ENV, dead_address())
    code, _, err = run_cli(capsys, "status")
    assert code == 1 and err.startswith("error: UNAVAILABLE: ")


@pytest.mark.integration
def test_python_dash_m_vbc_runs_the_command_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(ADDR_ENV, None)
    done = subprocess.run([sys.executable, "-m", "vbc", "exec", "--addr", dead_address(), "SELECT 1"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and done.stderr.startswith("error: UNAVAILABLE: ")
    done = subprocess.run([sys.executable, "-m", "vbc", "exec", "x"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2


# ------------------------------------------------------------------ cluster.json


def write_cluster_json(directory: Path, nodes: list[dict]) -> None:
    (directory / "cluster.json").write_text(json.dumps({"nodes": nodes}))


def test_cluster_json_gives_the_node_addresses(tmp_path):
    write_cluster_json(tmp_path, [{"id": "n1", "grpc": "127.0.0.1:1", "raft": "127.0.0.1:2", "pid": 1},
                                  {"id": "n2", "grpc": "127.0.0.1:3", "raft": "127.0.0.1:4", "pid": 2}])
    assert client.addresses_from_cluster(tmp_path) == ["127.0.0.1:1", "127.0.0.1:3"]
    assert client.node_address_from_cluster(tmp_path, "n2") == "127.0.0.1:3"
    assert client.node_address_from_cluster(tmp_path, "n9") is None


def test_missing_or_broken_cluster_json_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(client.ClusterFileError, match="not found"):
        client.addresses_from_cluster(tmp_path)
    (tmp_path / "cluster.json").write_text("{not json")
    with pytest.raises(client.ClusterFileError, match="not valid JSON"):
        client.addresses_from_cluster(tmp_path)
    write_cluster_json(tmp_path, [{"id": "n1"}])
    with pytest.raises(client.ClusterFileError, match="'grpc'"):
        client.addresses_from_cluster(tmp_path)
    code, _, err = run_cli(capsys, "exec", "--cluster", str(tmp_path / "nowhere"), "SELECT 1")
    assert code == 1 and err.startswith("error: ") and "cluster.json not found" in err


# ------------------------------------------------------------------ rendering helpers


def test_json_rendering_of_results():
    lines = result_json_lines(["id", "name", "score", "ok"], [[1, "a", 0.5, True], [2, None, None, False]], "")
    assert [json.loads(line) for line in lines] == [{"id": 1, "name": "a", "score": 0.5, "ok": True},
                                                    {"id": 2, "name": None, "score": None, "ok": False}]
    assert result_json_lines([], [], "created table ks.t") == ['{"message": "created table ks.t"}']
    assert result_json_lines(["id"], [], "") == []


def sample_status() -> pb.StatusResponse:
    return pb.StatusResponse(
        leader="n1", term=3, answered_by="n2", schema_version=7,
        nodes=[pb.NodeStatus(id="n1", grpc="127.0.0.1:1", raft="127.0.0.1:2", alive=True, shards=2, schema_version=7,
                             worker=pb.WorkerStats(spark_jobs=2, tablet_scans=3, rows_scanned=1500, tasks_finished=3,
                                                   tasks_answered_from_ledger=1, batches_running=1, spark_state="ready",
                                                   spark_start_s=9.5, read_s=0.25, spark_s=1.5, merge_s=0.75,
                                                   view_rows_repaired=4, throttled_s=2.5,
                                                   failures=[pb.BatchFailure(view_id="v1", error="UNAVAILABLE: boom",
                                                                             attempts=2)])),
               pb.NodeStatus(id="n2", grpc="127.0.0.1:3", raft="127.0.0.1:4", alive=False)],
        views=[pb.ViewStatus(name="ks.mv", base="ks.t", state="BUILDING", tasks_total=12, tasks_done=3, progress=0.25,
                             hosts={"n2": "SUCCESS", "n1": "STARTED"}, rows_done=1500, rows_per_s=500.0, eta_s=9.0,
                             errors=[pb.ViewBuildError(node="n1", error="UNAVAILABLE: boom", attempts=2)])],
    )


def test_status_dict_has_the_documented_shape():
    document = client.status_to_dict(sample_status())
    assert document["leader"] == "n1" and document["term"] == 3
    assert document["nodes"][0] == {"id": "n1", "grpc": "127.0.0.1:1", "raft": "127.0.0.1:2", "alive": True,
                                    "shards": 2, "schema_version": 7, "pending_view_updates": 0,
                                    "worker": {"spark_jobs": 2, "tablet_scans": 3, "rows_scanned": 1500,
                                               "tasks_finished": 3, "tasks_answered_from_ledger": 1,
                                               "batches_running": 1, "batches_failed": 0, "spark_state": "ready",
                                               "spark_error": "", "spark_start_s": 9.5, "read_s": 0.25,
                                               "spark_s": 1.5, "merge_s": 0.75,
                                               "failures": [{"view_id": "v1", "error": "UNAVAILABLE: boom",
                                                             "attempts": 2}], "view_rows_repaired": 4,
                                               "throttled_s": 2.5, "view_rows_kept": 0},
                                    "insecure": False}
    assert document["nodes"][1]["worker"] is None  # unreachable
    assert document["views"] == [{"name": "ks.mv", "base": "ks.t", "state": "BUILDING", "is_index": False,
                                  "tasks_total": 12, "tasks_done": 3, "progress": 0.25, "rows_done": 1500,
                                  "rows_per_s": 500.0, "eta_s": 9.0, "hosts": {"n1": "STARTED", "n2": "SUCCESS"},
                                  "errors": [{"node": "n1", "error": "UNAVAILABLE: boom", "attempts": 2}],
                                  "held": []}]
    json.dumps(document)


def test_tablet_dict_has_the_documented_shape():
    tablet = pb.TabletInfo(tablet=1, first_token=-5, last_token=9, replicas=["n1:0", "n2:1"])
    assert client.tablet_to_dict(tablet) == {"tablet": 1, "first_token": -5, "last_token": 9, "replicas": ["n1:0", "n2:1"]}
    tablet.stage, tablet.leaving, tablet.pending, tablet.migration_id = "streaming", "n1:0", "n3:0", "m1"
    assert client.tablet_to_dict(tablet)["reason"] is None
    tablet.stage, tablet.reason = "cleanup_target", "streaming to n3:0 failed: boom"
    assert client.tablet_to_dict(tablet) == {
        "tablet": 1, "first_token": -5, "last_token": 9, "replicas": ["n1:0", "n2:1"], "stage": "cleanup_target",
        "leaving": "n1:0", "pending": "n3:0", "migration_id": "m1", "reason": "streaming to n3:0 failed: boom"}


def test_status_rendering_names_nodes_and_views():
    from rich.console import Console

    console = Console(width=240, record=True, file=open(os.devnull, "w"))
    console.print(render_status(client.status_to_dict(sample_status())))
    text = console.export_text()
    assert "n1 (leader)" in text and "DOWN" in text and "ks.mv" in text and "25.0%" in text and "n2:SUCCESS" in text
    assert "1,500 rows, 500/s, ETA 9s" in text and "1 running, 3 tasks, 1,500 rows, 2 spark jobs" in text
    assert "(read 0.2s, spark 1.5s, merge 0.8s, throttled 2.5s)" in text and "ready 9.5s" in text
    assert "ks.mv: 2 batches failed in a row on n1: UNAVAILABLE: boom" in text


def test_status_rendering_says_which_node_a_view_waits_for():
    from rich.console import Console

    status = sample_status()
    status.views[0].held.add(holder="n1", target="n3")
    status.nodes[0].worker.view_rows_kept = 1200
    console = Console(width=240, record=True, file=open(os.devnull, "w"))
    console.print(render_status(client.status_to_dict(status)))
    text = console.export_text()
    assert "ks.mv: waits for node n3 to receive the view rows node n1 keeps for it" in text
    assert "1,200" in text and "view rows kept for unreachable replicas" in text


def test_status_rendering_shows_a_failed_spark_start():
    from rich.console import Console

    status = sample_status()
    status.nodes[0].worker.spark_state, status.nodes[0].worker.spark_error = "failed", "ValueError: no java"
    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(render_status(client.status_to_dict(status)))
    assert "n1: spark failed: ValueError: no java" in console.export_text()


def rolling_back_migration() -> pb.MigrationInfo:
    return pb.MigrationInfo(migration_id="m1", state="in_progress", stage="cleanup_target", table="ks.t", tablet=1,
                            leaving="n1:0", pending="n3:0", kind="move", reason="streaming to n3:0 failed: boom")


def test_status_shows_why_a_migration_rolls_back():
    from rich.console import Console

    status = sample_status()
    status.migrations.extend([rolling_back_migration(), pb.MigrationInfo(
        migration_id="m2", state="in_progress", stage="streaming", table="ks.t", tablet=2, leaving="n2:0",
        pending="n1:1", kind="move", rows_streamed=1200)])
    document = client.status_to_dict(status)
    assert [m["reason"] for m in document["migrations"]] == ["streaming to n3:0 failed: boom", None]
    json.dumps(document)
    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(render_status(document))
    lines = console.export_text().splitlines()
    assert any("reason" in line for line in lines)
    assert any("cleanup_target" in line and "streaming to n3:0 failed: boom" in line for line in lines)
    assert any("streaming" in line and "1,200" in line and "boom" not in line for line in lines)


def test_status_has_no_reason_column_while_no_migration_rolls_back():
    from vbc.render import status_migrations_table

    migration = client.migration_to_dict(rolling_back_migration())
    migration.update(stage="streaming", reason=None)
    assert [c.header for c in status_migrations_table([migration]).columns][-1] == "rows streamed"


def test_tablets_table_shows_why_a_move_rolls_back():
    from rich.console import Console

    from vbc.render import tablets_table

    tablets = [client.tablet_to_dict(pb.TabletInfo(tablet=0, first_token=-10, last_token=-1, replicas=["n1:0"],
                                                   stage="cleanup_target", leaving="n1:0", pending="n3:0",
                                                   migration_id="m1", reason="streaming to n3:0 failed: boom")),
               client.tablet_to_dict(pb.TabletInfo(tablet=1, first_token=0, last_token=10, replicas=["n2:0"],
                                                   stage="streaming", leaving="n2:0", pending="n1:1",
                                                   migration_id="m2"))]
    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(tablets_table("ks.t", tablets))
    text = console.export_text()
    assert "n1:0 -> n3:0 (cleanup_target: streaming to n3:0 failed: boom)" in text
    assert "n2:0 -> n1:1 (streaming)" in text


# ------------------------------------------------------------------ ports and layout


def test_free_ports_are_free_and_distinct():
    ports = cluster_mod.allocate_ports(6)
    assert ports == list(range(ports[0], ports[0] + 6))
    assert all(cluster_mod.port_is_free(port) for port in ports)
    assert cluster_mod.port_is_free(free_port())


def test_a_taken_base_port_fails_with_a_clear_message(tmp_path, capsys):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        assert not cluster_mod.port_is_free(taken)
        with pytest.raises(cluster_mod.ClusterError, match=f"port {taken} on 127.0.0.1 already in use"):
            cluster_mod.allocate_ports(4, base_port=taken - 1)
        code, _, err = run_cli(capsys, "cluster", "up", "--nodes", "2", "--data-dir", str(tmp_path),
                               "--base-port", str(taken - 1), "--detach")
    assert code == 1 and f"port {taken}" in err and "already in use" in err
    assert not (tmp_path / "cluster.json").exists()


def test_node_layout_and_command_follow_the_port_scheme(tmp_path):
    base = cluster_mod.find_free_block(12)
    description = cluster_mod.new_cluster(tmp_path, 3, shards=2, base_port=base)
    nodes = description["nodes"]
    assert [n["id"] for n in nodes] == ["n1", "n2", "n3"]
    for index, node in enumerate(nodes):
        assert node["grpc"] == f"127.0.0.1:{base + 2 * index}"
        assert node["raft"] == f"127.0.0.1:{base + 2 * index + 1}"
        assert node["client"] == f"127.0.0.1:{base + 6 + index}"
        assert node["cql"] == f"127.0.0.1:{base + 9 + index}"
        assert node["data_dir"] == str(tmp_path / node["id"])
    command = nodes[1]["command"]
    assert command[:5] == [sys.executable, "-m", "vbc", "node", "start"]
    args = build_parser().parse_args(command[3:])
    assert args.id == "n2" and args.shards == 2 and args.grpc == nodes[1]["grpc"] and args.cql == nodes[1]["cql"]
    assert args.peers == {"n1": (nodes[0]["grpc"], nodes[0]["raft"]), "n3": (nodes[2]["grpc"], nodes[2]["raft"])}
    assert args.enable_injections  # a local cluster is for development and tests


def test_a_local_cluster_without_injections_starts_its_nodes_without_the_flag(tmp_path):
    nodes = cluster_mod.new_cluster(tmp_path, 2, injections=False)["nodes"]
    assert all(not build_parser().parse_args(n["command"][3:]).enable_injections for n in nodes)
    command = nodes[0]["command"]
    assert cluster_mod.with_injections(command, True) == [*command, "--enable-injections"]
    assert cluster_mod.with_injections(cluster_mod.with_injections(command, True), False) == command
    assert build_parser().parse_args(["cluster", "up", "--nodes", "1", "--data-dir", "d"]).injections
    assert not build_parser().parse_args(["cluster", "up", "--nodes", "1", "--data-dir", "d",
                                              "--no-injections"]).injections


def test_the_spark_options_of_cluster_up_go_to_every_node_and_to_nodes_added_later(tmp_path):
    from vbc.cli.cluster import spark_options
    args = build_parser().parse_args(["cluster", "up", "--nodes", "2", "--data-dir", str(tmp_path),
                                      "--spark-master", "spark://10.0.0.9:7077", "--spark-driver-host", "10.0.0.5"])
    options = spark_options(args)
    assert options == ["--spark-master", "spark://10.0.0.9:7077", "--spark-driver-host", "10.0.0.5"]
    description = cluster_mod.new_cluster(tmp_path, 2, spark_options=options)
    started = [build_parser().parse_args(n["command"][3:]) for n in description["nodes"]]
    assert {(a.spark_master, a.spark_driver_host) for a in started} == {("spark://10.0.0.9:7077", "10.0.0.5")}
    assert description["spark_options"] == options  # cluster.json: `vbc cluster add-node` gives them too
    with pytest.raises(SystemExit):
        build_parser().parse_args(["node", "start", "--id", "n1", "--data-dir", "d", "--grpc", "h:1", "--raft",
                                   "h:2", "--spark-remote", "http://h:15002"])


def test_a_local_cluster_without_spark_prestart_records_the_flag_in_its_commands(tmp_path):
    nodes = cluster_mod.new_cluster(tmp_path, 2, spark_prestart=False)["nodes"]
    assert all(not build_parser().parse_args(n["command"][3:]).spark_prestart for n in nodes)
    assert all(build_parser().parse_args(n["command"][3:]).spark_prestart
               for n in cluster_mod.new_cluster(tmp_path, 2)["nodes"])
    assert not build_parser().parse_args(["cluster", "up", "--nodes", "1", "--data-dir", "d",
                                              "--no-spark-prestart"]).spark_prestart
    cluster_mod.save_cluster(tmp_path, cluster_mod.new_cluster(tmp_path, 2, spark_prestart=False))
    restarted = cluster_mod.reuse_cluster(tmp_path, 2, shards=1, base_port=None)
    assert all("--no-spark-prestart" not in n["command"] for n in restarted["nodes"])
    restarted = cluster_mod.reuse_cluster(tmp_path, 2, shards=1, base_port=None, spark_prestart=False)
    assert all(n["command"][-1] == "--no-spark-prestart" for n in restarted["nodes"])


def test_cluster_commands_resolve_a_relative_data_dir(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for argv in (["cluster", "up", "--nodes", "1"], ["cluster", "down"], ["cluster", "stop-node", "n1"],
                 ["cluster", "start-node", "n1"]):
        assert build_parser().parse_args([*argv, "--data-dir", "c"]).data_dir == tmp_path.resolve() / "c"


def test_a_restarted_local_cluster_takes_the_injections_choice_of_the_restart(tmp_path):
    cluster_mod.save_cluster(tmp_path, cluster_mod.new_cluster(tmp_path, 2, injections=False))
    restarted = cluster_mod.reuse_cluster(tmp_path, 2, shards=1, base_port=None, injections=True)
    assert all(n["command"][-1] == "--enable-injections" for n in restarted["nodes"])
    restarted = cluster_mod.reuse_cluster(tmp_path, 2, shards=1, base_port=None, injections=False)
    assert all("--enable-injections" not in n["command"] for n in restarted["nodes"])


# ------------------------------------------------------------------ a fake node over gRPC


class FakeClient(rpc.ClientServicer):
    def __init__(self, node_id: str):
        self.node_id = node_id

    def Execute(self, request, context):
        statement = request.statement.strip()
        if f"unavailable-on-{self.node_id}" in statement:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.node_id} is starting")
        if statement.startswith("SELECT"):
            return pb.ExecuteResponse(
                columns=[pb.Column(name="id", type="int"), pb.Column(name="name", type="text")],
                rows=[pb.Row(values=[pb.Value(int=1), pb.Value(text="[b]one[/b]")]),
                      pb.Row(values=[pb.Value(int=2), pb.Value(null=True)])])
        if statement.startswith("BAD"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "syntax error: unexpected 'BAD'")
        return pb.ExecuteResponse(message=f"done: {statement}")

    def ExecuteStream(self, request, context):
        yield self.Execute(request, context)


class FakeAdmin(rpc.AdminServicer):
    def __init__(self, node_id: str, nodes: list[tuple[str, str]]):
        self.node_id, self.nodes, self.enabled = node_id, nodes, {}

    def Status(self, request, context):
        response = sample_status()
        del response.nodes[:]
        response.answered_by = self.node_id
        response.nodes.extend(pb.NodeStatus(id=i, grpc=a, alive=True) for i, a in self.nodes)
        return response

    def Tablets(self, request, context):
        return pb.TabletsResponse(table=request.table, tablets=[
            pb.TabletInfo(tablet=0, first_token=-10, last_token=-1, replicas=["n1:0", "n2:1"]),
            pb.TabletInfo(tablet=1, first_token=0, last_token=10, replicas=["n2:0", "n1:1"])])

    def Inject(self, request, context):
        if request.action == pb.InjectRequest.ENABLE:
            self.enabled[request.name] = (request.mode, request.one_shot)
        hit = request.action == pb.InjectRequest.WAIT_HIT and request.name == "always.hit"
        points = [pb.InjectionPoint(name=n, enabled=True, mode=m, one_shot=o) for n, (m, o) in self.enabled.items()]
        return pb.InjectResponse(hit=hit, points=points, node=self.node_id)


@pytest.fixture
def fake_nodes():
    """Two in-process fake nodes (n1, n2) answering Client and Admin calls; yields their FakeAdmin and addresses."""
    servers, admins, addresses = [], [], []
    ports = [free_port(), free_port()]
    members = [("n1", f"127.0.0.1:{ports[0]}"), ("n2", f"127.0.0.1:{ports[1]}")]
    for node_id, address in members:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        admin = FakeAdmin(node_id, members)
        rpc.add_ClientServicer_to_server(FakeClient(node_id), server)
        rpc.add_AdminServicer_to_server(admin, server)
        assert server.add_insecure_port(address)
        server.start()
        servers.append(server)
        admins.append(admin)
        addresses.append(address)
    # a port freed by an earlier test may come back here: drop any channel or certificate this process kept for it
    client.use_credentials(None, addresses)
    client.close_all()
    yield admins, addresses
    for server in servers:
        server.stop(0)


def test_exec_prints_a_table_or_the_message(capsys, fake_nodes):
    _, (addr, _) = fake_nodes
    code, out, _ = run_cli(capsys, "exec", "--addr", addr, "SELECT * FROM ks.t")
    assert code == 0
    assert "id int" in out and "[b]one[/b]" in out and "null" in out and "(2 rows)" in out
    code, out, _ = run_cli(capsys, "exec", "--addr", addr, "INSERT INTO ks.t (id) VALUES (1)")
    assert code == 0 and out == "done: INSERT INTO ks.t (id) VALUES (1)\n"


def test_exec_json_and_statement_from_stdin(capsys, monkeypatch, fake_nodes):
    _, (addr, _) = fake_nodes
    code, out, _ = run_cli(capsys, "exec", "--addr", addr, "--json", "SELECT * FROM ks.t")
    assert code == 0
    assert [json.loads(line) for line in out.splitlines()] == [{"id": 1, "name": "[b]one[/b]"}, {"id": 2, "name": None}]
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO("CREATE TABLE ks.u (k int, PRIMARY KEY (k))\n"))
    code, out, _ = run_cli(capsys, "exec", "--addr", addr, "--json", "-")
    assert code == 0 and json.loads(out) == {"message": "done: CREATE TABLE ks.u (k int, PRIMARY KEY (k))"}


def test_exec_error_is_printed_as_code_and_details(capsys, fake_nodes):
    _, (addr, _) = fake_nodes
    code, out, err = run_cli(capsys, "exec", "--addr", addr, "BAD STATEMENT")
    assert code == 1 and out == ""
    assert err == "error: INVALID_ARGUMENT: syntax error: unexpected 'BAD'\n"


def test_cluster_option_skips_nodes_that_are_down(capsys, tmp_path, fake_nodes):
    _, (addr1, _) = fake_nodes
    write_cluster_json(tmp_path, [{"id": "n0", "grpc": dead_address()}, {"id": "n1", "grpc": addr1}])
    code, out, _ = run_cli(capsys, "exec", "--cluster", str(tmp_path), "--json", "SELECT * FROM ks.t")
    assert code == 0 and len(out.splitlines()) == 2
    assert client.execute(client.addresses_from_cluster(tmp_path), "SELECT 1")[0] == ["id", "name"]


def test_call_any_does_not_retry_other_errors(fake_nodes):
    _, (addr1, addr2) = fake_nodes
    tried = []

    def failing(addr):
        tried.append(addr)
        return client.execute(addr, "BAD")

    with pytest.raises(grpc.RpcError) as caught:
        client.call_any([addr1, addr2], failing)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and tried == [addr1]


def test_a_node_answering_unavailable_is_skipped_only_for_reads(fake_nodes):
    _, (addr1, addr2) = fake_nodes
    columns, rows, _ = client.execute([addr1, addr2], "SELECT * FROM ks.t -- unavailable-on-n1")
    assert columns == ["id", "name"] and len(rows) == 2
    with pytest.raises(grpc.RpcError) as caught:
        client.execute([addr1, addr2], "INSERT INTO ks.t (id) VALUES (1) -- unavailable-on-n1")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE and caught.value.details() == "n1 is starting"


def test_status_json_and_readable(capsys, fake_nodes):
    _, (addr, _) = fake_nodes
    code, out, _ = run_cli(capsys, "status", "--addr", addr, "--json")
    document = json.loads(out)
    assert code == 0 and document["leader"] == "n1" and [n["id"] for n in document["nodes"]] == ["n1", "n2"]
    assert document["views"][0]["hosts"] == {"n1": "STARTED", "n2": "SUCCESS"}
    code, out, _ = run_cli(capsys, "status", "--addr", addr)
    assert code == 0 and "n1 (leader)" in out and "ks.mv" in out


def test_tablets_json_one_object_per_line(capsys, fake_nodes):
    _, (addr, _) = fake_nodes
    code, out, err = run_cli(capsys, "tablets", "--addr", addr, "--json", "ks.t")
    assert code == 0, err
    assert [json.loads(line) for line in out.splitlines()] == [
        {"tablet": 0, "first_token": -10, "last_token": -1, "replicas": ["n1:0", "n2:1"]},
        {"tablet": 1, "first_token": 0, "last_token": 10, "replicas": ["n2:0", "n1:1"]}]
    code, out, _ = run_cli(capsys, "tablets", "--addr", addr, "ks.t")
    assert code == 0 and "n2:0, n1:1" in out


def test_inject_on_another_node_found_through_status(capsys, fake_nodes):
    (admin1, admin2), (addr1, _) = fake_nodes
    code, out, _ = run_cli(capsys, "inject", "--addr", addr1, "--node", "n2", "p.one", "--enable", "--mode", "pause",
                           "--one-shot")
    assert code == 0 and "enabled on n2" in out
    assert admin2.enabled == {"p.one": ("pause", True)} and admin1.enabled == {}
    code, out, _ = run_cli(capsys, "inject", "--addr", addr1, "--node", "n2", "--list", "--json")
    assert code == 0 and json.loads(out)["points"][0]["name"] == "p.one"
    code, _, err = run_cli(capsys, "inject", "--addr", addr1, "--node", "n7", "p", "--disable")
    assert code == 1 and "n7" in err


def test_inject_wait_hit_exit_status(capsys, fake_nodes):
    _, (addr1, _) = fake_nodes
    assert run_cli(capsys, "inject", "--addr", addr1, "always.hit", "--wait-hit", "1")[0] == 0
    code, _, err = run_cli(capsys, "inject", "--addr", addr1, "never.hit", "--wait-hit", "1")
    assert code == 1 and "not hit within 1 s" in err


# ------------------------------------------------------------------ the cluster manager with fake node processes

FAKE_NODE = textwrap.dedent('''
    """A stand-in for `vbc node start`: serves Admin.Status/Internode.LocalStatus until SIGTERM."""
    import argparse, signal, sys, threading, time
    from concurrent import futures
    import grpc
    from vbcpb import vbc_pb2 as pb, vbc_pb2_grpc as rpc

    parser = argparse.ArgumentParser()
    parser.add_argument("--behaviour", default="serve")
    parser.add_argument("words", nargs="*")
    for option in ("--id", "--data-dir", "--grpc", "--raft", "--client-addr", "--cql", "--peers", "--shards", "--storage-url",
                   "--raft-secret-file"):
        parser.add_argument(option)
    parser.add_argument("--enable-injections", action="store_true")
    parser.add_argument("--insecure", action="store_true")
    args = parser.parse_args()
    if args.behaviour == "exit":
        print("fake node: cannot start", flush=True)
        sys.exit(3)
    if args.behaviour == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop = threading.Event()
    if args.behaviour != "ignore-term":
        signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def wait_for_term():  # in slices: SIGTERM delivered to a gRPC thread would not wake a wait without timeout
        while not stop.wait(0.2):
            pass

    if args.behaviour == "silent":
        wait_for_term()
        sys.exit(0)

    class Admin(rpc.AdminServicer):
        def Status(self, request, context):
            return pb.StatusResponse(leader="n1", term=1, answered_by=args.id)

    class Internode(rpc.InternodeServicer):
        def LocalStatus(self, request, context):
            return pb.LocalStatusResponse(node_id=args.id, leader="n1")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rpc.add_AdminServicer_to_server(Admin(), server)
    rpc.add_InternodeServicer_to_server(Internode(), server)
    server.add_insecure_port(args.grpc)
    server.start()
    print("fake node", args.id, "serving", args.grpc, "peers", args.peers, flush=True)
    wait_for_term()
    server.stop(0)
''')


@pytest.fixture
def fake_launcher(tmp_path):
    script = tmp_path / "fake_node.py"
    script.write_text(FAKE_NODE)
    return lambda behaviour="serve": [sys.executable, str(script), "--behaviour", behaviour]


def all_exited(pids) -> bool:
    return not any(cluster_mod.pid_alive(pid) for pid in pids)


@pytest.mark.integration
def test_cluster_up_stop_start_and_down(tmp_path, fake_launcher, capsys):
    data_dir = tmp_path / "c"
    description = cluster_mod.start_cluster(data_dir, nodes=3, shards=2, launcher=fake_launcher(), timeout=30, insecure=True)
    pids = [n["pid"] for n in description["nodes"]]
    try:
        assert description["leader"] == "n1"
        recorded = json.loads((data_dir / "cluster.json").read_text())
        assert [(n["id"], n["pid"]) for n in recorded["nodes"]] == [("n1", pids[0]), ("n2", pids[1]), ("n3", pids[2])]
        assert recorded["shards"] == 2 and all(Path(n["data_dir"]).is_dir() for n in recorded["nodes"])
        assert "fake node n2 serving" in (data_dir / "n2" / "node.log").read_text()

        assert cluster_mod.stop_node(data_dir, "n2") == "stopped" and not cluster_mod.pid_alive(pids[1])
        assert cluster_mod.stop_node(data_dir, "n2") == "not running"
        code, out, _ = run_cli(capsys, "cluster", "start-node", "--data-dir", str(data_dir), "n2")
        assert code == 0 and "n2: started" in out
        restarted = cluster_mod.load_cluster(data_dir)["nodes"][1]
        pids.append(restarted["pid"])
        assert restarted["pid"] != pids[1] and restarted["grpc"] == recorded["nodes"][1]["grpc"]
        assert run_cli(capsys, "cluster", "start-node", "--data-dir", str(data_dir), "n2")[0] == 1  # already running

        assert cluster_mod.stop_node(data_dir, "n3", kill=True) == "killed"
        code, out, _ = run_cli(capsys, "cluster", "down", "--data-dir", str(data_dir))
        assert code == 0 and "n1: stopped" in out and "n3: not running" in out
        assert all_exited(pids)
        assert all(n["pid"] is None for n in cluster_mod.load_cluster(data_dir)["nodes"])
    finally:
        cluster_mod.stop_pids(pids, kill=True)


@pytest.mark.integration
def test_cluster_restarts_from_its_recorded_description(tmp_path, fake_launcher):
    data_dir = tmp_path / "c"
    first = cluster_mod.start_cluster(data_dir, nodes=2, launcher=fake_launcher(), timeout=30, insecure=True)
    pids = [n["pid"] for n in first["nodes"]]
    try:
        with pytest.raises(cluster_mod.ClusterError, match="already running"):
            cluster_mod.start_cluster(data_dir, nodes=2, timeout=30, insecure=True)
        cluster_mod.stop_cluster(data_dir)
        with pytest.raises(cluster_mod.ClusterError, match="holds a cluster of 2 nodes"):
            cluster_mod.start_cluster(data_dir, nodes=3, timeout=30, insecure=True)
        again = cluster_mod.start_cluster(data_dir, nodes=2, timeout=30, insecure=True)
        pids += [n["pid"] for n in again["nodes"]]
        assert [n["grpc"] for n in again["nodes"]] == [n["grpc"] for n in first["nodes"]]
        assert again["nodes"][0]["command"] == first["nodes"][0]["command"]
    finally:
        cluster_mod.stop_pids(pids, kill=True)
    assert all_exited(pids)


@pytest.mark.integration
def test_a_node_that_exits_fails_the_start_with_its_log(tmp_path, fake_launcher):
    with pytest.raises(cluster_mod.ClusterStartError) as caught:
        cluster_mod.start_cluster(tmp_path / "c", nodes=2, launcher=fake_launcher("exit"), timeout=30, insecure=True)
    report = caught.value.report()
    assert "exited" in report and "exit code 3" in report and "fake node: cannot start" in report
    assert all(n["pid"] is None for n in cluster_mod.load_cluster(tmp_path / "c")["nodes"])


@pytest.mark.integration
def test_a_silent_node_times_out_and_everything_is_stopped(tmp_path, fake_launcher):
    spawned = []

    def spawn(node, die_with_parent):
        spawned.append(cluster_mod.spawn_node(node, die_with_parent))
        return spawned[-1]

    with pytest.raises(cluster_mod.ClusterStartError) as caught:
        cluster_mod.start_cluster(tmp_path / "c", nodes=2, launcher=fake_launcher("silent"), timeout=2, spawn=spawn, insecure=True)
    assert "did not come up within 2 s" in str(caught.value)
    assert "not answering" in caught.value.report()
    assert len(spawned) == 2 and all_exited(spawned)


@pytest.mark.integration
def test_stop_escalates_to_sigkill(tmp_path, fake_launcher):
    data_dir = tmp_path / "c"
    description = cluster_mod.start_cluster(data_dir, nodes=1, launcher=fake_launcher("ignore-term"), timeout=30, insecure=True)
    pid = description["nodes"][0]["pid"]
    try:
        assert cluster_mod.stop_node(data_dir, "n1", timeout=1) == "killed"
        assert not cluster_mod.pid_alive(pid)
    finally:
        cluster_mod.stop_pids([pid], kill=True)


def test_stale_pids_in_cluster_json_are_not_signalled(tmp_path):
    write_cluster_json(tmp_path, [{"id": "n1", "grpc": "127.0.0.1:1", "raft": "127.0.0.1:2", "pid": os.getpid(),
                                   "data_dir": str(tmp_path / "n1"), "log": str(tmp_path / "n1" / "node.log")}])
    assert cluster_mod.running_pid(cluster_mod.load_cluster(tmp_path)["nodes"][0]) is None
    assert cluster_mod.stop_cluster(tmp_path) == {"n1": "not running"}


@pytest.mark.integration
def test_harness_stops_every_process_it_started_even_on_failure(tmp_path, fake_launcher):
    with pytest.raises(RuntimeError, match="test failed"):
        with LocalCluster(2, tmp_path / "h", launcher=fake_launcher()) as local:
            assert local.wait_until(lambda: local.status()["leader"], timeout=10) == "n1"
            local.stop_node("n2", kill=True)
            local.start_node("n2")
            assert len(local.pids) == 3 and local.is_running("n2")
            raise RuntimeError("test failed")
    assert all_exited(local.pids)


def test_harness_wait_until_reports_the_message_and_last_error(tmp_path):
    local = LocalCluster(1, tmp_path)

    def failing():
        raise ValueError("boom")

    with pytest.raises(AssertionError, match="waiting for the impossible; last error: ValueError: boom"):
        local.wait_until(failing, timeout=0.3, message="the impossible")
    assert local.wait_until(lambda: 42, timeout=1) == 42


def test_params_must_be_64_bit_integers():
    import argparse

    assert json_params('[[1, "a", null, 2.5]]') == [[1, "a", None, 2.5]]
    with pytest.raises(argparse.ArgumentTypeError, match="64 bits"):
        json_params("[[99999999999999999999]]")


def test_a_given_root_password_is_read_from_the_first_line_of_its_file(tmp_path, capsys):
    up = ["cluster", "up", "--nodes", "1", "--data-dir", str(tmp_path / "c"), "--root-password-file"]
    code, _, err = run_cli(capsys, *up, str(tmp_path / "missing"))
    assert code == 2 and "cannot read --root-password-file" in err
    empty = tmp_path / "empty"
    empty.write_text("\n")
    code, _, err = run_cli(capsys, *up, str(empty))
    assert code == 2 and "holds no password on its first line" in err
    given = tmp_path / "given"
    given.write_text("s3cret\n")
    code, _, err = run_cli(capsys, *up, str(given), "--insecure")
    assert code == 2 and "needs a secure cluster" in err
    assert not (tmp_path / "c").exists()  # refused before anything was made
    args = build_parser().parse_args([*up, str(given)])
    assert given_root_password(args) == "s3cret"


@pytest.mark.integration
def test_a_command_starts_without_the_data_plane_libraries():
    """A command's start-up imports neither SQLAlchemy nor Arrow nor the storage layer (each `vbc` run paid
    about 0.5 s for them); `vbc load` and SELECTs import Arrow when they need it."""
    probe = ("import sys, vbc.cli, vbc.client, vbc.cluster; "
             "print(sorted(m for m in ('sqlalchemy', 'pyarrow', 'storage.reads', 'pyspark') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_restarted_node_joins_through_the_members_of_now_not_those_it_first_joined_through():
    from vbc.cluster import joining_current_members
    node = {"id": "n4", "grpc": "h:4", "command": ["vbc", "node", "start", "--id", "n4", "--join", "h:1,h:2", "--x"]}
    cluster = {"nodes": [{"id": "n3", "grpc": "h:3"}, node, {"id": "n5", "grpc": "h:5"}]}
    assert joining_current_members(node, cluster) == ["vbc", "node", "start", "--id", "n4", "--join", "h:3,h:5", "--x"]
    plain = {"id": "n1", "grpc": "h:1", "command": ["vbc", "node", "start", "--peers", "x"]}
    assert joining_current_members(plain, cluster) == plain["command"]
