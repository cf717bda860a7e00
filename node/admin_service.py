"""The Admin gRPC service: cluster status, tablet maps and fault injection, for operators and the CLI."""
from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from common.injection import Injections, default_mode
from common.progress import BuildRates
from common.status import unary
from coordinator.core import balancer
from coordinator.core.commands import (
    DecommissionNode,
    RequestTabletMerge,
    SetBalancer,
    SetBuildSettings,
    SetViewPaused,
    SplitTablets,
    StartTabletMigration,
)
from coordinator.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from coordinator.core.migrations import resolve_move, transitions_of_table
from coordinator.core.schema import TASK_PROCESS_STAGING
from coordinator.core.tablets import removed_message
from coordinator.core.tokens import tablet_range
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc
from worker.check import DEFAULT_EXAMPLES, CheckResult

STATUS_PROBE_THREADS = 8

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdminDeps:
    """What the Admin service needs of its node."""

    node_id: str
    read_state: Callable  # fn(state) -> value, under the group0 read lock
    raft_status: Callable[[], dict]
    require_ready: Callable[[], None]
    probe: Callable[[str], pb.LocalStatusResponse | None]  # a node's local status, None if it does not answer
    injections: Injections
    catch_up: Callable[[], None]  # best effort: apply what group0 committed so far (progress never goes back)
    check_view: Callable[[str, str, int], CheckResult]  # (keyspace, view, max examples) -> the check's result
    clock: Callable[[], float]  # monotonic seconds, for build rates
    propose: Callable = lambda command: None  # (group0 command) -> its Outcome, committed
    add_member: Callable[[str], None] = lambda raft_addr: None  # admit a Raft address into group0
    injections_enabled: bool = False  # `vbc node start --enable-injections`: Inject may switch points on


class AdminService(rpc.AdminServicer):
    def __init__(self, deps: AdminDeps):
        self._deps = deps
        self._pool = ThreadPoolExecutor(max_workers=STATUS_PROBE_THREADS, thread_name_prefix="status")
        self._rates = BuildRates()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @unary
    def Status(self, request, context):
        deps = self._deps
        deps.require_ready()
        deps.catch_up()
        group0_status = deps.raft_status()
        nodes, views, version = deps.read_state(_status_snapshot)
        moving = deps.read_state(lambda s: [migration_info(s, m) for m in sorted(t.migration_id
                                                                                 for t in s.transitions.values())])
        self._add_rates(views)
        response = pb.StatusResponse(leader=group0_status.get("leader_id") or "", term=group0_status["term"],
                                     answered_by=deps.node_id, schema_version=version, migrations=moving,
                                     staging=deps.read_state(_staged_tables))
        if request.views_only:
            response.views.extend(view for _, view in views)
            return response
        probes = {n.id: self._pool.submit(deps.probe, n.id) for n in nodes}
        streams = []
        for member in nodes:
            local = probes[member.id].result()
            streams += list(local.streams) if local is not None else []
            response.nodes.append(pb.NodeStatus(
                id=member.id, grpc=member.grpc, raft=member.raft, alive=local is not None, shards=member.shards,
                schema_version=local.schema_version if local else 0,
                pending_view_updates=local.pending_view_updates if local else 0,
                worker=local.worker if local and local.HasField("worker") else None,
                insecure=local.insecure if local else False,
            ))
        _add_errors(views, response.nodes)
        _add_stream_progress(response.migrations, streams)
        response.views.extend(view for _, view in views)
        return response

    def _add_rates(self, views: list[tuple[str, pb.ViewStatus]]) -> None:
        now = self._deps.clock()
        for view_id, view in views:
            rate = self._rates.observe(view_id, now, view.rows_done, view.progress, view.state == "BUILT")
            view.rows_per_s, view.eta_s = rate.rows_per_s, rate.eta_s
        self._rates.forget_except({view_id for view_id, _ in views})

    @unary
    def Tablets(self, request, context):
        keyspace, _, name = request.table.partition(".")
        if not keyspace or not name:
            raise InvalidArgument(f"give the table as KEYSPACE.TABLE, got {request.table!r}")
        table, tablet_map, moves = self._deps.read_state(lambda s: _tablets_and_moves(s, keyspace, name))
        response = pb.TabletsResponse(table=table.qualified_name, table_id=table.id)
        for tablet_id, replicas in enumerate(tablet_map.replicas):
            first, last = tablet_range(tablet_id, tablet_map.tablet_count)
            info = pb.TabletInfo(tablet=tablet_id, first_token=first, last_token=last, replicas=[str(r) for r in replicas])
            move = moves.get(tablet_id)
            if move is not None:
                info.stage, info.leaving, info.pending = move.stage, str(move.leaving), str(move.pending)
                info.migration_id, info.reason = move.migration_id, move.reason
            response.tablets.append(info)
        return response

    @unary
    def MoveTablet(self, request, context):
        self._deps.require_ready()
        keyspace, _, name = request.table.partition(".")
        if not keyspace or not name:
            raise InvalidArgument(f"give the table as KEYSPACE.TABLE, got {request.table!r}")
        table, (leaving, pending) = self._deps.read_state(lambda s: _resolved_move(s, keyspace, name, request))
        migration_id = uuid.uuid4().hex
        outcome = self._deps.propose(StartTabletMigration(
            cmd_id=uuid.uuid4().hex, migration_id=migration_id, table_id=table.id, tablet_id=request.tablet,
            leaving_node=leaving.node, leaving_shard=leaving.shard, pending_node=pending.node,
            pending_shard=pending.shard))
        if not outcome.ok:
            raise outcome.error
        return pb.MoveTabletResponse(migration_id=migration_id)

    @unary
    def ResizeTablets(self, request, context):
        self._deps.require_ready()
        keyspace, _, name = request.table.partition(".")
        if not keyspace or not name:
            raise InvalidArgument(f"give the table as KEYSPACE.TABLE, got {request.table!r}")
        table, tablet_map = self._deps.read_state(lambda s: _table_and_tablets(s, keyspace, name))
        command = (RequestTabletMerge(cmd_id=uuid.uuid4().hex, table_id=table.id) if request.merge else
                   SplitTablets(cmd_id=uuid.uuid4().hex, table_id=table.id, id_seed=uuid.uuid4().hex))
        outcome = self._deps.propose(command)
        if not outcome.ok:
            raise outcome.error
        now = tablet_map.tablet_count if request.merge else outcome.value
        return pb.ResizeTabletsResponse(tablet_count=now, target_count=outcome.value)

    @unary
    def JoinCluster(self, request, context):
        self._deps.require_ready()
        members = self._deps.read_state(lambda s: check_join(s, request))
        self._deps.add_member(request.raft)
        log.info("node %s (%s, Raft %s) admitted into group0", request.node_id, request.grpc, request.raft)
        return pb.JoinClusterResponse(members=members)

    @unary
    def Decommission(self, request, context):
        self._deps.require_ready()
        outcome = self._deps.propose(DecommissionNode(cmd_id=uuid.uuid4().hex, node_id=request.node_id,
                                                      dead=request.dead))
        if not outcome.ok:
            raise outcome.error
        return self._deps.read_state(lambda s: node_info(s, request.node_id))

    @unary
    def NodeState(self, request, context):
        self._deps.catch_up()
        return self._deps.read_state(lambda s: node_info(s, request.node_id))

    @unary
    def Balancer(self, request, context):
        if request.action not in ("on", "off", "status"):
            raise InvalidArgument(f"balancer action must be on, off or status, not {request.action!r}")
        if request.action != "status":
            self._deps.require_ready()
            outcome = self._deps.propose(SetBalancer(cmd_id=uuid.uuid4().hex, enabled=request.action == "on"))
            if not outcome.ok:
                raise outcome.error
        else:
            self._deps.catch_up()
        return self._deps.read_state(lambda s: pb.BalancerStatus(
            enabled=s.balancer_enabled, migrations=len(s.transitions),
            loads=[pb.NodeLoad(node=n, replicas=c) for n, c in balancer.imbalance(s).items()]))

    @unary
    def BuildConfig(self, request, context):
        rate = request.rate_rows_per_s if request.HasField("rate_rows_per_s") else None
        if request.chunk_rows or rate is not None or request.parallel_bases:
            self._propose(SetBuildSettings(cmd_id=uuid.uuid4().hex, chunk_rows=request.chunk_rows or None,
                                           rate_rows_per_s=rate, parallel_bases=request.parallel_bases or None))
        else:
            self._deps.catch_up()
        return self._deps.read_state(lambda s: pb.BuildSettings(**dataclasses.asdict(s.build_settings)))

    @unary
    def PauseView(self, request, context):
        keyspace, _, name = request.view.partition(".")
        if not keyspace or not name:
            raise InvalidArgument(f"give the view as KEYSPACE.VIEW, got {request.view!r}")
        paused = self._propose(SetViewPaused(cmd_id=uuid.uuid4().hex, keyspace=keyspace, name=name,
                                             paused=request.paused))
        return pb.PauseViewResponse(paused=paused)

    def _propose(self, command) -> object:
        """Propose a command once this node is ready; its value, or its refusal raised."""
        self._deps.require_ready()
        outcome = self._deps.propose(command)
        if not outcome.ok:
            raise outcome.error
        return outcome.value

    @unary
    def Migration(self, request, context):
        self._deps.catch_up()
        info = self._deps.read_state(lambda s: migration_info(s, request.migration_id))
        if info.state == "in_progress" and info.pending:
            local = self._deps.probe(info.pending.split(":")[0])
            _add_stream_progress([info], list(local.streams) if local is not None else [])
        return info

    @unary
    def CheckView(self, request, context):
        self._deps.require_ready()
        keyspace, _, name = request.view.partition(".")
        if not keyspace or not name:
            raise InvalidArgument(f"give the view as KEYSPACE.VIEW, got {request.view!r}")
        result = self._deps.check_view(keyspace, name, request.max_examples or DEFAULT_EXAMPLES)
        return pb.CheckViewResponse(
            view=result.view, state=result.state, base_rows=result.base_rows, view_rows=result.view_rows,
            missing=result.counts["MISSING"], extra=result.counts["EXTRA"], different=result.counts["DIFFERENT"],
            replicas_checked=result.replicas_checked, seconds=result.seconds,
            examples=[pb.CheckDifference(kind=e.kind, replica=e.replica, key=e.key, expected=e.expected,
                                         found=e.found) for e in result.examples])

    @unary
    def Inject(self, request, context):
        """Switch an injection point on or off, wait for a hit, or list them; only LIST unless enabled."""
        injections = self._deps.injections
        action = request.action
        enabled = self._deps.injections_enabled
        if not enabled and action != pb.InjectRequest.LIST:
            raise PermissionDenied(f"fault injection is disabled on node {self._deps.node_id}: "
                                   "start the node with --enable-injections")
        hit = False
        try:
            if action == pb.InjectRequest.ENABLE:
                injections.enable(request.name, request.mode, request.one_shot)  # mode "": the point's default
            elif action == pb.InjectRequest.DISABLE:
                injections.disable(request.name)
            elif action == pb.InjectRequest.WAIT_HIT:
                hit = injections.wait_hit(request.name, request.timeout or 10.0)
        except KeyError as error:
            raise NotFound(error.args[0]) from None
        except ValueError as error:
            raise InvalidArgument(str(error)) from None
        points = [_injection_point(n, p) for n, p in sorted(injections.points().items())]
        return pb.InjectResponse(hit=hit, points=points, node=self._deps.node_id, injections_disabled=not enabled)


def _injection_point(name: str, point) -> pb.InjectionPoint:
    """A point as listed: a disabled point shows its default mode, the one `enable` without a mode uses."""
    mode = point.mode if point.enabled else default_mode(name)
    return pb.InjectionPoint(name=name, enabled=point.enabled, mode=mode, one_shot=point.one_shot, hits=point.hits)


def _add_stream_progress(migrations, streams) -> None:
    """Give each migration in progress the rows its pending node reports streamed, and their rate."""
    by_id = {m.migration_id: m for m in migrations}
    for stream in streams:
        migration = by_id.get(stream.migration_id)
        if migration is not None:
            migration.rows_streamed, migration.rows_per_s = stream.rows, stream.rows_per_s


def _add_errors(views: list[tuple[str, pb.ViewStatus]], nodes) -> None:
    """Give each view the nodes whose workers report its batches failing (node order)."""
    by_view = {view_id: view for view_id, view in views}
    for node in nodes:
        for failure in node.worker.failures if node.HasField("worker") else ():
            view = by_view.get(failure.view_id)
            if view is not None:
                view.errors.append(pb.ViewBuildError(node=node.id, error=failure.error, attempts=failure.attempts))


def check_join(state, request) -> list[pb.Member]:
    """The members a joining node starts with; refuses a removed id or an id or address already in use."""
    if not request.node_id or not request.grpc or not request.raft:
        raise InvalidArgument("a joining node gives its id, gRPC and Raft addresses")
    if request.node_id in state.removed_nodes:
        raise FailedPrecondition(removed_message(request.node_id))
    known = state.nodes.get(request.node_id)
    if known is not None and (known.grpc, known.raft) != (request.grpc, request.raft):
        raise AlreadyExists(f"node {request.node_id} is already a member at {known.grpc} (Raft {known.raft}); "
                            "choose another id")
    for node in state.nodes.values():
        if node.id != request.node_id and request.raft in (node.grpc, node.raft):
            raise AlreadyExists(f"address {request.raft} is already used by node {node.id}")
    return [pb.Member(id=n.id, grpc=n.grpc, raft=n.raft) for n in sorted(state.nodes.values(), key=lambda n: n.id)
            if n.id != request.node_id]


def node_info(state, node_id: str) -> pb.NodeInfo:
    node = state.nodes.get(node_id)
    held = sum(1 for m in state.tablets.values() for rs in m.replicas for r in rs if r.node == node_id)
    if node is not None:
        return pb.NodeInfo(node_id=node_id, state=node.state, replicas=held)
    return pb.NodeInfo(node_id=node_id, state="removed" if node_id in state.removed_nodes else "unknown")


def _resolved_move(state, keyspace: str, name: str, request):
    table = state.require_table(keyspace, name)
    return table, resolve_move(state, table.id, request.tablet, request.from_replica, request.to_replica)


def migration_info(state, migration_id: str) -> pb.MigrationInfo:
    """Where a migration is, from group0: in progress (its stage, why if it rolls back), done, reverted, or unknown."""
    info = pb.MigrationInfo(migration_id=migration_id, state="unknown")
    transition = next((t for t in state.transitions.values() if t.migration_id == migration_id), None)
    if transition is not None:
        table = state.tables.get(transition.table_id)
        info.state, info.stage = "in_progress", transition.stage
        info.table = table.qualified_name if table is not None else transition.table_id
        info.tablet, info.leaving, info.pending = transition.tablet_id, str(transition.leaving), str(transition.pending)
        info.kind, info.reason = transition.kind, transition.reason
        return info
    result = state.migration_results.get(migration_id)
    if result is not None:
        info.state, info.reason = result.outcome, result.reason
    return info


def _tablets_and_moves(state, keyspace: str, name: str):
    """The table, its tablet map and its tablets in transition, from one snapshot."""
    table, tablet_map = _table_and_tablets(state, keyspace, name)
    return table, tablet_map, transitions_of_table(state, table.id)


def _table_and_tablets(state, keyspace: str, name: str):
    table = state.require_table(keyspace, name)
    return table, state.tablets[table.id]


def _view_state(state, view_id: str, progress: dict) -> str:
    if progress["built"]:
        return "BUILT"
    return "PAUSED" if view_id in state.paused_views else "BUILDING"


def _status_snapshot(state):
    views = []
    for view in (t for t in state.tables.values() if t.view is not None):
        progress = state.view_progress(view.id)
        total, done = progress["tasks_total"], progress["tasks_done"]
        base = state.tables[view.view.base_id]
        views.append((view.id, pb.ViewStatus(
            name=view.qualified_name, base=base.qualified_name, state=_view_state(state, view.id, progress),
            tasks_total=total, tasks_done=done,
            progress=1.0 if progress["built"] else (done / total if total else 0.0),
            hosts=progress["hosts"], is_index=view.view.is_index, rows_done=progress["rows_done"],
            held=[pb.HeldViewRows(holder=holder, target=target) for holder, target in progress["held"]],
        )))
    return sorted(state.nodes.values(), key=lambda n: n.id), views, state.schema_version


def _staged_tables(state) -> list[pb.StagedTable]:
    """The tables with process_staging tasks left, by name."""
    replicas: dict[str, list[str]] = {}
    rows: dict[str, int] = {}
    for task in state.tasks.values():
        if task.type == TASK_PROCESS_STAGING and task.base_id in state.tables:
            name = state.tables[task.base_id].qualified_name
            replicas.setdefault(name, []).append(str(task.replica))
            rows[name] = rows.get(name, 0) + task.staged_rows
    return [pb.StagedTable(table=name, tasks=len(held), replicas=sorted(set(held)), rows=rows[name])
            for name, held in sorted(replicas.items())]
