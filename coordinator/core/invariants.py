"""The invariants of the replicated group0 state, checked by `Group0State.validate()` after every command in tests.

Each check raises AssertionError naming what contradicts what. They are the rules the commands keep between them
(the coverage of the view replicas by the base rows needs the rows themselves: the data simulation checks it):

- tablet maps: every table and view has one, each tablet has replicas, on distinct known nodes and valid shards;
- transitions: one per tablet (keyed by it), of an existing tablet, the leaving replica one of its replicas, the
  pending one on a node that does not hold the tablet otherwise, a stage the kind goes through;
- feeders: every base tablet keeps a replica that feeds view replicas (`migrations.feeding_count` >= 1);
- tasks: of an existing base tablet and one of its views, on a current replica of the tablet; aborted exactly when
  that replica is being moved away; none on a replica an RF decrease removes; a node holding a task of a view has
  the view's build STARTED there, so a view with tasks left is not BUILT; a process_staging task names no view and
  its tablet is not in transition;
- the processing bases (distinct) and the merge requests name existing base tables;
- progress: a view's rows_done covers what its running tasks reported (`task_rows`); the build settings are in
  range; paused views exist;
- holds of view rows: of an existing view, by and for nodes not removed, numbered at most `holds_made`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import build_settings, migrations
from .schema import BUILD_STARTED, TASK_PROCESS_STAGING

if TYPE_CHECKING:
    from .state import Group0State

_KIND_STAGES = {
    migrations.MOVE: frozenset(migrations.FORWARD + migrations.ROLLBACK),
    migrations.ADD: frozenset(migrations.FORWARD + migrations.ROLLBACK),
    migrations.REMOVE: frozenset({migrations.WRITE_BOTH_READ_NEW, migrations.USE_NEW, migrations.CLEANUP,
                                  migrations.END_MIGRATION}),
}


def validate(state: Group0State) -> None:
    """Raise AssertionError when the state contradicts one of the invariants above."""
    check_tablet_maps(state)
    check_transitions(state)
    check_tasks(state)
    check_building(state)
    check_progress(state)


def check_progress(state: Group0State) -> None:
    reported: dict[str, int] = {}
    for task_id, rows in state.task_rows.items():
        assert rows >= 0, f"task {task_id} reported {rows} rows"
        task = state.tasks.get(task_id)
        if task is not None:
            reported[task.view_id] = reported.get(task.view_id, 0) + rows
    for view_id, rows in reported.items():
        assert state.rows_done.get(view_id, 0) >= rows, \
            f"view {view_id} shows {state.rows_done.get(view_id, 0)} rows done, below its running tasks' {rows}"
    settings = state.build_settings
    assert build_settings.MIN_CHUNK_ROWS <= settings.chunk_rows <= build_settings.MAX_CHUNK_ROWS, settings
    assert settings.rate_rows_per_s == 0 or settings.rate_rows_per_s >= build_settings.MIN_RATE, settings
    assert 1 <= settings.parallel_bases <= build_settings.MAX_PARALLEL_BASES, settings
    for view_id in state.paused_views:
        assert view_id in state.tables and state.tables[view_id].view is not None, f"paused {view_id} is no view"
    check_holds(state)


def check_holds(state: Group0State) -> None:
    for (view_id, holder, target), hold in state.held_view_rows.items():
        assert view_id in state.tables and state.tables[view_id].view is not None, f"rows of {view_id} held: no view"
        assert not {holder, target} & state.removed_nodes, f"hold {hold} of {view_id} names a removed node"
        assert 0 < hold <= state.holds_made, f"hold {hold} of {view_id} beyond the {state.holds_made} made"


def check_tablet_maps(state: Group0State) -> None:
    assert set(state.tablets) == set(state.tables), \
        f"tables without a tablet map or maps without a table: {set(state.tablets) ^ set(state.tables)}"
    nodes = state.nodes
    for table_id, tablet_map in state.tablets.items():
        assert tablet_map.table_id == table_id and tablet_map.replicas, f"tablet map of {table_id} is empty or misfiled"
        for tablet, replicas in enumerate(tablet_map.replicas):
            assert replicas, f"{_tablet(state, table_id, tablet)} has no replica"
            assert len({r.node for r in replicas}) == len(replicas), \
                f"{_tablet(state, table_id, tablet)} has two replicas on one node: {replicas}"
            for replica in replicas:
                node = nodes.get(replica.node)
                assert node is not None, \
                    f"{_tablet(state, table_id, tablet)} has a replica on unknown node {replica.node}"
                assert 0 <= replica.shard < node.shards, \
                    f"{_tablet(state, table_id, tablet)} has a replica on missing shard {replica}"


def _tablet(state: Group0State, table_id: str, tablet: int) -> str:
    return f"tablet {tablet} of {state.tables[table_id].qualified_name}"


def check_transitions(state: Group0State) -> None:
    for (table_id, tablet), transition in state.transitions.items():
        assert (transition.table_id, transition.tablet_id) == (table_id, tablet), \
            f"{_migration(transition, table_id, tablet)} is filed under another"
        assert table_id in state.tablets and tablet < state.tablets[table_id].tablet_count, \
            f"{_migration(transition, table_id, tablet)}: no such tablet"
        assert transition.stage in _KIND_STAGES[transition.kind], \
            f"{_migration(transition, table_id, tablet)}: a {transition.kind} at {transition.stage}"
        replicas = state.tablets[table_id].replicas[tablet]
        assert transition.leaving in replicas, \
            f"{_migration(transition, table_id, tablet)}: leaving replica {transition.leaving} not in {replicas}"
        if transition.kind != migrations.REMOVE:
            others = replicas if transition.kind == migrations.ADD else tuple(
                r for r in replicas if r != transition.leaving)
            assert transition.pending.node not in {r.node for r in others}, \
                f"{_migration(transition, table_id, tablet)}: pending replica {transition.pending} on a node that " \
                f"holds the tablet"
        if transition.kind == migrations.REMOVE:
            assert replicas[-1] == transition.leaving and len(replicas) > 1, \
                f"{_migration(transition, table_id, tablet)}: removes {transition.leaving}"


def _migration(transition, table_id: str, tablet: int) -> str:
    return f"migration {transition.migration_id} of tablet {tablet} of table {table_id}"


def check_tasks(state: Group0State) -> None:
    transitions = state.transitions
    for task in state.tasks.values():
        assert task.base_id in state.tablets, f"{_task(task)}: its base table is gone"
        view = state.tables.get(task.view_id) if task.view_id is not None else None
        assert task.view_id is None or (view is not None and view.view.base_id == task.base_id), \
            f"{_task(task)}: not a view of base {task.base_id}"
        base_map = state.tablets[task.base_id]
        assert 0 <= task.tablet_id < base_map.tablet_count, f"{_task(task)}: tablet {task.tablet_id} does not exist"
        replicas = base_map.replicas[task.tablet_id]
        assert task.replica in replicas, f"{_task(task)}: on {task.replica}, not a replica of tablet {task.tablet_id}"
        transition = transitions.get((task.base_id, task.tablet_id)) if transitions else None
        if task.type == TASK_PROCESS_STAGING:
            assert transition is None and not task.aborted, \
                f"{_task(task)}: staged rows of tablet {task.tablet_id} wait while it is in transition"
            assert task.view_id is None, f"{_task(task)}: a process_staging task names no view"
            continue
        moving_away = transition is not None and transition.kind == migrations.MOVE \
            and transition.leaving == task.replica
        assert task.aborted == moving_away, \
            f"{_task(task)}: aborted={task.aborted} on {task.replica}, which {'moves' if moving_away else 'stays'}"
        assert transition is None or transition.kind != migrations.REMOVE or transition.leaving != task.replica, \
            f"{_task(task)}: on {task.replica}, which an RF decrease removes (base position 0 builds for it)"
        if task.view_id is not None:
            assert state.build_status.get((task.view_id, task.replica.node)) == BUILD_STARTED, \
                f"{_task(task)}: node {task.replica.node} holds it but the view's build there is not STARTED"


def _task(task) -> str:
    return f"task {task.id} of view {task.view_id}"


def check_building(state: Group0State) -> None:
    transitions = state.transitions
    for table_id, tablet_map in state.tablets.items():
        for tablet, replicas in enumerate(tablet_map.replicas):
            transition = transitions.get((table_id, tablet)) if transitions else None
            assert migrations.feeding_count(replicas, transition) >= 1, \
                f"tablet {tablet} of table {table_id} has no replica feeding its views"
    for base in state.processing_bases:
        assert base in state.tables and state.tables[base].view is None, \
            f"processing base {base} is not an existing base table"
    assert len(set(state.processing_bases)) == len(state.processing_bases), state.processing_bases
    assert state.merge_requests <= set(state.tables), f"merge requested of unknown tables: {state.merge_requests}"
