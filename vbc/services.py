"""gRPC servicers of a node (client, admin, node-to-node) and the mapping of errors to status codes."""
from __future__ import annotations

import functools
import logging
from concurrent.futures import ThreadPoolExecutor

import grpc

from coordinator.core.errors import CoreError, InvalidArgument, NotFound
from coordinator.core.tokens import tablet_range
from coordinator.raft import Group0Unavailable
from vbc.cql import CqlSyntaxError
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc

from . import metrics
from .executor import Executor, Result
from .values import row_from_proto, row_to_proto

log = logging.getLogger(__name__)

LOCAL_STATUS_TIMEOUT = 1.5


def status_for(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and message a person can act on for an error raised while serving."""
    if isinstance(error, CoreError):
        return grpc.StatusCode[error.code], error.message
    if isinstance(error, CqlSyntaxError):
        return grpc.StatusCode.INVALID_ARGUMENT, f"syntax error: {error}"
    if isinstance(error, Group0Unavailable):
        return grpc.StatusCode.UNAVAILABLE, str(error)
    if isinstance(error, grpc.RpcError):
        return grpc.StatusCode.UNAVAILABLE, f"a node this request needed failed: {error.code().name}: {error.details()}"
    log.exception("internal error while serving a request")
    return grpc.StatusCode.INTERNAL, f"internal error ({type(error).__name__}: {error}); see the node log"


def _abort(servicer, context, error: Exception) -> None:
    code, message = status_for(error)
    counter = getattr(servicer, "error_counter", None)
    if counter is not None:
        counter.labels(code.name).inc()
    context.abort(code, message)


def unary(method):
    """Every error of the handler becomes a gRPC status (counted when the servicer has an error_counter)."""
    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except Exception as error:  # noqa: BLE001 - every error becomes a status; the daemon keeps serving
            _abort(self, context, error)

    return wrapper


def streaming(method):
    """Like `unary`, for server-streaming handlers."""
    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            yield from method(self, request, context)
        except Exception as error:  # noqa: BLE001
            _abort(self, context, error)

    return wrapper


def _response(result: Result) -> pb.ExecuteResponse:
    return pb.ExecuteResponse(
        columns=[pb.Column(name=n, type=t) for n, t in result.columns],
        rows=[row_to_proto(r) for r in result.rows],
        message=result.message,
    )


def _params(request: pb.ExecuteRequest) -> list[list] | None:
    return [row_from_proto(row) for row in request.params] or None


class ClientService(rpc.ClientServicer):
    error_counter = metrics.STATEMENT_ERRORS

    def __init__(self, executor: Executor):
        self._executor = executor

    @unary
    def Execute(self, request, context):
        return _response(self._executor.execute(request.statement, _params(request)))

    @streaming
    def ExecuteStream(self, request, context):
        for page in self._executor.execute_pages(request.statement, request.page_size or 1000, _params(request)):
            yield _response(page)


class AdminService(rpc.AdminServicer):
    def __init__(self, node):
        self._node = node
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="status")

    @unary
    def Status(self, request, context):
        node = self._node
        node.require_ready()
        group0_status = node.group0.status()
        nodes, views, version = node.group0.read(_status_snapshot)
        probes = {n.id: self._pool.submit(node.probe, n.id) for n in nodes}
        response = pb.StatusResponse(leader=group0_status.get("leader_id") or "", term=group0_status["term"],
                                     answered_by=node.node_id, schema_version=version)
        for member in nodes:
            local = probes[member.id].result()
            response.nodes.append(pb.NodeStatus(
                id=member.id, grpc=member.grpc, raft=member.raft, alive=local is not None, shards=member.shards,
                schema_version=local.schema_version if local else 0,
                pending_view_updates=local.pending_view_updates if local else 0,
            ))
        response.views.extend(views)
        return response

    @unary
    def Tablets(self, request, context):
        keyspace, _, name = request.table.partition(".")
        if not keyspace or not name:
            raise InvalidArgument(f"give the table as KEYSPACE.TABLE, got {request.table!r}")
        table = self._node.group0.read(lambda s: s.require_table(keyspace, name))
        tablet_map = self._node.group0.read(lambda s: s.tablets[table.id])
        response = pb.TabletsResponse(table=table.qualified_name, table_id=table.id)
        for tablet_id, replicas in enumerate(tablet_map.replicas):
            first, last = tablet_range(tablet_id, tablet_map.tablet_count)
            response.tablets.append(pb.TabletInfo(tablet=tablet_id, first_token=first, last_token=last,
                                                  replicas=[str(r) for r in replicas]))
        return response

    @unary
    def Inject(self, request, context):
        injections = self._node.injections
        action = request.action
        hit = False
        try:
            if action == pb.InjectRequest.ENABLE:
                injections.enable(request.name, request.mode or "fail", request.one_shot)
            elif action == pb.InjectRequest.DISABLE:
                injections.disable(request.name)
            elif action == pb.InjectRequest.WAIT_HIT:
                hit = injections.wait_hit(request.name, request.timeout or 10.0)
        except KeyError as error:
            raise NotFound(error.args[0]) from None
        except ValueError as error:
            raise InvalidArgument(str(error)) from None
        points = [pb.InjectionPoint(name=n, enabled=p.enabled, mode=p.mode, one_shot=p.one_shot, hits=p.hits)
                  for n, p in sorted(injections.points().items())]
        return pb.InjectResponse(hit=hit, points=points, node=self._node.node_id)


def _status_snapshot(state):
    views = []
    for view in (t for t in state.tables.values() if t.view is not None):
        progress = state.view_progress(view.id)
        total, done = progress["tasks_total"], progress["tasks_done"]
        base = state.tables[view.view.base_id]
        views.append(pb.ViewStatus(
            name=view.qualified_name, base=base.qualified_name, state="BUILT" if progress["built"] else "BUILDING",
            tasks_total=total, tasks_done=done,
            progress=1.0 if progress["built"] else (done / total if total else 0.0),
            hosts=progress["hosts"], is_index=view.view.is_index,
        ))
    return sorted(state.nodes.values(), key=lambda n: n.id), views, state.schema_version


class InternodeService(rpc.InternodeServicer):
    def __init__(self, node):
        self._node = node

    @unary
    def ReplicaWrite(self, request, context):
        self._node.observe_timestamp(request.timestamp)
        return pb.Ack(applied=self._node.local.apply_base_write(request))

    @unary
    def ViewUpdate(self, request, context):
        return pb.Ack(applied=self._node.local.apply_view_update(request))

    @streaming
    def Scan(self, request, context):
        yield from self._node.local.scan(request)

    @unary
    def LocalStatus(self, request, context):
        return self._node.local_status()

    @unary
    def SchemaBarrier(self, request, context):
        self._node.wait_schema_applied(request.schema_version, request.timeout or 30.0)
        return self._node.local_status()
