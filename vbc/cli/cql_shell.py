"""`vbc cql`: cqlsh (from pip) connected to a local cluster's node over CQL's native protocol, TLS and password."""
from __future__ import annotations

import argparse
import configparser
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from vbc import client
from vbc import cluster as cluster_mod
from vbc.cli.arguments import add_command
from vbc.cli.common import UsageError


def add_cql_parser(commands) -> None:
    cql = add_command(commands, "cql", cmd_cql,
                      help="cqlsh on a local cluster's node: its CQL port, TLS checked with the cluster's CA, logged in "
                           "as root (or --user); the rest of the line goes to cqlsh (-e 'STATEMENT', -k KEYSPACE, ...)")
    cql.add_argument("--cluster", required=True, metavar="DIR", help="data dir of a local cluster (DIR/cluster.json)")
    cql.add_argument("--node", metavar="ID", help="the node to connect to (default: the first running one)")
    cql.add_argument("--user", default=client.DEFAULT_USER, metavar="NAME",
                     help="the role to log in as (root's password is read from DIR/credentials; another role's from "
                          "$VBC_PASSWORD, else cqlsh asks)")
    cql.add_argument("--print", action="store_true", dest="print_only",
                     help="print the cqlsh command line that connects, instead of running it")
    cql.add_argument("cqlsh_args", nargs=argparse.REMAINDER, metavar="...", help="arguments for cqlsh")


def cmd_cql(args: argparse.Namespace) -> int:
    data_dir = Path(args.cluster).resolve()
    node = _node(cluster_mod.load_cluster(data_dir), args.node)
    host, _, port = node["cql"].rpartition(":")
    ca = data_dir / client.CREDENTIALS_DIR / "ca.crt"
    if args.print_only:
        print(f"SSL_CERTFILE={ca} cqlsh {host} {port} --ssl -u {args.user}")
        return 0
    with tempfile.TemporaryDirectory(prefix="vbc-cqlsh-") as folder:
        command = [_cqlsh(), host, port, "--ssl", "--cqlshrc", _write_cqlshrc(Path(folder), ca)]
        password = _password(data_dir, args.user)
        if password is None:
            command += ["-u", args.user]  # cqlsh asks for the password
        else:
            command += ["--credentials", _write_credentials(Path(folder), args.user, password)]
        extra = args.cqlsh_args[1:] if args.cqlsh_args[:1] == ["--"] else args.cqlsh_args
        return subprocess.call([*command, *extra], env={**os.environ, "SSL_CERTFILE": str(ca)})


def _node(cluster: dict, node_id: str | None) -> dict:
    nodes = [n for n in cluster["nodes"] if n.get("cql")]
    if not nodes:
        raise UsageError("this cluster's nodes serve no CQL port (made before there was one): start a new cluster")
    if node_id is not None:
        chosen = [n for n in nodes if n["id"] == node_id]
        if not chosen:
            raise UsageError(f"no node {node_id} with a CQL port; the nodes: {', '.join(n['id'] for n in nodes)}")
        return chosen[0]
    return next((n for n in nodes if cluster_mod.running_pid(n)), nodes[0])


def _cqlsh() -> str:
    beside = Path(sys.executable).with_name("cqlsh")
    found = str(beside) if beside.exists() else shutil.which("cqlsh")
    if found is None:
        raise UsageError("cqlsh is not installed: pip install cqlsh==6.2.2")
    return found


def _password(data_dir: Path, user: str) -> str | None:
    if user == client.DEFAULT_USER:
        path = data_dir / client.CREDENTIALS_DIR / cluster_mod.ROOT_PASSWORD_NAME
        return path.read_text().strip() if path.exists() else None
    return os.environ.get(client.PASSWORD_ENV)


def _write_cqlshrc(folder: Path, ca: Path) -> str:
    config = configparser.ConfigParser(interpolation=None)
    config["auth_provider"] = {"module": "cassandra.auth", "classname": "PlainTextAuthProvider"}
    config["ssl"] = {"certfile": str(ca), "validate": "true"}
    return _private(folder / "cqlshrc", config)


def _write_credentials(folder: Path, user: str, password: str) -> str:
    config = configparser.ConfigParser(interpolation=None)
    config["PlainTextAuthProvider"] = {"username": user, "password": password}
    return _private(folder / "credentials", config)


def _private(path: Path, config: configparser.ConfigParser) -> str:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        config.write(out)
    return str(path)
