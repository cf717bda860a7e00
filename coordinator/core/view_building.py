"""View building: one build task per base tablet replica of a new view, and each node's build status per view.

Owns the `tasks`, `build_status`, `tasks_created` and `processing_base` fields of Group0State.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from .ids import derived_id
from .schema import BUILD_STARTED, BUILD_SUCCESS, TASK_BUILD_RANGE, Replica, Table, Task

if TYPE_CHECKING:
    from .state import Group0State


def start_build(state: Group0State, view: Table) -> None:
    """Create the build tasks of a new view: one per replica of every tablet of its base table."""
    base_map = state.tablets[view.view.base_id]
    create_build_tasks(state, view, view.id, dict(enumerate(base_map.replicas)))


def create_build_tasks(state: Group0State, view: Table, seed: str,
                       replicas_by_tablet: Mapping[int, Sequence[Replica]]) -> int:
    """One build_range task per (base tablet, replica) listed, for `view`; marks their nodes STARTED."""
    created = 0
    for tablet_id, replicas in replicas_by_tablet.items():
        for replica in replicas:
            task_id = derived_id(seed, view.id, tablet_id, replica.node, replica.shard)
            state.tasks[task_id] = Task(task_id, TASK_BUILD_RANGE, view.view.base_id, view.id, replica, tablet_id)
            state.build_status[(view.id, replica.node)] = BUILD_STARTED
            created += 1
    state.tasks_created[view.id] = state.tasks_created.get(view.id, 0) + created
    return created


def replicas_changed(state: Group0State, base: Table, seed: str, added: Mapping[int, Sequence[Replica]]) -> None:
    """Follow a change of `base`'s replica sets: drop tasks and statuses of lost replicas, build on added ones."""
    replicas = state.tablets[base.id].replicas
    for task in list(state.tasks.values()):
        if task.base_id == base.id and task.replica not in replicas[task.tablet_id]:
            del state.tasks[task.id]
            if task.view_id in state.tasks_created:
                state.tasks_created[task.view_id] -= 1
    holders = {r.node for tablet_replicas in replicas for r in tablet_replicas}
    for view in state.views_of(base.id):
        for key in [k for k in state.build_status if k[0] == view.id and k[1] not in holders]:
            del state.build_status[key]
        if not is_built(state, view.id):
            create_build_tasks(state, view, seed, added)


def forget_table(state: Group0State, table_id: str) -> None:
    """Drop every task and status of a dropped table or view."""
    state.tasks_created.pop(table_id, None)
    for task in list(state.tasks.values()):
        if table_id in (task.view_id, task.base_id):
            del state.tasks[task.id]
    for key in [k for k in state.build_status if k[0] == table_id]:
        del state.build_status[key]
    if state.processing_base == table_id:
        state.processing_base = None


def tasks_of_view(state: Group0State, view_id: str) -> Iterator[Task]:
    return (t for t in state.tasks.values() if t.view_id == view_id)


def is_built(state: Group0State, view_id: str) -> bool:
    statuses = [s for (v, _), s in state.build_status.items() if v == view_id]
    no_tasks_left = not any(True for _ in tasks_of_view(state, view_id))
    return no_tasks_left and all(s == BUILD_SUCCESS for s in statuses)


def progress(state: Group0State, view_id: str) -> dict:
    remaining = sum(1 for t in tasks_of_view(state, view_id) if not t.aborted)
    total = state.tasks_created.get(view_id, 0)
    hosts = {node: status for (v, node), status in state.build_status.items() if v == view_id}
    return {"tasks_total": total, "tasks_done": max(total - remaining, 0), "hosts": hosts,
            "built": is_built(state, view_id)}
