"""View building: one build task per base tablet replica of a new view, and each node's build status per view.

Owns the `tasks`, `build_status`, `tasks_created`, `rows_done`, `task_rows`, `paused_views`, `processing_bases`,
`held_view_rows`, `holds_made` and `_view_building_term` fields of Group0State. The leader's loop changes them only through commands carrying its Raft
term (`FinishViewBuildingTasks`, `SetProcessingBases`); one from a term older than the newest seen is refused. A
worker reports the rows its running batches scanned, chunk by chunk (`RecordTaskProgress`): a view's `rows_done`
moves with them and never goes down (the rows of a batch that a move aborted stay counted; its successor's count
again). A batch that could not reach a view replica leaves that replica's rows in its node's durable outbox and says
so (`HoldViewRows`) before its task finishes; the view is built once every such hold is released (`ReleaseViewRows`:
the holder's outbox delivered them), or its holder or target was removed (the removal rebuilt what they held).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from .commands import (
    FinishViewBuildingTasks,
    HoldViewRows,
    RecordTaskProgress,
    ReleaseViewRows,
    SetProcessingBase,
    SetProcessingBases,
    SetViewPaused,
)
from .errors import InvalidArgument, NotFound, StaleTerm
from .ids import derived_id
from .schema import BUILD_STARTED, BUILD_SUCCESS, TASK_BUILD_RANGE, Replica, Table, Task

if TYPE_CHECKING:
    from .migrations import TabletTransition
    from .state import Group0State


def start_build(state: Group0State, view: Table) -> None:
    """Create the build tasks of a new view: one per replica of every tablet of its base table."""
    base_map = state.tablets[view.view.base_id]
    create_build_tasks(state, view, view.id, dict(enumerate(base_map.replicas)))


def create_build_tasks(state: Group0State, view: Table, seed: str,
                       replicas_by_tablet: Mapping[int, Sequence[Replica]], repair: bool = False) -> int:
    """One build_range task per (base tablet, replica) listed, for `view`; marks their nodes STARTED."""
    created = 0
    for tablet_id, replicas in replicas_by_tablet.items():
        for replica in replicas:
            transition = state.transitions.get((view.view.base_id, tablet_id))
            if _is_removed(transition, replica):
                continue  # base position 0 builds the view position it fed (`migrations.feeding_count`)
            task_id = derived_id(seed, view.id, tablet_id, replica.node, replica.shard)
            state.tasks[task_id] = Task(task_id, TASK_BUILD_RANGE, view.view.base_id, view.id, replica, tablet_id,
                                        aborted=_is_moving_away(transition, replica), repair=repair)
            state.build_status[(view.id, replica.node)] = BUILD_STARTED
            created += 1
    state.tasks_created[view.id] = state.tasks_created.get(view.id, 0) + created
    return created


def _is_moving_away(transition: TabletTransition | None, replica: Replica) -> bool:
    """Whether `replica` is replaced by a move (a task on it starts aborted, and follows the migration's end); the
    replica an RF increase is filled from stays, and builds."""
    return transition is not None and transition.kind == "move" and transition.leaving == replica


def _is_removed(transition: TabletTransition | None, replica: Replica) -> bool:
    """Whether `replica` is being removed by an RF decrease (it gets no writes, so it feeds no view replica)."""
    return transition is not None and transition.kind == "remove" and transition.leaving == replica


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


def abort_replica_tasks(state: Group0State, base_id: str, tablet_id: int, replica: Replica) -> int:
    """Mark aborted every task of base tablet `tablet_id` on `replica` (a migration moves it away); never undone."""
    aborted = 0
    for task in list(state.tasks.values()):
        if (task.base_id, task.tablet_id, task.replica) == (base_id, tablet_id, replica) and not task.aborted:
            state.tasks[task.id] = replace(task, aborted=True)
            aborted += 1
    return aborted


def hand_over_tasks(state: Group0State, base_id: str, tablet_id: int, removed: Replica, heir: Replica,
                    seed: str) -> int:
    """An RF decrease takes `removed` away: base position 0 (`heir`) now feeds the view position it fed, so each view
    with a task left on `removed` gets a new task (new id from `seed`) on `heir`, replacing any it had there (a batch
    of that one may have merged its rows under the old pairing, to position 0 alone)."""
    handed = 0
    for task in [t for t in state.tasks.values()
                 if (t.base_id, t.tablet_id, t.replica) == (base_id, tablet_id, removed)]:
        if task.id not in state.tasks:
            continue
        replaced = [t for t in state.tasks.values() if (t.base_id, t.tablet_id, t.view_id) ==
                    (base_id, tablet_id, task.view_id) and t.replica in (removed, heir)]
        for gone in replaced:
            del state.tasks[gone.id]
            _count_created(state, gone.view_id, -1)
        task_id = derived_id(seed, task.view_id or task.base_id, tablet_id, heir.node, heir.shard)
        state.tasks[task_id] = replace(task, id=task_id, replica=heir, aborted=False,
                                       repair=any(t.repair for t in replaced))
        _count_created(state, task.view_id, 1)
        if task.view_id is not None:
            state.build_status[(task.view_id, heir.node)] = BUILD_STARTED
        handed += 1
    return handed


def _count_created(state: Group0State, view_id: str | None, delta: int) -> None:
    if view_id in state.tasks_created:
        state.tasks_created[view_id] += delta


def recreate_aborted_tasks(state: Group0State, base_id: str, tablet_id: int, aborted_on: Replica, new_replica: Replica,
                           seed: str) -> int:
    """Replace the aborted tasks of base tablet `tablet_id` on `aborted_on` by new ones (new ids from `seed`) on
    `new_replica`; then drop the statuses of nodes left without a replica of the base and settle the rest."""
    created = 0
    for task in [t for t in state.tasks.values()
                 if t.aborted and (t.base_id, t.tablet_id, t.replica) == (base_id, tablet_id, aborted_on)]:
        del state.tasks[task.id]
        task_id = derived_id(seed, task.view_id or task.base_id, tablet_id, new_replica.node, new_replica.shard)
        state.tasks[task_id] = replace(task, id=task_id, replica=new_replica, aborted=False)
        if task.view_id is not None:
            state.build_status[(task.view_id, new_replica.node)] = BUILD_STARTED
        created += 1
    _follow_holders(state, base_id)
    return created


def _follow_holders(state: Group0State, base_id: str) -> None:
    """Drop the statuses of nodes left without a replica of the base; settle the nodes left without tasks."""
    holders = {r.node for replicas in state.tablets[base_id].replicas for r in replicas}
    for view in state.views_of(base_id):
        for key in [k for k in state.build_status if k[0] == view.id and k[1] not in holders]:
            del state.build_status[key]
    for key in unsettled_statuses(state):
        state.build_status[key] = BUILD_SUCCESS


def drop_aborted_tasks(state: Group0State, base_id: str, tablet_id: int, replica: Replica) -> None:
    """The removed replica's aborted tasks go (nothing replaces them); statuses follow the holders."""
    for task in [t for t in state.tasks.values()
                 if t.aborted and (t.base_id, t.tablet_id, t.replica) == (base_id, tablet_id, replica)]:
        del state.tasks[task.id]
        if task.view_id in state.tasks_created:
            state.tasks_created[task.view_id] -= 1
    _follow_holders(state, base_id)


def build_on_added_replica(state: Group0State, base_id: str, tablet_id: int, replica: Replica, seed: str) -> None:
    """A replica added to a base tablet builds every view of the base that is not built yet."""
    if base_id not in state.tables or state.tables[base_id].view is not None:
        return
    for view in state.views_of(base_id):
        if not is_built(state, view.id):
            create_build_tasks(state, view, seed, {tablet_id: [replica]})


def rebuild_replica(state: Group0State, base_id: str, tablet_id: int, replica: Replica, seed: str) -> None:
    """Every view of the base gets a repair task on `replica` of the tablet (built views too: they are rebuilt
    there)."""
    for view in state.views_of(base_id):
        ensure_repair_task(state, view, tablet_id, replica, seed)


def ensure_repair_task(state: Group0State, view: Table, tablet_id: int, replica: Replica, seed: str) -> None:
    """A repair task of `view` on `replica` of base tablet `tablet_id`, new (new id: the worker may have finished the
    live one it replaces, and answers a finished id at once); an aborted one becomes a repair task, and its
    migration's end recreates it there."""
    mine = [t for t in state.tasks.values() if (t.view_id, t.tablet_id, t.replica) == (view.id, tablet_id, replica)]
    if any(t.aborted for t in mine):
        for task in mine:
            state.tasks[task.id] = replace(task, repair=True)
        return
    for task in mine:
        del state.tasks[task.id]
        _count_created(state, view.id, -1)
    create_build_tasks(state, view, seed, {tablet_id: [replica]}, repair=True)


def renew_task(state: Group0State, view: Table, tablet_id: int, replica: Replica, seed: str) -> None:
    """A new live task of `view` on `replica` of base tablet `tablet_id` (new id), replacing the live one it has: a
    batch of that one may be routed without a view replica it must now feed. An aborted task is left alone (it is
    recreated when its migration ends). A repair task is renewed as one."""
    mine = [t for t in state.tasks.values() if (t.view_id, t.tablet_id, t.replica) == (view.id, tablet_id, replica)]
    if any(t.aborted for t in mine):
        return
    for task in mine:
        del state.tasks[task.id]
        _count_created(state, view.id, -1)
    create_build_tasks(state, view, seed, {tablet_id: [replica]}, repair=any(t.repair for t in mine))


def split_tasks(state: Group0State, base_id: str, seed: str) -> None:
    """Each task of tablet n of `base_id` becomes a task of 2n and one of 2n+1 (same replica, new ids)."""
    for task in [t for t in state.tasks.values() if t.base_id == base_id]:
        del state.tasks[task.id]
        for half in (2 * task.tablet_id, 2 * task.tablet_id + 1):
            _add_moved_task(state, task, half, seed)
        if task.view_id in state.tasks_created:
            state.tasks_created[task.view_id] += 1


def merge_tasks(state: Group0State, base_id: str, seed: str, halves: Sequence[Sequence[Replica]]) -> None:
    """Tasks of tablets 2n and 2n+1 of `base_id` (whose replica lists were `halves`) become one task of n per
    (view, position), on the replica now at that position (new ids).

    A task stands for the view replicas its position feeds, not for its node: 2n+1 may hold the same replicas as
    2n in another order, and its task at position p must then run on the replica the merged tablet has at p."""
    merged: dict[tuple, Task] = {}
    replicas = state.tablets[base_id].replicas
    for task in [t for t in state.tasks.values() if t.base_id == base_id]:
        del state.tasks[task.id]
        tablet = task.tablet_id // 2
        position = list(halves[task.tablet_id]).index(task.replica)
        key = (task.type, task.view_id, position, tablet)
        repair = task.repair
        if key in merged:
            _count_created(state, task.view_id, -1)
            repair |= merged[key].repair
        merged[key] = replace(task, replica=replicas[tablet][position], repair=repair)
    for (_, _, _, tablet), task in merged.items():
        _add_moved_task(state, task, tablet, seed)
        if task.view_id is not None:
            state.build_status[(task.view_id, task.replica.node)] = BUILD_STARTED
    _follow_holders(state, base_id)


def _add_moved_task(state: Group0State, task: Task, tablet_id: int, seed: str) -> None:
    task_id = derived_id(seed, task.view_id or task.base_id, tablet_id, task.replica.node, task.replica.shard)
    state.tasks[task_id] = replace(task, id=task_id, tablet_id=tablet_id)


def forget_table(state: Group0State, table_id: str) -> None:
    """Drop every task and status of a dropped table or view."""
    state.tasks_created.pop(table_id, None)
    state.rows_done.pop(table_id, None)
    state.paused_views.discard(table_id)
    for key in [k for k in state.held_view_rows if k[0] == table_id]:
        del state.held_view_rows[key]
    for task in list(state.tasks.values()):
        if table_id in (task.view_id, task.base_id):
            del state.tasks[task.id]
    for key in [k for k in state.build_status if k[0] == table_id]:
        del state.build_status[key]
    state.processing_bases = tuple(b for b in state.processing_bases if b != table_id)


def tasks_of_view(state: Group0State, view_id: str) -> Iterator[Task]:
    return (t for t in state.tasks.values() if t.view_id == view_id)


def is_built(state: Group0State, view_id: str) -> bool:
    statuses = [s for (v, _), s in state.build_status.items() if v == view_id]
    no_tasks_left = not any(True for _ in tasks_of_view(state, view_id))
    return no_tasks_left and all(s == BUILD_SUCCESS for s in statuses) and not held_view_rows(state, view_id)


def held_view_rows(state: Group0State, view_id: str) -> list[tuple[str, str]]:
    """(holder, target) of each hold of the view's rows in an outbox, in order."""
    return sorted((holder, target) for view, holder, target in state.held_view_rows if view == view_id)


def progress(state: Group0State, view_id: str) -> dict:
    remaining = sum(1 for _ in tasks_of_view(state, view_id))  # an aborted task is moving, not done
    total = state.tasks_created.get(view_id, 0)
    hosts = {node: status for (v, node), status in state.build_status.items() if v == view_id}
    return {"tasks_total": total, "tasks_done": max(total - remaining, 0), "hosts": hosts,
            "built": is_built(state, view_id), "rows_done": state.rows_done.get(view_id, 0),
            "held": held_view_rows(state, view_id)}


# -------------------------------------------------------------------- the leader loop's commands


def finish_tasks(state: Group0State, cmd: FinishViewBuildingTasks) -> int:
    """Remove the finished tasks named (absent or aborted ones are ignored) and settle build statuses."""
    check_loop_term(state, cmd.term)
    if cmd.rows_scanned and len(cmd.rows_scanned) != len(cmd.task_ids):
        raise InvalidArgument(f"rows_scanned has {len(cmd.rows_scanned)} counts for {len(cmd.task_ids)} task ids")
    rows = cmd.rows_scanned or (0,) * len(cmd.task_ids)
    removed = 0
    for task_id, scanned in zip(cmd.task_ids, rows):
        task = state.tasks.get(task_id)
        if task is not None and not task.aborted:
            _count_rows(state, task, scanned)
            del state.tasks[task_id]
            removed += 1
    for key in unsettled_statuses(state):
        state.build_status[key] = BUILD_SUCCESS
    _forget_rows_of_gone_tasks(state)
    _record_loop_term(state, cmd.term)
    return removed


def set_view_paused(state: Group0State, cmd: SetViewPaused) -> bool:
    """Pause or resume a view's build (NOT_FOUND if no such view); whether it is paused now."""
    view = state.find_table(cmd.keyspace, cmd.name)
    if view is None or view.view is None:
        raise NotFound(f"view {cmd.keyspace}.{cmd.name} does not exist")
    if cmd.paused:
        state.paused_views.add(view.id)
    else:
        state.paused_views.discard(view.id)
    return cmd.paused


def is_paused(state: Group0State, view_id: str | None) -> bool:
    return view_id in state.paused_views


def record_task_progress(state: Group0State, cmd: RecordTaskProgress) -> int:
    """Raise each running task's reported rows (never lowered) and its view's rows_done with them; the tasks
    counted (absent and aborted ones are ignored)."""
    if len(cmd.rows_scanned) != len(cmd.task_ids):
        raise InvalidArgument(f"rows_scanned has {len(cmd.rows_scanned)} counts for {len(cmd.task_ids)} task ids")
    counted = 0
    for task_id, scanned in zip(cmd.task_ids, cmd.rows_scanned):
        task = state.tasks.get(task_id)
        if task is not None and not task.aborted:
            _count_rows(state, task, scanned)
            state.task_rows[task_id] = max(state.task_rows.get(task_id, 0), scanned)
            counted += 1
    _forget_rows_of_gone_tasks(state)
    return counted


def hold_view_rows(state: Group0State, cmd: HoldViewRows) -> int:
    """Record that `holder`'s outbox holds the view's rows for each target, numbering each hold; the holds made
    (none for a dropped view or a table that is no view, nor for a holder or target removed from the cluster: their
    rows are moot)."""
    view = state.tables.get(cmd.view_id)
    if view is None or view.view is None or cmd.holder in state.removed_nodes:
        return 0
    made = 0
    for target in sorted(set(cmd.targets) - state.removed_nodes):
        state.holds_made += 1
        state.held_view_rows[(cmd.view_id, cmd.holder, target)] = state.holds_made
        made += 1
    return made


def release_view_rows(state: Group0State, cmd: ReleaseViewRows) -> bool:
    """Release a hold, unless it was made again since the holder looked at its outbox; whether it was released."""
    key = (cmd.view_id, cmd.holder, cmd.target)
    if state.held_view_rows.get(key) != cmd.hold:
        return False
    del state.held_view_rows[key]
    return True


def forget_node_holds(state: Group0State, node_id: str) -> None:
    """A removed node's holds go, both ways: its outbox is gone, or its view replicas were rebuilt elsewhere."""
    for key in [k for k in state.held_view_rows if node_id in k[1:]]:
        del state.held_view_rows[key]


def _count_rows(state: Group0State, task: Task, scanned: int) -> None:
    """Add to the view's rows_done what `scanned` adds to the rows the task reported before."""
    more = scanned - state.task_rows.get(task.id, 0)
    if more > 0 and task.view_id is not None:
        state.rows_done[task.view_id] = state.rows_done.get(task.view_id, 0) + more


def _forget_rows_of_gone_tasks(state: Group0State) -> None:
    for task_id in [t for t in state.task_rows if t not in state.tasks]:
        del state.task_rows[task_id]


def set_processing_base(state: Group0State, cmd: SetProcessingBase) -> str | None:
    """The one processing base of older releases' journals: as `set_processing_bases` of it (or of none)."""
    bases = () if cmd.base_id is None else (cmd.base_id,)
    set_processing_bases(state, SetProcessingBases(term=cmd.term, base_ids=bases, cmd_id=cmd.cmd_id))
    return cmd.base_id


def set_processing_bases(state: Group0State, cmd: SetProcessingBases) -> tuple[str, ...]:
    """Set the base tables being built; NOT_FOUND if one is not an existing base table."""
    check_loop_term(state, cmd.term)
    for base_id in cmd.base_ids:
        table = state.tables.get(base_id)
        if table is None or table.view is not None:
            raise NotFound(f"base table {base_id} does not exist")
    if len(set(cmd.base_ids)) != len(cmd.base_ids):
        raise InvalidArgument(f"a base table is named twice among the processing bases {cmd.base_ids}")
    state.processing_bases = tuple(cmd.base_ids)
    _record_loop_term(state, cmd.term)
    return state.processing_bases


def check_loop_term(state: Group0State, term: int) -> None:
    """Refuse a loop command from a term older than the newest loop term applied."""
    if term < 1:
        raise InvalidArgument(f"invalid loop term {term!r}: a leader's Raft term is a positive integer")
    newest = state.view_building_term
    if term < newest:
        raise StaleTerm(f"stale term {term}: a newer leader (term {newest}) has taken over")


def _record_loop_term(state: Group0State, term: int) -> None:
    state._view_building_term = max(state._view_building_term, term)


def unsettled_statuses(state: Group0State) -> list[tuple[str, str]]:
    """(view, node) pairs still STARTED although the node has no task of the view left."""
    holding = {(t.view_id, t.replica.node) for t in state.tasks.values()}
    return [key for key, status in state.build_status.items() if status == BUILD_STARTED and key not in holding]
