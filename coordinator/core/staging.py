"""Staged bulk loads: a `process_staging` task per tablet replica that holds staged rows, and the fence between them
and tablet operations.

A bulk load into a table with views stores its rows in every replica's staging area (invisible to reads) and each
replica registers them (`RegisterStagedRows`, naming the highest staging number it holds for the tablet). A
registration makes a `process_staging` task on that replica, unless a live one already covers that number; the
leader loop sends these tasks as it sends build tasks, and the worker moves the staged rows into the base through
the write path's merge (so their view updates are derived exactly as a write's), then deletes them.

Staged rows live on the replica that staged them, so they must be in the base table before the tablet's replica set
changes: a tablet transition (move, RF change, rebuild) or a split or merge of the table does not start while the
tablet has a `process_staging` task, and a registration for a tablet in transition is refused (the loader then
writes those rows through the write path). A node declared dead loses its staging tasks with its staged rows; the
other replicas hold their own copies.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .commands import RegisterStagedRows
from .errors import FailedPrecondition, NotFound
from .ids import check_id, derived_id
from .schema import NODE_REMOVING, TASK_PROCESS_STAGING, Replica, Task

if TYPE_CHECKING:
    from .state import Group0State


def register_staged_rows(state: Group0State, cmd: RegisterStagedRows) -> str:
    """The id of the live `process_staging` task covering the replica's staged rows of the tablet up to
    `cmd.through`, made if none does. Otherwise refused (FAILED_PRECONDITION, nothing changed) when the rows must go
    through the write path instead: the table has no view, its tablets were split or merged since the rows were routed, the
    replica no longer holds the tablet, its node is being removed, or the tablet is in transition."""
    check_id(cmd.cmd_id)
    table, tablet_map = state.tables.get(cmd.base_id), state.tablets.get(cmd.base_id)
    if table is None or tablet_map is None or table.view is not None:
        raise NotFound(f"base table {cmd.base_id} does not exist")
    replica = Replica(cmd.node, cmd.shard)
    for task in staging_tasks(state, cmd.base_id, cmd.tablet_id):
        if task.replica == replica and task.staged_through >= cmd.through:
            return task.id  # a node registering its staged rows again after a restart
    why = _why_not_staged(state, table, cmd, replica)
    if why:
        raise FailedPrecondition(f"staged rows of tablet {cmd.tablet_id} of {table.qualified_name} on {replica}: {why};"
                                 " write them through the write path")
    task_id = derived_id(cmd.cmd_id, cmd.base_id, cmd.tablet_id, cmd.node, cmd.shard, cmd.through)
    state.tasks[task_id] = Task(task_id, TASK_PROCESS_STAGING, cmd.base_id, None, replica, cmd.tablet_id,
                                staged_through=cmd.through, staged_rows=cmd.rows)
    return task_id


def _why_not_staged(state: Group0State, table, cmd: RegisterStagedRows, replica: Replica) -> str | None:
    tablet_map = state.tablets[cmd.base_id]
    if not any(True for _ in state.views_of(cmd.base_id)):
        return "the table has no view"
    if cmd.tablet_count != tablet_map.tablet_count:
        return f"the table has {tablet_map.tablet_count} tablets now, not {cmd.tablet_count}"
    if not 0 <= cmd.tablet_id < tablet_map.tablet_count or replica not in tablet_map.replicas[cmd.tablet_id]:
        return "not a replica of the tablet"
    if cmd.node in state.removed_nodes or state.nodes.get(cmd.node) is None or \
            state.nodes[cmd.node].state == NODE_REMOVING:
        return "its node is being removed"
    transition = state.transitions.get((cmd.base_id, cmd.tablet_id))
    if transition is not None:
        return f"the tablet is in transition (migration {transition.migration_id})"
    return None


def staging_tasks(state: Group0State, base_id: str, tablet_id: int | None = None) -> list[Task]:
    """The `process_staging` tasks of a table (of one tablet when named), in task table order."""
    return [t for t in state.tasks.values() if t.type == TASK_PROCESS_STAGING and t.base_id == base_id
            and (tablet_id is None or t.tablet_id == tablet_id)]


def check_no_staging(state: Group0State, base_id: str, tablet_id: int | None, what: str) -> None:
    """Refuse (FAILED_PRECONDITION) a tablet operation while the tablet (any tablet, for None) has staged rows to
    process: they must reach its base rows before its replicas change."""
    waiting = staging_tasks(state, base_id, tablet_id)
    if waiting:
        name = state.tables[base_id].qualified_name if base_id in state.tables else base_id
        replicas = ", ".join(sorted({f"{t.replica} (tablet {t.tablet_id})" for t in waiting}))
        raise FailedPrecondition(f"{what} of {name} waits for staged rows of a bulk load to be processed on "
                                 f"{replicas}; retry once they are")


def forget_node_staging(state: Group0State, node_id: str) -> None:
    """A node declared dead takes its staged rows with it: its staging tasks go (other replicas hold copies)."""
    for task in [t for t in state.tasks.values() if t.type == TASK_PROCESS_STAGING and t.replica.node == node_id]:
        del state.tasks[task.id]
