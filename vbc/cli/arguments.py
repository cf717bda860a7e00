"""The argparse types of the `vbc` options and the --addr/--cluster/--credentials/--user options of client commands."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def host_port(text: str) -> str:
    """argparse type for HOST:PORT."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port in 1-65535, got {text!r}")
    return text


def json_params(text: str) -> list[list]:
    """argparse type for --params: a JSON list of lists of scalars."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"--params is not valid JSON: {error}") from None
    if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
        raise argparse.ArgumentTypeError("--params must be a JSON list of lists, one list of values per execution")
    if any(isinstance(v, (list, dict)) for row in value for v in row):
        raise argparse.ArgumentTypeError("--params values must be numbers, strings, booleans or null")
    if any(type(v) is int and not -(2**63) <= v < 2**63 for row in value for v in row):
        raise argparse.ArgumentTypeError("--params integers must fit in 64 bits")
    return value


def positive_int(text: str) -> int:
    return positive_number(text, int, "a positive integer", "a positive integer")


def positive_float(text: str) -> float:
    return positive_number(text, float, "a number of seconds", "a positive number of seconds")


def positive_number(text: str, convert, not_a_number: str, not_positive: str):
    """`convert(text)` if it is above 0 (NaN is not); else argparse's error `expected ..., got 'text'`."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {not_a_number}, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected {not_positive}, got {text!r}")
    return value


def parse_peers(text: str) -> dict[str, tuple[str, str]]:
    """--peers ID=GRPC/RAFT,... -> {id: (grpc, raft)}; an empty string means no peers."""
    peers: dict[str, tuple[str, str]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        node_id, eq, addresses = item.partition("=")
        grpc_addr, slash, raft_addr = addresses.partition("/")
        if not eq or not slash or not node_id.strip():
            raise argparse.ArgumentTypeError(
                f"bad peer {item!r}: expected ID=GRPC_HOST:PORT/RAFT_HOST:PORT, e.g. n2=127.0.0.1:9044/127.0.0.1:9045"
            )
        node_id = node_id.strip()
        try:
            peer = (host_port(grpc_addr.strip()), host_port(raft_addr.strip()))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"bad peer {item!r}: {exc}") from None
        if node_id in peers:
            raise argparse.ArgumentTypeError(f"peer {node_id!r} is given twice")
        peers[node_id] = peer
    return peers


def absolute_path(text: str) -> Path:
    """argparse type for a directory or file: made absolute now, so it means the same from any working directory."""
    return Path(text).expanduser().resolve()


def storage_url(text: str) -> str:
    """argparse type for --storage-url: a SQLite database file given by a relative path is made absolute."""
    scheme, sep, rest = text.partition(":///")
    if not sep or scheme.split("+")[0] != "sqlite" or not rest or rest.startswith(("/", ":memory:", "file:")):
        return text
    path, query_sep, query = rest.partition("?")
    return f"{scheme}:///{absolute_path(path)}{query_sep}{query}"


def table_name(text: str) -> str:
    keyspace, dot, name = text.partition(".")
    if not dot or not keyspace or not name:
        raise argparse.ArgumentTypeError(f"expected KS.TABLE, got {text!r}")
    return text


def add_command(commands, name: str, handler, **options) -> argparse.ArgumentParser:
    """The subcommand `name` (add_parser `options`), run by `handler(args)`; args.parser is it, for usage errors."""
    command = commands.add_parser(name, **options)
    command.set_defaults(handler=handler, parser=command)
    return command


def add_command_group(commands, name: str, help_text: str, metavar: str = "COMMAND"):
    """The command `name` whose subcommands are added to what this returns (args.NAME_command is the one given)."""
    group = commands.add_parser(name, help=help_text)
    return group.add_subparsers(dest=f"{name}_command", metavar=metavar, required=True)


def target_options() -> argparse.ArgumentParser:
    """The --addr / --cluster options shared by every client command."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_mutually_exclusive_group()
    group.add_argument("--addr", type=host_port, metavar="HOST:PORT", help="gRPC address of any node")
    group.add_argument("--cluster", metavar="DIR", help="data dir of a local cluster (any live node of DIR/cluster.json)")
    parent.add_argument("--credentials", type=absolute_path, metavar="DIR",
                        help="certificates to connect with: ca.crt and client.USER.crt/.key (default: DIR/credentials "
                             "with --cluster, else $VBC_CREDENTIALS, else plaintext)")
    parent.add_argument("--user", metavar="NAME",
                        help="log in as this role by password ($VBC_PASSWORD, else asked on the terminal), through "
                             "the nodes' client ports; ca.crt of --credentials or DIR/credentials verifies the nodes")
    return parent


def spark_connect_url(text: str) -> str:
    """A Spark Connect server's URL: sc://HOST:PORT (with optional /;parameters)."""
    if not text.startswith("sc://") or not text[len("sc://"):].split("/")[0]:
        raise argparse.ArgumentTypeError(f"expected a Spark Connect URL sc://HOST:PORT, got {text!r}")
    return text
