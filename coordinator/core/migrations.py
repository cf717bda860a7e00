"""Tablet migrations: the stages a moving tablet replica goes through, and where reads and writes go meanwhile.

Owns the `transitions`, `migration_results` and `_migration_term` fields of Group0State. One migration replaces
the replica at one position of one tablet (the *leaving* replica) by another (the *pending* one), in ScyllaDB's
stages, each a group0 command so that a new leader resumes where the old one was:

    allow_write_both_read_old -> write_both_read_old -> streaming -> write_both_read_new -> use_new -> cleanup
      -> end_migration (the tablet map names the pending replica; the transition is gone)
    (allow_write_both_read_old | write_both_read_old | streaming | write_both_read_new) -> cleanup_target
      -> revert_migration
      (the pending replica's rows are dropped, the map is unchanged; the transition is gone)

Writes reach both replicas from `allow_write_both_read_old` to `write_both_read_new`, and only the pending one
from `use_new`; reads switch to the pending replica at `write_both_read_new`, after streaming. The pending
replica takes the leaving one's position, so both feed the same paired view replica; before reads switch, the
pending replica (still being filled) makes no view updates: the leaving replica makes them.

Build tasks follow (ScyllaDB's seed): a task on the leaving replica is aborted when the migration starts (an abort
is never undone); at `end_migration` each gets a new task (new id) on the pending replica, at
`revert_migration` a copy (new id) on the leaving one, and the aborted tasks go.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from . import staging, view_building
from .commands import AdvanceTabletMigration, StartTabletMigration
from .errors import FailedPrecondition, InvalidArgument, NotFound, StaleTerm
from .ids import check_id, derived_id
from .placement import choose_replicas, replica_loads
from .schema import NODE_NORMAL, NODE_REMOVING, Replica, Table, TabletMap, Task

if TYPE_CHECKING:
    from .state import Group0State

ALLOW_WRITE_BOTH_READ_OLD = "allow_write_both_read_old"
WRITE_BOTH_READ_OLD = "write_both_read_old"
STREAMING = "streaming"
WRITE_BOTH_READ_NEW = "write_both_read_new"
USE_NEW = "use_new"
CLEANUP = "cleanup"
END_MIGRATION = "end_migration"
CLEANUP_TARGET = "cleanup_target"
REVERT_MIGRATION = "revert_migration"

FORWARD = (ALLOW_WRITE_BOTH_READ_OLD, WRITE_BOTH_READ_OLD, STREAMING, WRITE_BOTH_READ_NEW, USE_NEW, CLEANUP,
           END_MIGRATION)
ROLLBACK = (CLEANUP_TARGET, REVERT_MIGRATION)
NEXT_STAGE = {**dict(zip(FORWARD, FORWARD[1:])), CLEANUP_TARGET: REVERT_MIGRATION}
CAN_ROLL_BACK = frozenset({ALLOW_WRITE_BOTH_READ_OLD, WRITE_BOTH_READ_OLD, STREAMING, WRITE_BOTH_READ_NEW})
WRITE_BOTH = frozenset({ALLOW_WRITE_BOTH_READ_OLD, WRITE_BOTH_READ_OLD, STREAMING, WRITE_BOTH_READ_NEW})
WRITE_NEW = frozenset({USE_NEW, CLEANUP})
READ_NEW = frozenset({WRITE_BOTH_READ_NEW, USE_NEW, CLEANUP})
FINAL = frozenset({END_MIGRATION, REVERT_MIGRATION})
REMEMBERED_RESULTS = 256
DONE = "done"
REVERTED = "reverted"


MOVE = "move"  # `pending` replaces `leaving` at its position
ADD = "add"  # `pending` joins at a new last position, filled from `leaving` (which stays): an RF increase
REMOVE = "remove"  # `leaving`, the last position, goes (`pending` names it again): an RF decrease. It starts at
# write_both_read_new: reads leave it at once, writes a barrier later, so a coordinator that has not applied the
# start yet and reads from it still finds every write acknowledged meanwhile.
KINDS = (MOVE, ADD, REMOVE)


@dataclass(frozen=True)
class TabletTransition:
    """A tablet replica on the move: `leaving` is replaced by `pending` at the same position (see KINDS)."""

    migration_id: str
    table_id: str
    tablet_id: int
    leaving: Replica
    pending: Replica
    stage: str
    reason: str = ""  # why it rolls back, once it does
    kind: str = MOVE
    source: Replica | None = None  # where rows are streamed from, when not the leaving replica (a dead node's)
    deaths_at_start: int = 0  # `Group0State.deaths_declared` when it started

    @property
    def stream_source(self) -> Replica:
        return self.source if self.source is not None else self.leaving

    @property
    def moves_data(self) -> bool:
        """Whether rows travel: a move between shards of one node keeps them where they are (one store)."""
        return self.kind != REMOVE and self.leaving.node != self.pending.node


@dataclass(frozen=True)
class MigrationResult:
    """How a migration ended: DONE or REVERTED, and why it reverted."""

    outcome: str
    reason: str = ""


# ------------------------------------------------------------------ routing (pure queries)


def transition_of(state: Group0State, table_id: str, tablet_id: int) -> TabletTransition | None:
    return state.transitions.get((table_id, tablet_id))


def position_targets(replica: Replica, transition: TabletTransition | None) -> tuple[Replica, ...]:
    """Where a write meant for `replica` (one position of a tablet) goes, given the tablet's transition (an added
    replica gets the writes of the replica it is filled from)."""
    if transition is None or transition.leaving != replica:
        return (replica,)
    if transition.kind == ADD:
        return (replica,) if transition.stage in ROLLBACK else (replica, transition.pending)
    if transition.kind == REMOVE:
        return (replica,) if transition.stage == WRITE_BOTH_READ_NEW else ()
    if transition.stage in WRITE_BOTH:
        return (replica, transition.pending)
    if transition.stage in WRITE_NEW:
        return (transition.pending,)
    return (replica,)


def write_replicas(state: Group0State, table_id: str, tablet_id: int) -> tuple[Replica, ...]:
    """Every replica a write to the tablet must reach (consistency ALL over the leaving and pending ones)."""
    transition = transition_of(state, table_id, tablet_id)
    return tuple(target for replica in state.tablets[table_id].replicas[tablet_id]
                 for target in position_targets(replica, transition))


def read_replicas(state: Group0State, table_id: str, tablet_id: int) -> tuple[Replica, ...]:
    """The replicas a read of the tablet may use: the pending replica instead of the leaving one once filled."""
    replicas = state.tablets[table_id].replicas[tablet_id]
    transition = transition_of(state, table_id, tablet_id)
    if transition is not None and transition.kind == REMOVE:
        return tuple(r for r in replicas if r != transition.leaving)
    if transition is None or transition.kind == ADD or transition.stage not in READ_NEW:
        return replicas
    return tuple(transition.pending if r == transition.leaving else r for r in replicas)


def position_of(state: Group0State, table_id: str, tablet_id: int, node_id: str) -> int | None:
    """The pairing position of `node_id` in the tablet: its own, or the leaving replica's for the pending node."""
    return position_in(state.tablets[table_id].replicas[tablet_id], transition_of(state, table_id, tablet_id), node_id)


def position_in(replicas: tuple[Replica, ...], transition: TabletTransition | None, node_id: str) -> int | None:
    """`position_of` given the tablet's replicas and transition."""
    for index, replica in enumerate(replicas):
        if replica.node == node_id:
            return index
    if transition is None or transition.kind == REMOVE or transition.pending.node != node_id:
        return None
    if transition.stage in ROLLBACK:
        return None
    return len(replicas) if transition.kind == ADD else replicas.index(transition.leaving)


def feeding_count(replicas: tuple[Replica, ...], transition: TabletTransition | None) -> int:
    """How many of a base tablet's replicas feed view replicas: all but one being removed, which gets no writes
    from its first stage (so base position 0 takes over the view position it fed)."""
    removing = transition is not None and transition.kind == REMOVE and transition.leaving in replicas
    return len(replicas) - 1 if removing else len(replicas)


def feeder_position(view_position: int, base_count: int) -> int:
    """The base position that feeds `view_position` (see `paired_positions`)."""
    return view_position if view_position < base_count else 0


def paired_positions(pair: int, base_count: int, view_count: int) -> tuple[int, ...]:
    """The view replica positions the base replica at position `pair` feeds, for a base tablet of `base_count`
    replicas and a view tablet of `view_count`: its own position, and base position 0 also every view position
    no base replica holds (while an RF change has given the view tablet more replicas than the base one)."""
    own = (pair,) if pair < view_count else ()
    return own + tuple(range(max(base_count, 1), view_count)) if pair == 0 else own


def paired_targets(view_replicas: tuple[Replica, ...], transition: TabletTransition | None, pair: int,
                   base_count: int) -> tuple[Replica, ...]:
    """The replicas of one view tablet that a view row from base position `pair` (of `base_count`) goes to: its
    paired positions (`paired_positions`), a moving replica's pending one included (`position_targets`)."""
    return tuple(target for position in paired_positions(pair, base_count, len(view_replicas))
                 for target in position_targets(view_replicas[position], transition))


def view_replica_missing(state: Group0State, task: Task, fewest: Mapping[str, int] | None = None) -> str | None:
    """Why `task` cannot be finished yet, or None: the view position its base replica feeds is missing from a view
    tablet that an RF increase has not grown yet. Its rows would reach no replica there, and the replica added
    later is a copy of position 0, which may not be built; so the task waits for it. `fewest` maps view ids to
    the fewest replicas of any of their tablets (`fewest_view_replicas`), when the caller has it."""
    if task.view_id is None or task.view_id not in state.tablets or task.base_id not in state.tablets:
        return None
    replicas = state.tablets[task.base_id].replicas[task.tablet_id]
    position = position_in(replicas, transition_of(state, task.base_id, task.tablet_id), task.replica.node)
    count = fewest[task.view_id] if fewest is not None and task.view_id in fewest else None
    return view_position_missing(state, task.view_id, position, task.replica, count)


def view_position_missing(state: Group0State, view_id: str, position: int | None, replica: Replica,
                          count: int | None = None) -> str | None:
    """`view_replica_missing` for the base replica `replica` at `position` and one view (`count`: the fewest
    replicas of a view tablet, when the caller has it)."""
    if not position:
        return None
    view = state.tables[view_id]
    count = fewest_view_replicas(state, view_id) if count is None else count
    if count > position or position >= state.keyspaces[view.keyspace].rf:
        return None
    return (f"view {view.qualified_name} has a tablet with {count} replicas: the view replica that base replica "
            f"{replica} (position {position}) feeds is still being added")


def fewest_view_replicas(state: Group0State, view_id: str) -> int:
    return min(len(replicas) for replicas in state.tablets[view_id].replicas)


def makes_view_updates(state: Group0State, table_id: str, tablet_id: int, node_id: str) -> bool:
    """False for the pending replica of a tablet until reads switch to it (its rows are still arriving), and for a
    replica being removed (`feeding_count`)."""
    return not feeds_no_view(transition_of(state, table_id, tablet_id), node_id)


def feeds_no_view(transition: TabletTransition | None, node_id: str, filled: bool = False) -> bool:
    """Whether a base replica's writes make no view updates: it is filling (`is_filling`; not once `filled`, when it
    holds its source's rows) or being removed."""
    removed = transition is not None and transition.kind == REMOVE and transition.leaving.node == node_id
    return removed or (not filled and is_filling(transition, node_id))


def is_filling(transition: TabletTransition | None, node_id: str) -> bool:
    """Whether `node_id` is the pending replica of `transition` and its rows are still arriving."""
    return (transition is not None and transition.moves_data and transition.pending.node == node_id
            and transition.stage not in READ_NEW)


def transitions_of_table(state: Group0State, table_id: str) -> dict[int, TabletTransition]:
    return {tablet: t for (table, tablet), t in state.transitions.items() if table == table_id}


# ------------------------------------------------------------------ commands


def start_migration(state: Group0State, cmd: StartTabletMigration) -> str:
    """Validate the move, put the tablet in its first stage and abort the leaving replica's build tasks."""
    leaving, pending = Replica(cmd.leaving_node, cmd.leaving_shard), Replica(cmd.pending_node, cmd.pending_shard)
    if cmd.kind not in KINDS:
        raise InvalidArgument(f"unknown migration kind {cmd.kind!r}: use one of {', '.join(KINDS)}")
    _check_move(state, cmd, leaving, pending)
    if cmd.migration_id in state.migration_results:
        raise FailedPrecondition(f"migration {cmd.migration_id} already ran")
    first_stage = WRITE_BOTH_READ_NEW if cmd.kind == REMOVE else ALLOW_WRITE_BOTH_READ_OLD
    source = Replica(cmd.source_node, cmd.source_shard) if cmd.source_node else None
    state.transitions[(cmd.table_id, cmd.tablet_id)] = TabletTransition(
        cmd.migration_id, cmd.table_id, cmd.tablet_id, leaving, leaving if cmd.kind == REMOVE else pending,
        first_stage, kind=cmd.kind, source=source, deaths_at_start=state.deaths_declared)
    if cmd.kind == MOVE:
        view_building.abort_replica_tasks(state, cmd.table_id, cmd.tablet_id, leaving)
    elif cmd.kind == REMOVE:
        view_building.hand_over_tasks(state, cmd.table_id, cmd.tablet_id, leaving,
                                      state.tablets[cmd.table_id].replicas[cmd.tablet_id][0], seed=cmd.migration_id)
    elif cmd.table_id in state.tables and state.tables[cmd.table_id].view is not None:
        _feed_added_view_position(state, state.tables[cmd.table_id], len(state.tablets[cmd.table_id].replicas[
            cmd.tablet_id]), derived_id(cmd.migration_id, "feed"))
    state.schema_version += 1
    return cmd.migration_id


def _check_move(state: Group0State, cmd: StartTabletMigration, leaving: Replica, pending: Replica) -> None:
    check_id(cmd.migration_id)
    table = state.tables.get(cmd.table_id)
    tablet_map = state.tablets.get(cmd.table_id)
    if table is None or tablet_map is None:
        raise NotFound(f"table id {cmd.table_id} does not exist")
    if not 0 <= cmd.tablet_id < tablet_map.tablet_count:
        raise InvalidArgument(f"{table.qualified_name} has tablets 0..{tablet_map.tablet_count - 1}, "
                              f"not {cmd.tablet_id}")
    replicas = tablet_map.replicas[cmd.tablet_id]
    if leaving not in replicas:
        raise InvalidArgument(f"{leaving} is not a replica of tablet {cmd.tablet_id} of {table.qualified_name} "
                              f"(its replicas: {', '.join(map(str, replicas))})")
    _check_not_busy(state, table.qualified_name, cmd)
    staging.check_no_staging(state, cmd.table_id, cmd.tablet_id, f"{cmd.kind} of tablet {cmd.tablet_id}")
    if cmd.source_node and (Replica(cmd.source_node, cmd.source_shard) not in replicas
                            or cmd.source_node == leaving.node):
        raise InvalidArgument(f"the rows of tablet {cmd.tablet_id} can be streamed only from another of its replicas "
                              f"({', '.join(map(str, replicas))}), not {cmd.source_node}:{cmd.source_shard}")
    if cmd.kind == REMOVE:
        if len(replicas) < 2 or replicas[-1] != leaving:
            raise InvalidArgument(f"only the last of several replicas can be removed, not {leaving} of "
                                  f"({', '.join(map(str, replicas))})")
        return
    node = state.nodes.get(pending.node)
    if node is None:
        raise InvalidArgument(f"unknown node {pending.node!r} (nodes: {', '.join(sorted(state.nodes))})")
    if not 0 <= pending.shard < node.shards:
        raise InvalidArgument(f"node {pending.node} has shards 0..{node.shards - 1}, not {pending.shard}")
    if node.state != NODE_NORMAL:
        raise InvalidArgument(f"node {pending.node} is {node.state}: move tablets to a node that stays")
    others = replicas if cmd.kind == ADD else [r for r in replicas if r != leaving]
    if pending == leaving or any(r.node == pending.node for r in others):
        raise InvalidArgument(f"{pending.node} already holds tablet {cmd.tablet_id} of {table.qualified_name}; "
                              "move it to a node that does not")


def _check_not_busy(state: Group0State, table_name: str, cmd: StartTabletMigration) -> None:
    busy = transition_of(state, cmd.table_id, cmd.tablet_id)
    if busy is not None:
        raise FailedPrecondition(f"tablet {cmd.tablet_id} of {table_name} is in transition "
                                 f"(migration {busy.migration_id}, stage {busy.stage}); wait until it ends")


def advance_migration(state: Group0State, cmd: AdvanceTabletMigration) -> str:
    """Compare-and-set the stage of a migration; the final stages apply the move or its rollback."""
    check_term(state, cmd.term)
    transition = transition_of(state, cmd.table_id, cmd.tablet_id)
    if transition is None or transition.migration_id != cmd.migration_id:
        finished = state.migration_results.get(cmd.migration_id)
        if finished is not None and cmd.to_stage in FINAL:
            return cmd.to_stage  # a retry of the command that ended it
        raise NotFound(f"migration {cmd.migration_id} is not in progress")
    if transition.stage != cmd.from_stage:
        raise FailedPrecondition(f"migration {cmd.migration_id} is at stage {transition.stage}, not {cmd.from_stage}")
    _check_step(transition, cmd.to_stage)
    record_term(state, cmd.term)
    state.schema_version += 1
    if cmd.to_stage == END_MIGRATION:
        _end(state, transition)
    elif cmd.to_stage == REVERT_MIGRATION:
        _revert(state, transition)
    else:
        reason = cmd.reason if cmd.to_stage == CLEANUP_TARGET else transition.reason
        state.transitions[(cmd.table_id, cmd.tablet_id)] = replace(transition, stage=cmd.to_stage, reason=reason)
    return cmd.to_stage


def check_term(state: Group0State, term: int) -> None:
    """Refuse a driver command from a term older than the newest one applied."""
    if term < 1:
        raise InvalidArgument(f"invalid term {term!r}: a leader's Raft term is a positive integer")
    if term < state._migration_term:
        raise StaleTerm(f"stale term {term}: a newer leader (term {state._migration_term}) drives migrations")


def record_term(state: Group0State, term: int) -> None:
    state._migration_term = max(state._migration_term, term)


def can_roll_back(transition: TabletTransition) -> bool:
    """Whether the move can be undone: writes still reach the leaving replica, so it has every row (reads go back to
    it). An RF decrease is never undone."""
    return transition.kind != REMOVE and transition.stage in CAN_ROLL_BACK


def _check_step(transition: TabletTransition, to_stage: str) -> None:
    if to_stage == NEXT_STAGE.get(transition.stage):
        return
    if to_stage == CLEANUP_TARGET and can_roll_back(transition):
        return
    raise InvalidArgument(f"a migration cannot go from {transition.stage} to {to_stage!r}")


def _end(state: Group0State, transition: TabletTransition) -> None:
    """The pending replica takes the leaving one's place (or joins, or the leaving one just goes); the build tasks
    follow: the aborted ones move to the pending replica, or go; an added replica builds the unbuilt views."""
    tablet_map = state.tablets[transition.table_id]
    replicas = list(tablet_map.replicas)
    old = replicas[transition.tablet_id]
    replicas[transition.tablet_id] = _replicas_after(old, transition)
    state.tablets[transition.table_id] = TabletMap(tablet_map.table_id, tuple(replicas))
    seed = transition.migration_id
    if transition.kind == MOVE:
        view_building.recreate_aborted_tasks(state, transition.table_id, transition.tablet_id, transition.leaving,
                                             transition.pending, seed=seed)
        if transition.source is not None:
            _rebuild_lost_position(state, transition, old.index(transition.leaving))
    elif transition.kind == REMOVE:
        view_building.drop_aborted_tasks(state, transition.table_id, transition.tablet_id, transition.leaving)
    else:
        view_building.build_on_added_replica(state, transition.table_id, transition.tablet_id, transition.pending,
                                             seed=seed)
        if _copied_view_may_be_stale(state, transition):
            repair_view_position(state, state.tables[transition.table_id], len(old), derived_id(seed, "copied"))
    _finish(state, transition, MigrationResult(DONE))


def _copied_view_may_be_stale(state: Group0State, transition: TabletTransition) -> bool:
    """Whether a view replica added by an RF increase may have copied rows a lost feeder left stale: a node was
    declared dead while it ran or is still being removed, or a repair of the view is under way."""
    table = state.tables.get(transition.table_id)
    if table is None or table.view is None:
        return False
    return (state.deaths_declared != transition.deaths_at_start
            or any(node.state == NODE_REMOVING for node in state.nodes.values())
            or any(task.repair for task in view_building.tasks_of_view(state, table.id)))


def _rebuild_lost_position(state: Group0State, transition: TabletTransition, position: int) -> None:
    """A dead replica was rebuilt from another position's replica (`source`): what only its position had is lost.

    A base replica's undelivered view updates died with it. Which view positions they were for depends on the
    pairings it had while it lived (base position 0 also feeds the view positions a smaller base tablet lacks, and
    removals shift positions), so every replica of the base tablet gets a repair task of every view. A view
    replica's copy holds what the source's position had been fed when it
    was copied, and the builds of its own position may have reached only the dead replica, so the base positions
    feeding it deliver again (built views too: a build may have ended after the copy). Repair tasks, both: the view
    replicas may hold rows the new feeder's base rows no longer imply, or rows written at another feeder's
    timestamps (`worker.view_repair`)."""
    seed = derived_id(transition.migration_id, "lost")
    table = state.tables[transition.table_id]
    if table.view is None:
        for replica in state.tablets[table.id].replicas[transition.tablet_id]:
            view_building.rebuild_replica(state, table.id, transition.tablet_id, replica, seed)
    else:
        repair_view_position(state, table, position, seed)


def repair_view_position(state: Group0State, view: Table, position: int, seed: str) -> None:
    """Every base tablet's replica feeding view position `position` gets a repair task of the view."""
    base_map = state.tablets[view.view.base_id]
    for tablet, replicas in enumerate(base_map.replicas):
        feeder = replicas[feeder_position(position, feeding_count(replicas, transition_of(state, base_map.table_id,
                                                                                          tablet)))]
        view_building.ensure_repair_task(state, view, tablet, feeder, seed)


def _feed_added_view_position(state: Group0State, view: Table, position: int, seed: str) -> None:
    """A view tablet being built gains `position`: every base tablet's replica that feeds it gets a new task. The
    added replica is a copy of position 0, which may not be built yet, and a batch of the feeder may have been routed
    (on a node that had not seen the RF increase) with no view replica at that position, its rows sent nowhere."""
    if view_building.is_built(state, view.id):
        return
    base_map = state.tablets[view.view.base_id]
    for tablet, replicas in enumerate(base_map.replicas):
        count = feeding_count(replicas, transition_of(state, base_map.table_id, tablet))
        view_building.renew_task(state, view, tablet, replicas[feeder_position(position, count)], seed)


def _replicas_after(replicas: tuple[Replica, ...], transition: TabletTransition) -> tuple[Replica, ...]:
    if transition.kind == ADD:
        return replicas + (transition.pending,)
    if transition.kind == REMOVE:
        return tuple(r for r in replicas if r != transition.leaving)
    return tuple(transition.pending if r == transition.leaving else r for r in replicas)


def _revert(state: Group0State, transition: TabletTransition) -> None:
    """The map stays; the aborted tasks get copies on the leaving replica."""
    if transition.kind == MOVE:
        view_building.recreate_aborted_tasks(state, transition.table_id, transition.tablet_id, transition.leaving,
                                             transition.leaving, seed=derived_id(transition.migration_id, "revert"))
    _finish(state, transition, MigrationResult(REVERTED, transition.reason))


def _finish(state: Group0State, transition: TabletTransition, result: MigrationResult) -> None:
    del state.transitions[(transition.table_id, transition.tablet_id)]
    state.migration_results[transition.migration_id] = result
    while len(state.migration_results) > REMEMBERED_RESULTS:
        state.migration_results.popitem(last=False)


def forget_table(state: Group0State, table_id: str) -> None:
    """A dropped table's migrations end with it (the driver finds them gone)."""
    for key in [k for k in state.transitions if k[0] == table_id]:
        transition = state.transitions.pop(key)
        state.migration_results[transition.migration_id] = MigrationResult(REVERTED, "the table was dropped")


def new_results() -> OrderedDict[str, MigrationResult]:
    return OrderedDict()


# ------------------------------------------------------------------ a move as an operator names it


def parse_replica(text: str) -> tuple[str, int | None]:
    """"node" or "node:shard" -> (node, shard or None); InvalidArgument otherwise."""
    node, sep, shard = text.strip().partition(":")
    if not node or (sep and not shard.isdigit()):
        raise InvalidArgument(f"give a replica as NODE or NODE:SHARD, got {text!r}")
    return node, int(shard) if sep else None


def resolve_move(state: Group0State, table_id: str, tablet_id: int, leaving_text: str,
                 pending_text: str) -> tuple[Replica, Replica]:
    """The (leaving, pending) replicas of an operator's move: a node without a shard means its replica of the
    tablet (leaving) or its least loaded shard (pending)."""
    tablet_map = state.tablets[table_id]
    if not 0 <= tablet_id < tablet_map.tablet_count:
        raise InvalidArgument(f"the table has tablets 0..{tablet_map.tablet_count - 1}, not {tablet_id}")
    node, shard = parse_replica(leaving_text)
    held = [r for r in tablet_map.replicas[tablet_id] if r.node == node and shard in (None, r.shard)]
    if not held:
        raise InvalidArgument(f"{leaving_text} holds no replica of tablet {tablet_id} (its replicas: "
                              f"{', '.join(map(str, tablet_map.replicas[tablet_id]))})")
    node, shard = parse_replica(pending_text)
    if shard is None:
        if node not in state.nodes:
            raise InvalidArgument(f"unknown node {node!r} (nodes: {', '.join(sorted(state.nodes))})")
        _, per_shard = replica_loads(state.tablets.values())
        shard = min(range(state.nodes[node].shards), key=lambda s: (per_shard[Replica(node, s)], s))
    return held[0], Replica(node, shard)


# ------------------------------------------------------------------ replication factor changes


@dataclass(frozen=True)
class PlannedMove:
    """A transition the leader's driver should start (see `replication_moves`)."""

    table_id: str
    tablet_id: int
    kind: str
    leaving: Replica
    pending: Replica
    source: Replica | None = None


def replication_moves(state: Group0State, limit: int) -> list[PlannedMove]:
    """Up to `limit` transitions bringing tablets to their keyspace's RF, one per tablet at a time: an ADD on the
    least loaded node (and shard) not holding the tablet, filled from its first replica on a live node (not one
    being removed); a REMOVE of the last."""
    loads = None  # counted once an ADD needs them
    planned: list[PlannedMove] = []
    for table in sorted(state.tables.values(), key=lambda t: (t.keyspace, t.id)):
        rf = state.keyspaces[table.keyspace].rf
        if limit <= 0 or all(len(replicas) == rf for replicas in state.tablets[table.id].replicas):
            continue
        for tablet, replicas in enumerate(state.tablets[table.id].replicas):
            if len(planned) >= limit:
                return planned
            if (table.id, tablet) in state.transitions or len(replicas) == rf:
                continue
            if len(replicas) > rf:
                if any(state.nodes[r.node].state != NODE_REMOVING for r in replicas[:-1]):  # a live one stays
                    planned.append(PlannedMove(table.id, tablet, REMOVE, replicas[-1], replicas[-1]))
                continue
            source = next((r for r in replicas if state.nodes[r.node].state != NODE_REMOVING), None)
            loads = loads or replica_loads(state.tablets.values())
            chosen = choose_replicas(state.nodes, 1, frozenset(r.node for r in replicas), *loads)
            if chosen and source is not None:
                planned.append(PlannedMove(table.id, tablet, ADD, source, chosen[0]))
    return planned


# ------------------------------------------------------------------ nodes leaving


def drain_moves(state: Group0State, limit: int) -> list[PlannedMove]:
    """Up to `limit` moves of replicas off leaving or removing nodes (one per tablet at a time), each to the least
    loaded normal node not holding the tablet; a removing (dead) node's rows come from another replica."""
    leaving_nodes = {n.id for n in state.nodes.values() if n.state != NODE_NORMAL}
    if not leaving_nodes or limit <= 0:
        return []
    per_node, per_shard = replica_loads(state.tablets.values())
    planned: list[PlannedMove] = []
    for table_id in sorted(state.tablets):
        for tablet, replicas in enumerate(state.tablets[table_id].replicas):
            if len(planned) >= limit:
                return planned
            going = [r for r in replicas if r.node in leaving_nodes]
            if not going or (table_id, tablet) in state.transitions:
                continue
            chosen = choose_replicas(state.nodes, 1, frozenset(r.node for r in replicas), per_node, per_shard)
            if not chosen:
                continue
            source = None
            if state.nodes[going[0].node].state == NODE_REMOVING:
                survivors = [r for r in replicas if state.nodes[r.node].state != NODE_REMOVING]  # leaving ones live
                if not survivors:
                    continue  # no replica left to rebuild it from (see `stranded_tablets`)
                source = survivors[0]
            planned.append(PlannedMove(table_id, tablet, MOVE, going[0], chosen[0], source))
    return planned


def stranded_tablets(state: Group0State, node_id: str) -> list[tuple[str, int]]:
    """(table id, tablet) of the tablets whose only replicas are on `node_id` or nodes being removed (dead ones; a
    replica an RF decrease is removing does not count either)."""
    departing = {n.id for n in state.nodes.values() if n.state == NODE_REMOVING} | {node_id}  # a leaving one is up
    stranded = []
    for table_id, tablet_map in sorted(state.tablets.items()):
        for tablet, replicas in enumerate(tablet_map.replicas):
            staying = _staying(replicas, transition_of(state, table_id, tablet))
            if any(r.node == node_id for r in staying) and all(r.node in departing for r in staying):
                stranded.append((table_id, tablet))
    return stranded


def _staying(replicas: tuple[Replica, ...], transition: TabletTransition | None) -> tuple[Replica, ...]:
    """The replicas a tablet keeps: all but one an RF decrease is removing; a move that can no longer roll back ends
    with its pending replica in the map (one that can still roll back is rolled back if its pending node dies)."""
    if transition is None or transition.stage in ROLLBACK:
        return replicas
    if transition.kind == REMOVE:
        return tuple(r for r in replicas if r != transition.leaving)
    return replicas if can_roll_back(transition) else _replicas_after(replicas, transition)


def removable_nodes(state: Group0State) -> list[str]:
    """Departing nodes that hold no replica and take part in no migration: ready to leave the Raft group."""
    busy = {r.node for m in state.tablets.values() for rs in m.replicas for r in rs}
    busy |= {n for t in state.transitions.values() for n in (t.leaving.node, t.pending.node)}
    return sorted(n.id for n in state.nodes.values() if n.state != NODE_NORMAL and n.id not in busy)


def barrier_nodes(state: Group0State) -> list[str]:
    """The nodes a migration barrier asks: every node but the dead ones being removed."""
    return sorted(n.id for n in state.nodes.values() if n.state != NODE_REMOVING)
