"""Connection helpers: gRPC channels to vbc nodes, fail-over across addresses, and Python-shaped results."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, TypeVar

import grpc

from common.stream_pool import StatusError, StreamPool, StreamPools, start_exchange
from common.values import values_from_proto, values_to_proto
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as pb_grpc

T = TypeVar("T")

CLUSTER_FILE = "cluster.json"
DEFAULT_TIMEOUT = 30.0
PROBE_TIMEOUT = 0.5

# Reconnect quickly to a node that was down (tests stop and restart nodes), accept large SELECTs. Not
# "grpc.min_reconnect_backoff_ms": gRPC also takes it as the deadline of one connection attempt, TLS handshake
# included, and 200 ms of it failed calls to nodes busy starting their JVMs ("timed out before receiving SETTINGS").
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]

_channels: dict[str, grpc.Channel] = {}
_client_stubs: dict[str, pb_grpc.ClientStub] = {}
_channels_lock = threading.Lock()
_sessions = StreamPools()  # by address


class ClusterFileError(Exception):
    """cluster.json is missing or malformed."""


# ------------------------------------------------------------------ channels


def connect(addr: str) -> grpc.Channel:
    """A channel to `addr` (HOST:PORT), cached per address for the life of the process: over mutual TLS with the
    credentials given for it (`use_credentials`, else $VBC_CREDENTIALS), plaintext when there are none."""
    with _channels_lock:
        return _cached_channel(addr)


def _cached_channel(addr: str) -> grpc.Channel:
    channel = _channels.get(addr)
    if channel is None:
        credentials = _credentials.get(addr) or _default_credentials()
        channel = _channels[addr] = (grpc.insecure_channel(addr, options=CHANNEL_OPTIONS) if credentials is None
                                     else grpc.secure_channel(addr, credentials, options=CHANNEL_OPTIONS))
    return channel


# ------------------------------------------------------------------ credentials

CREDENTIALS_ENV = "VBC_CREDENTIALS"
CREDENTIALS_DIR = "credentials"  # DIR/credentials of `vbc cluster up`: ca.crt, client.root.crt, client.root.key
DEFAULT_USER = "root"
_credentials: dict[str, grpc.ChannelCredentials] = {}  # by address
_from_environment: list[grpc.ChannelCredentials | None] = []  # loaded once, from $VBC_CREDENTIALS


def credentials_from(directory: str | Path, user: str | None = None) -> grpc.ChannelCredentials:
    """Channel credentials from a folder laid out as DIR/credentials: ca.crt and client.USER.crt/.key (USER: `user`,
    else root, else the only client certificate there), or a node's node.crt/.key."""
    from common import certs
    folder = Path(directory)
    if user is None:
        users = sorted(p.name[len("client."):-len(".crt")] for p in folder.glob("client.*.crt"))
        if not users and (folder / certs.NODE_CERT).exists():
            return grpc.ssl_channel_credentials(**certs.node_tls_material(folder)._asdict())
        user = _the_user(folder, users)
    return grpc.ssl_channel_credentials(**certs.client_tls_material(folder, user)._asdict())


def _the_user(folder: Path, users: list[str]) -> str:
    """Whose client certificate of `folder` to connect with: root's, else the only one there."""
    if DEFAULT_USER in users or not users:
        return DEFAULT_USER
    if len(users) == 1:
        return users[0]
    from common import certs
    raise certs.CertificateError(f"{folder} holds the client certificates of {', '.join(users)}: give a folder "
                                 f"holding only the one to connect with (or {DEFAULT_USER}'s)")


def use_credentials(credentials: grpc.ChannelCredentials | None, addresses: Iterable[str] | None = None) -> None:
    """Connect to `addresses` (every address without credentials of its own, when None) with `credentials`."""
    with _channels_lock:
        if addresses is None:
            _from_environment[:] = [credentials]
            stale = list(_channels)
        else:
            stale = [a for a in addresses if _credentials.get(a) is not credentials]
            for address in stale:
                if credentials is None:
                    _credentials.pop(address, None)
                else:
                    _credentials[address] = credentials
        for address in stale:
            _client_stubs.pop(address, None)
            channel = _channels.pop(address, None)
            if channel is not None:
                channel.close()
    _sessions.discard(stale)  # their open calls ran on the closed channels


def has_credentials() -> bool:
    """Whether this process connects to any node with certificates."""
    return bool(_credentials) or _default_credentials() is not None


def _default_credentials() -> grpc.ChannelCredentials | None:
    if not _from_environment:
        folder = os.environ.get(CREDENTIALS_ENV, "")
        _from_environment.append(credentials_from(folder) if folder else None)
    return _from_environment[0]


def use_cluster_credentials(data_dir: str | Path, addresses: Iterable[str]) -> None:
    """The credentials of a local cluster's DIR/credentials for its addresses (nothing for an insecure cluster)."""
    folder = (Path(data_dir) / CREDENTIALS_DIR).resolve()
    try:
        key = (folder, (folder / "ca.crt").read_bytes())
    except FileNotFoundError:
        return
    credentials = _cluster_credentials.get(key)
    if credentials is None:
        credentials = _cluster_credentials[key] = credentials_from(folder)
    use_credentials(credentials, addresses)


# by DIR/credentials folder and its CA: a cluster made again in the same folder (the demo's) has a new CA
_cluster_credentials: dict[tuple[Path, bytes], grpc.ChannelCredentials] = {}

PASSWORD_ENV = "VBC_PASSWORD"
USER_KEY, PASSWORD_KEY = "vbc-user", "vbc-password"  # node.security's names (not imported: it imports the core)


class _Login(grpc.AuthMetadataPlugin):
    """Puts the role's name and password on every call (sent over TLS only: gRPC refuses call credentials on a
    plaintext channel)."""

    def __init__(self, user: str, password: str):
        self._metadata = ((USER_KEY, user), (PASSWORD_KEY, password))

    def __call__(self, context, callback):
        callback(self._metadata, None)


def login_credentials(user: str, password: str, ca_folder: str | Path) -> grpc.ChannelCredentials:
    """TLS that trusts the nodes signed by the CA in `ca_folder`/ca.crt, logging in as `user` with `password`
    (for a node's client port: `vbc node start --client-addr`, "client" in cluster.json)."""
    from common import certs
    path = Path(ca_folder) / certs.CA_CERT
    try:
        ca = path.read_bytes()
    except FileNotFoundError:
        raise certs.CertificateError(f"no {path}: a login needs the cluster's CA certificate to trust the nodes "
                                     "(give --credentials DIR holding ca.crt, or --cluster DIR)") from None
    return grpc.composite_channel_credentials(grpc.ssl_channel_credentials(root_certificates=ca),
                                              grpc.metadata_call_credentials(_Login(user, password)))


def login_addresses_from_cluster(data_dir: str | Path) -> list[str]:
    """The client (password login) addresses of the nodes in DIR/cluster.json."""
    nodes = read_cluster_file(data_dir)["nodes"]
    addresses = [node["client"] for node in nodes if node.get("client")]
    if not addresses:
        raise ClusterFileError(f"the nodes of {data_dir} have no client port for password logins (a cluster "
                               "made before they existed): connect with its certificates, without --user")
    return addresses


def close_all() -> None:
    """Close every cached channel and session (they are re-created when next needed)."""
    with _channels_lock:
        channels = list(_channels.values())
        _channels.clear()
        _client_stubs.clear()
    _sessions.close()
    for channel in channels:
        channel.close()


def client_stub(addr: str) -> pb_grpc.ClientStub:
    """The Client stub of `addr`, cached with its channel (making one registers every method, ~12 µs)."""
    with _channels_lock:
        stub = _client_stubs.get(addr)
        if stub is None:
            stub = _client_stubs[addr] = pb_grpc.ClientStub(_cached_channel(addr))
        return stub


def sessions(addr: str) -> StreamPool:
    """The open `Session` calls to `addr` (common.stream_pool): statements run on them one at a time."""
    return _sessions.get(addr, lambda: client_stub(addr).Session)


def admin_stub(addr: str) -> pb_grpc.AdminStub:
    return pb_grpc.AdminStub(connect(addr))


def internode_stub(addr: str) -> pb_grpc.InternodeStub:
    return pb_grpc.InternodeStub(connect(addr))


# ------------------------------------------------------------------ cluster.json


def read_cluster_file(data_dir: str | Path) -> dict:
    """The parsed DIR/cluster.json written by `vbc cluster up`."""
    path = Path(data_dir) / CLUSTER_FILE
    try:
        cluster = json.loads(path.read_text())
    except FileNotFoundError:
        raise ClusterFileError(f"{path} not found: is there a cluster started with 'vbc cluster up' in {data_dir}?") from None
    except json.JSONDecodeError as exc:
        raise ClusterFileError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(cluster, dict) or not isinstance(cluster.get("nodes"), list):
        raise ClusterFileError(f"{path} has no 'nodes' list")
    for node in cluster["nodes"]:
        if not isinstance(node, dict) or not node.get("id") or not node.get("grpc"):
            raise ClusterFileError(f"{path}: every node needs an 'id' and a 'grpc' address, got {node!r}")
    return cluster


def addresses_from_cluster(data_dir: str | Path) -> list[str]:
    """The gRPC addresses of every node listed in DIR/cluster.json, in file order (connected to with the cluster's
    DIR/credentials when it has them)."""
    addresses = [node["grpc"] for node in read_cluster_file(data_dir)["nodes"]]
    use_cluster_credentials(data_dir, addresses)
    return addresses


def node_address_from_cluster(data_dir: str | Path, node_id: str) -> str | None:
    """The gRPC address of node `node_id` in DIR/cluster.json, or None when it is not listed."""
    for node in read_cluster_file(data_dir)["nodes"]:
        if node["id"] == node_id:
            return node["grpc"]
    return None


# ------------------------------------------------------------------ fail-over


def as_addresses(addr_or_addrs: str | Iterable[str]) -> list[str]:
    addresses = [addr_or_addrs] if isinstance(addr_or_addrs, str) else list(addr_or_addrs)
    if not addresses:
        raise ValueError("no node address given")
    return addresses


def is_connected(addr: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the channel to `addr` is (or becomes within `timeout`) connected."""
    try:
        grpc.channel_ready_future(connect(addr)).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False


def is_unreachable(addr: str, error: grpc.RpcError, idempotent: bool = False) -> bool:
    """Whether `error` means another node should be tried.

    Always when the node could not be reached (UNAVAILABLE or DEADLINE_EXCEEDED without a connection); for an
    idempotent call also when the node itself answered UNAVAILABLE (e.g. it is still joining the cluster).
    A non-idempotent call (a write, DDL) whose node answered UNAVAILABLE is not retried elsewhere: its
    outcome may be unknown, and a retry could report a confusing ALREADY_EXISTS.
    """
    code = error.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return idempotent or not is_connected(addr, timeout=0.1)
    return code == grpc.StatusCode.DEADLINE_EXCEEDED and not is_connected(addr)


def call_any(addresses: str | Iterable[str], fn: Callable[[str], T], idempotent: bool = False) -> T:
    """`fn(addr)` on the first address that answers; an unreachable node moves on to the next one.

    Any other gRPC error is raised at once; when no node answers, the last error is raised. With
    `idempotent`, a node answering UNAVAILABLE also moves on (see is_unreachable).
    """
    last_error: grpc.RpcError | None = None
    for addr in as_addresses(addresses):
        try:
            return fn(addr)
        except grpc.RpcError as error:
            if not is_unreachable(addr, error, idempotent):
                raise
            last_error = error
    assert last_error is not None
    raise last_error


def error_text(error: grpc.RpcError) -> str:
    """`CODE: details` of a gRPC error, as the command line prints it."""
    code = error.code()
    name = code.name if code is not None else "UNKNOWN"
    return f"{name}: {error.details() or ''}".rstrip()


# ------------------------------------------------------------------ Client service


def execute_response(addr_or_addrs, statement: str, timeout: float = DEFAULT_TIMEOUT,
                     params=None, staged: bool = False) -> pb.ExecuteResponse:
    """The raw ExecuteResponse of `statement` (with bind values `params`), run on the first reachable node.

    `params`: value sets as a list of lists or tuples, or columns as a `pyarrow.Table`/`RecordBatch` or a pandas
    `DataFrame` (sent as one Arrow IPC stream: one column per `?`, in order). With values, the statement is
    prepared on that node first (once per node and text: see `prepare`). `staged` (Arrow values of an INSERT): a
    bulk load's rows, kept in the staging area of a table with views until processed (see `vbc.load`).
    """
    arrow = arrow_ipc(params)
    if arrow is None and not params:
        request = pb.ExecuteRequest(statement=statement)
        return call_any(addr_or_addrs, lambda addr: execute_on(addr, request, timeout, is_read(statement)),
                        idempotent=is_read(statement))
    values = pb.ExecuteRequest(arrow_values=arrow, staged=staged) if arrow is not None else pb.ExecuteRequest(
        params=[values_to_proto(row) for row in params])
    return call_any(addr_or_addrs, lambda addr: execute_prepared(addr, statement, values, timeout),
                    idempotent=is_read(statement))


def arrow_ipc(values) -> bytes | None:
    """`values` as Arrow IPC stream bytes when it is a pyarrow Table or RecordBatch or a pandas DataFrame."""
    module = type(values).__module__
    if not module.startswith(("pyarrow", "pandas")):
        return None
    import pyarrow as pa
    if module.startswith("pandas"):
        values = pa.Table.from_pandas(values, preserve_index=False)
    elif isinstance(values, pa.RecordBatch):
        values = pa.Table.from_batches([values])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, values.schema) as writer:
        writer.write_table(values)
    return sink.getvalue().to_pybytes()


# Prepared statements: (node address, statement text) -> the node's PrepareResponse.
_prepared: dict[tuple[str, str], pb.PrepareResponse] = {}
_prepared_lock = threading.Lock()
PREPARED_CACHE_SIZE = 4096


def prepare(addr: str, statement: str, timeout: float = DEFAULT_TIMEOUT) -> pb.PrepareResponse:
    """`statement` prepared on the node at `addr` (cached: one Prepare per node and text): its id and bind columns."""
    key = (addr, statement)
    with _prepared_lock:
        cached = _prepared.get(key)
    if cached is not None:
        return cached
    response = client_stub(addr).Prepare(pb.PrepareRequest(statement=statement), timeout=timeout)
    with _prepared_lock:
        if len(_prepared) >= PREPARED_CACHE_SIZE:
            _prepared.pop(next(iter(_prepared)))
        _prepared[key] = response
    return response


def forget_prepared(addr: str, statement: str) -> None:
    with _prepared_lock:
        _prepared.pop((addr, statement), None)


UNPREPARED = "unprepared statement"  # cql.prepared.UNPREPARED (not imported: importing cql builds its parser)


def is_unprepared(error: grpc.RpcError) -> bool:
    """The node does not hold the prepared statement (any more): prepare it again."""
    return error.code() == grpc.StatusCode.FAILED_PRECONDITION and (error.details() or "").startswith(UNPREPARED)


def execute_prepared(addr: str, statement: str, values: pb.ExecuteRequest,
                     timeout: float = DEFAULT_TIMEOUT) -> pb.ExecuteResponse:
    """Execute `statement` prepared on `addr` with the value sets of `values` (its `params` or `arrow_values`);
    prepared again once if the node lost it (restarted, evicted, or a table of it changed)."""
    for attempt in (1, 2):
        prepared = prepare(addr, statement, timeout)
        request = pb.ExecuteRequest(prepared_id=prepared.id)
        request.MergeFrom(values)
        try:
            return execute_on(addr, request, timeout, is_read(statement))
        except grpc.RpcError as error:
            if attempt == 2 or not is_unprepared(error):
                raise
            forget_prepared(addr, statement)
    raise AssertionError("unreachable")


def execute_on(addr: str, request: pb.ExecuteRequest, timeout: float = DEFAULT_TIMEOUT,
               idempotent: bool = False) -> pb.ExecuteResponse:
    """Execute `request` on one of the node's open sessions, or as a unary call when none is free (or the session
    ended before answering: the node did not run it). Errors are raised as the unary call's would be."""
    def unary() -> pb.ExecuteResponse:
        return client_stub(addr).Execute(request, timeout=timeout)

    exchange = start_exchange(sessions(addr), request, timeout, idempotent=idempotent)
    answer = unary() if exchange is None else exchange.answer(unary)
    if isinstance(answer, pb.ExecuteResponse):
        return answer
    if answer.error_code:
        raise StatusError(answer.error_code, answer.error_message)
    return answer.response


def is_read(statement: str) -> bool:
    """Whether a statement only reads (so it may be retried on another node)."""
    return statement.lstrip().lower().startswith("select")


def result_from_response(response: pb.ExecuteResponse) -> tuple[list[str], list[list], str]:
    columns = [column.name for column in response.columns]
    rows = [values_from_proto(row) for row in response.rows]
    return columns, rows, response.message


def execute(addr_or_addrs, statement: str, timeout: float = DEFAULT_TIMEOUT,
            params=None, staged: bool = False) -> tuple[list[str], list[list], str]:
    """Run one statement (once per bind-value set in `params`, see `execute_response`): (column names, rows,
    message)."""
    return result_from_response(execute_response(addr_or_addrs, statement, timeout, params, staged))


def rows_as_dicts(columns: list[str], rows: list[list]) -> list[dict]:
    return [dict(zip(columns, row)) for row in rows]


def query(addr_or_addrs, statement: str, timeout: float = DEFAULT_TIMEOUT) -> list[dict]:
    """Run a SELECT: its rows as {column: value} dicts."""
    columns, rows, _ = execute(addr_or_addrs, statement, timeout)
    return rows_as_dicts(columns, rows)


# ------------------------------------------------------------------ Admin service


def node_status_to_dict(node: pb.NodeStatus) -> dict:
    return {
        "id": node.id,
        "grpc": node.grpc,
        "raft": node.raft,
        "alive": node.alive,
        "shards": node.shards,
        "schema_version": node.schema_version,
        "pending_view_updates": node.pending_view_updates,
        "worker": worker_stats_to_dict(node.worker) if node.HasField("worker") else None,
        "insecure": node.insecure,
    }


def worker_stats_to_dict(stats: pb.WorkerStats) -> dict:
    document = {field.name: getattr(stats, field.name) for field in stats.DESCRIPTOR.fields}
    document["failures"] = [{"view_id": f.view_id, "error": f.error, "attempts": f.attempts} for f in stats.failures]
    return document


def view_status_to_dict(view: pb.ViewStatus) -> dict:
    return {
        "name": view.name,
        "base": view.base,
        "state": view.state,
        "is_index": view.is_index,
        "tasks_total": view.tasks_total,
        "tasks_done": view.tasks_done,
        "progress": view.progress,
        "rows_done": view.rows_done,
        "rows_per_s": view.rows_per_s,
        "eta_s": view.eta_s,
        "hosts": dict(sorted(view.hosts.items())),
        "errors": [{"node": e.node, "error": e.error, "attempts": e.attempts} for e in view.errors],
        "held": [{"holder": h.holder, "target": h.target} for h in view.held],
    }


def status_to_dict(response: pb.StatusResponse) -> dict:
    """The JSON shape of `vbc status --json`."""
    return {
        "leader": response.leader,
        "term": response.term,
        "answered_by": response.answered_by,
        "schema_version": response.schema_version,
        "nodes": [node_status_to_dict(node) for node in response.nodes],
        "views": [view_status_to_dict(view) for view in response.views],
        "migrations": [migration_to_dict(m) for m in response.migrations],
        "staging": [{"table": t.table, "tasks": t.tasks, "replicas": list(t.replicas), "rows": t.rows}
                    for t in response.staging],
    }


def status_response(addr_or_addrs, timeout: float = 10.0, views_only: bool = False) -> pb.StatusResponse:
    request = pb.StatusRequest(views_only=views_only)
    return call_any(addr_or_addrs, lambda addr: admin_stub(addr).Status(request, timeout=timeout), idempotent=True)


def status(addr_or_addrs, timeout: float = 10.0, views_only: bool = False) -> dict:
    """Admin.Status of the first reachable node, as a dict (see `status_to_dict`); with `views_only`, only its views
    (no node is probed: no nodes, errors or streams)."""
    return status_to_dict(status_response(addr_or_addrs, timeout, views_only))


def view_status(addr_or_addrs, view: str, timeout: float = 10.0, views_only: bool = False) -> dict:
    """The status dict of one view ("ks.name"); LookupError when it does not exist. With `views_only` the cheap
    status (no node probed), which leaves the view's `errors` empty."""
    found = next((v for v in status(addr_or_addrs, timeout, views_only)["views"] if v["name"] == view), None)
    if found is None:
        raise LookupError(f"no view or index {view} (see `vbc status` for the views)")
    return found


def wait_built(addr_or_addrs, view: str, timeout: float, poll: float = 0.1,
               on_progress: Callable[[dict], None] | None = None) -> dict:
    """Wait until `view` is BUILT; its last status. TimeoutError (with the progress and the batches' last errors)
    when `timeout` passes.

    Polls the cheap views-only status (on 3 nodes a full status cost the nodes ~40 ms of CPU, polled ten times a
    second during a build)."""
    deadline = time.monotonic() + timeout
    while True:
        current = view_status(addr_or_addrs, view, views_only=True)
        if on_progress is not None:
            on_progress(current)
        if current["state"] == "BUILT":
            return current
        if time.monotonic() >= deadline:
            raise TimeoutError(_not_built_message(view_status(addr_or_addrs, view), timeout))
        time.sleep(min(poll, max(deadline - time.monotonic(), 0.0)))


def _not_built_message(view: dict, timeout: float) -> str:
    errors = "".join(f"; {e['node']}: {e['error']} ({e['attempts']} attempts)" for e in view["errors"])
    held = "".join(f"; view rows kept on {h['holder']} wait for {h['target']}" for h in view["held"])
    return (f"{view['name']} is not built after {timeout:g}s: {view['tasks_done']}/{view['tasks_total']} tasks, "
            f"{view['progress']:.1%}, {view['rows_done']:,} rows{errors}{held}")


def check_to_dict(response: pb.CheckViewResponse) -> dict:
    return {
        "view": response.view, "state": response.state, "consistent": not (response.missing or response.extra
                                                                          or response.different),
        "base_rows": response.base_rows, "view_rows": response.view_rows, "missing": response.missing,
        "extra": response.extra, "different": response.different, "replicas_checked": response.replicas_checked,
        "seconds": round(response.seconds, 3),
        "examples": [{"kind": e.kind, "replica": e.replica, "key": e.key, "expected": e.expected, "found": e.found}
                     for e in response.examples],
    }


def check(addr_or_addrs, view: str, max_examples: int = 5, timeout: float = 600.0) -> dict:
    """Admin.CheckView: the view compared with its function of the base table (see `check_to_dict`)."""
    request = pb.CheckViewRequest(view=view, max_examples=max_examples)
    response = call_any(addr_or_addrs, lambda addr: admin_stub(addr).CheckView(request, timeout=timeout),
                        idempotent=True)
    return check_to_dict(response)


def tablet_to_dict(tablet: pb.TabletInfo) -> dict:
    """The tablet's range and replicas; while it moves, also its stage, leaving and pending replica, migration and
    the reason it rolls back (None unless it does)."""
    info = {
        "tablet": tablet.tablet,
        "first_token": tablet.first_token,
        "last_token": tablet.last_token,
        "replicas": list(tablet.replicas),
    }
    if tablet.stage:
        info.update(stage=tablet.stage, leaving=tablet.leaving, pending=tablet.pending,
                    migration_id=tablet.migration_id, reason=tablet.reason or None)
    return info


def migration_to_dict(info: pb.MigrationInfo) -> dict:
    return {"migration_id": info.migration_id, "state": info.state, "stage": info.stage or None,
            "reason": info.reason or None, "table": info.table or None, "tablet": info.tablet,
            "leaving": info.leaving or None, "pending": info.pending or None, "kind": info.kind or None,
            "rows_streamed": info.rows_streamed, "rows_per_s": round(info.rows_per_s, 1)}


def move_tablet(addr_or_addrs, table: str, tablet: int, from_replica: str, to_replica: str,
                timeout: float = DEFAULT_TIMEOUT) -> str:
    """Admin.MoveTablet: start moving replica `from_replica` ("node" or "node:shard") of a tablet to `to_replica`;
    the migration's id (it runs in the background: see `migration` and `wait_migration`)."""
    request = pb.MoveTabletRequest(table=table, tablet=tablet, from_replica=from_replica, to_replica=to_replica)
    return call_any(addr_or_addrs, lambda addr: admin_stub(addr).MoveTablet(request, timeout=timeout)).migration_id


def resize_tablets(addr_or_addrs, table: str, merge: bool, timeout: float = DEFAULT_TIMEOUT) -> tuple[int, int]:
    """Admin.ResizeTablets: split `table`'s tablets now, or request their merge; (count now, count to come)."""
    request = pb.ResizeTabletsRequest(table=table, merge=merge)
    answer = call_any(addr_or_addrs, lambda addr: admin_stub(addr).ResizeTablets(request, timeout=timeout))
    return answer.tablet_count, answer.target_count


def wait_tablet_count(addr_or_addrs, table: str, count: int, timeout: float, poll: float = 0.2,
                      on_progress: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Wait until `table` has `count` tablets; its tablets then. TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        current = tablets(addr_or_addrs, table)
        if on_progress is not None:
            on_progress(current)
        if len(current) == count:
            return current
        if time.monotonic() >= deadline:
            moving = sum(1 for t in current if t.get("stage"))
            raise TimeoutError(f"{table} still has {len(current)} tablets after {timeout:g}s ({moving} moving)")
        time.sleep(min(poll, max(deadline - time.monotonic(), 0.0)))


def join_cluster(addr_or_addrs, node_id: str, grpc_addr: str, raft_addr: str, shards: int,
                 timeout: float = DEFAULT_TIMEOUT) -> dict[str, tuple[str, str]]:
    """Admin.JoinCluster: admit this node into the Raft group; the members as {id: (grpc, raft)}.

    Only the Raft leader admits: the call goes to the leader as the first node that answers names it, then to the
    given addresses (a member that is not the leader answers UNAVAILABLE, and the next one is tried)."""
    request = pb.JoinClusterRequest(node_id=node_id, grpc=grpc_addr, raft=raft_addr, shards=shards)
    addresses = as_addresses(addr_or_addrs)
    answer = call_any(_leader_first(addresses), lambda addr: admin_stub(addr).JoinCluster(request, timeout=timeout),
                      idempotent=True)
    return {m.id: (m.grpc, m.raft) for m in answer.members}


def _leader_first(addresses: list[str]) -> list[str]:
    """The leader's gRPC address (as the first node that answers knows it) before `addresses`."""
    try:
        known = status(addresses, views_only=False)
    except grpc.RpcError:
        return addresses
    leader = next((node["grpc"] for node in known["nodes"] if node["id"] == known["leader"]), None)
    return [leader, *(a for a in addresses if a != leader)] if leader else addresses


def node_state(addr_or_addrs, node_id: str, timeout: float = 10.0) -> dict:
    """Admin.NodeState: {"node_id", "state" (normal, leaving, removing, removed, unknown), "replicas"}."""
    answer = call_any(addr_or_addrs, lambda addr: admin_stub(addr).NodeState(pb.NodeInfoRequest(node_id=node_id),
                                                                              timeout=timeout), idempotent=True)
    return {"node_id": answer.node_id, "state": answer.state, "replicas": answer.replicas}


def decommission(addr_or_addrs, node_id: str, dead: bool = False, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """Admin.Decommission: start taking `node_id` out (with `dead`, rebuilding its replicas from the others)."""
    request = pb.DecommissionRequest(node_id=node_id, dead=dead)
    answer = call_any(addr_or_addrs, lambda addr: admin_stub(addr).Decommission(request, timeout=timeout))
    return {"node_id": answer.node_id, "state": answer.state, "replicas": answer.replicas}


def wait_node_removed(addr_or_addrs, node_id: str, timeout: float, poll: float = 0.5,
                      on_progress: Callable[[dict], None] | None = None) -> dict:
    """Wait until `node_id` is removed from the cluster; its last state. TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        current = node_state(addr_or_addrs, node_id)
        if on_progress is not None:
            on_progress(current)
        if current["state"] in ("removed", "unknown"):
            return current
        if time.monotonic() >= deadline:
            raise TimeoutError(f"node {node_id} is still {current['state']} with {current['replicas']} tablet "
                               f"replica(s) after {timeout:g}s")
        time.sleep(min(poll, max(deadline - time.monotonic(), 0.0)))


def balancer(addr_or_addrs, action: str = "status", timeout: float = DEFAULT_TIMEOUT) -> dict:
    """Admin.Balancer: switch the tablet load balancer "on" or "off", or its "status":
    {"enabled", "migrations", "loads": {node: tablet replicas}}."""
    request = pb.BalancerRequest(action=action)
    answer = call_any(addr_or_addrs, lambda addr: admin_stub(addr).Balancer(request, timeout=timeout),
                      idempotent=action == "status")
    return {"enabled": answer.enabled, "migrations": answer.migrations,
            "loads": {load.node: load.replicas for load in answer.loads}}


def build_config(addr_or_addrs, chunk_rows: int = 0, rate_rows_per_s: int | None = None, parallel_bases: int = 0,
                 timeout: float = DEFAULT_TIMEOUT) -> dict:
    """Admin.BuildConfig: the cluster's view building settings ({"chunk_rows", "rate_rows_per_s" (0: no limit),
    "parallel_bases"}), after changing those given (0, and a rate of None: unchanged)."""
    request = pb.BuildConfigRequest(chunk_rows=chunk_rows, rate_rows_per_s=rate_rows_per_s,
                                    parallel_bases=parallel_bases)
    answer = call_any(addr_or_addrs, lambda addr: admin_stub(addr).BuildConfig(request, timeout=timeout),
                      idempotent=True)  # setting a value twice leaves it set
    return {"chunk_rows": answer.chunk_rows, "rate_rows_per_s": answer.rate_rows_per_s,
            "parallel_bases": answer.parallel_bases}


def pause_view(addr_or_addrs, view: str, paused: bool = True, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Admin.PauseView: pause (or resume) the build of view "ks.name"; whether it is paused now."""
    request = pb.PauseViewRequest(view=view, paused=paused)
    return call_any(addr_or_addrs, lambda addr: admin_stub(addr).PauseView(request, timeout=timeout),
                    idempotent=True).paused


def migration(addr_or_addrs, migration_id: str, timeout: float = 10.0) -> dict:
    """Admin.Migration: where migration `migration_id` is (see `migration_to_dict`)."""
    request = pb.MigrationRequest(migration_id=migration_id)
    return migration_to_dict(call_any(addr_or_addrs, lambda addr: admin_stub(addr).Migration(request, timeout=timeout),
                                      idempotent=True))


def wait_migration(addr_or_addrs, migration_id: str, timeout: float, poll: float = 0.2,
                   on_progress: Callable[[dict], None] | None = None) -> dict:
    """Wait until the migration is done or reverted; its last state. TimeoutError (with its stage) otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        current = migration(addr_or_addrs, migration_id)
        if on_progress is not None:
            on_progress(current)
        if current["state"] not in ("in_progress",):
            return current
        if time.monotonic() >= deadline:
            raise TimeoutError(f"migration {migration_id} is still at stage {current['stage']} after {timeout:g}s")
        time.sleep(min(poll, max(deadline - time.monotonic(), 0.0)))


def tablets(addr_or_addrs, table: str, timeout: float = 10.0) -> list[dict]:
    """The tablets of `table` ("ks.name"), one dict per tablet."""
    request = pb.TabletsRequest(table=table)
    response = call_any(addr_or_addrs, lambda addr: admin_stub(addr).Tablets(request, timeout=timeout),
                        idempotent=True)
    return [tablet_to_dict(tablet) for tablet in response.tablets]


INJECT_ACTIONS = {
    "enable": pb.InjectRequest.ENABLE,
    "disable": pb.InjectRequest.DISABLE,
    "wait_hit": pb.InjectRequest.WAIT_HIT,
    "list": pb.InjectRequest.LIST,
}


def injection_point_to_dict(point: pb.InjectionPoint) -> dict:
    return {"name": point.name, "enabled": point.enabled, "mode": point.mode, "one_shot": point.one_shot, "hits": point.hits}


def inject_response_to_dict(response: pb.InjectResponse) -> dict:
    return {"node": response.node, "hit": response.hit, "points": [injection_point_to_dict(p) for p in response.points],
            "injections_enabled": not response.injections_disabled}


def inject(
    addr_or_addrs,
    name: str = "",
    action: str = "enable",
    mode: str = "",
    one_shot: bool = False,
    timeout: float | None = None,
) -> dict:
    """Admin.Inject; action is enable | disable | wait_hit | list.

    A node started without --enable-injections refuses all but list with PERMISSION_DENIED, and its list
    answer says "injections_enabled": False.

    For wait_hit, `timeout` is how long the node waits for a hit (default 10 s; the gRPC deadline is a bit
    longer) and the answer's "hit" says whether it came. Otherwise `timeout` is the gRPC deadline.
    """
    if action not in INJECT_ACTIONS:
        raise ValueError(f"unknown injection action {action!r}; expected one of {', '.join(INJECT_ACTIONS)}")
    waiting = action == "wait_hit"
    wait_seconds = (10.0 if timeout is None else timeout) if waiting else 0.0
    deadline = wait_seconds + 5.0 if waiting else (10.0 if timeout is None else timeout)
    request = pb.InjectRequest(name=name, action=INJECT_ACTIONS[action], mode=mode, one_shot=one_shot,
                               timeout=wait_seconds)
    response = call_any(addr_or_addrs, lambda addr: admin_stub(addr).Inject(request, timeout=deadline))
    return inject_response_to_dict(response)


def node_address(addr_or_addrs, node_id: str, timeout: float = 10.0) -> str:
    """The gRPC address of node `node_id`, from Admin.Status of a reachable node."""
    for node in status(addr_or_addrs, timeout)["nodes"]:
        if node["id"] == node_id:
            return node["grpc"]
    raise LookupError(f"node {node_id!r} is not a member of the cluster")


# ------------------------------------------------------------------ Internode (readiness probes)


def local_status(addr: str, timeout: float = 2.0) -> dict:
    """Internode.LocalStatus of one node, as a dict."""
    response = internode_stub(addr).LocalStatus(pb.LocalStatusRequest(), timeout=timeout)
    return {
        "node_id": response.node_id,
        "schema_version": response.schema_version,
        "applied_index": response.applied_index,
        "pending_view_updates": response.pending_view_updates,
        "term": response.term,
        "leader": response.leader,
        "raft_secret_fingerprint": response.raft_secret_fingerprint,
    }
