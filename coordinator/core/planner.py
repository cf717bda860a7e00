"""Pure decisions of the view building leader loop: replicated state and loop events in, RPCs and commands out.

The leader loop's state machine (`coordinator/core/leader_loop.py`) asks these functions what to do; they read
the group0 state and never change it.

- `plan_dispatch(state, term, busy, live_nodes, finished, queues=None, last_base=None) -> Plan`, asked whenever
  the loop handles events (a command applied, an RPC answered or failed, a backoff ran out): send every
  `SendBatch` as `WorkOnViewBuildingTasks`, propose every command (not re-proposing one still in flight). `busy`
  holds the replicas with a call in flight *or waiting out a retry backoff* (`RetrySchedule.waiting`). `queues`
  are `replica_queues(state, state.processing_bases)`: a function of the state alone, so the loop computes them
  once per applied group0 index (one pass over the task table) and reuses them while only calls finish.
  `last_base` is the loop's memory of the base each replica's last batch came from.
- `plan_flush(state, term, finished) -> FinishViewBuildingTasks | None`, asked at most every flush interval
  (~200 ms) while finished ids wait: the one command removing the finished tasks the loop holds. The loop
  keeps only `pending_finished(...)` of them.
- Both plan nothing for a loop whose term is older than group0's newest loop term (`is_deposed`).

Commands come out with `cmd_id` None; the loop gives each a fresh id before proposing it.

Processing bases: up to the cluster's `parallel_bases` base tables at a time (2 by default; `vbc build config
--parallel-bases N`), persisted in group0, so a small table's new index does not wait hours behind a big table's
view. The bases kept are those that still have a live task (live: a non-aborted `build_range` task of a view whose
build is not paused), in the order they were chosen; free places go to the bases of the oldest live tasks (group0's
task table keeps creation order, so views are built in the order they were created). A base is kept while it has
live tasks, even if they all wait for dead nodes. The first command of a loop in a new term is
`SetProcessingBases` (with the bases it would choose anyway): it records the term, fencing older loops.

A live task whose base replica feeds a view position that an RF increase has not added to the view yet waits
(`migrations.view_replica_missing`): it is not sent until the view tablets have that replica.

Batch of a replica: the live tasks of one processing base on that (node, shard), of its lowest tablet id, one
per view (the smallest task id of each view), ids sorted; tasks the loop holds as finished are never sent again.
A replica's `process_staging` tasks (`coordinator.core.staging`) go first, whatever the processing bases: every task of
its first (base, tablet) in one batch. A replica's build batches take the processing bases in turn (the one after the base of its last batch that has tasks
there), so every base being built makes progress on a replica that holds several. Every alive replica that is not
busy and has such tasks gets one batch, so every shard of every node works in parallel.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from .commands import Command, FinishViewBuildingTasks, SetProcessingBases
from .migrations import fewest_view_replicas, view_replica_missing
from .schema import TASK_BUILD_RANGE, TASK_PROCESS_STAGING, Replica, Task
from .view_building import is_paused, unsettled_statuses

if TYPE_CHECKING:
    from .state import Group0State

FLUSH_LIMIT = 4096  # task ids per FinishViewBuildingTasks command (the rest go in the next flush)


@dataclass(frozen=True)
class SendBatch:
    """Send `WorkOnViewBuildingTasks(term, shard, task_ids)` to `node`."""

    node: str
    shard: int
    task_ids: tuple[str, ...]

    @property
    def replica(self) -> Replica:
        return Replica(self.node, self.shard)


@dataclass(frozen=True)
class Plan:
    """What the loop does now: RPCs to send and group0 commands to propose."""

    batches: tuple[SendBatch, ...] = ()
    commands: tuple[Command, ...] = ()


# -------------------------------------------------------------------- dispatch and flush


def plan_dispatch(state: Group0State, term: int, busy: Set[Replica], live_nodes: Set[str],
                  finished: Set[str], queues: ReplicaQueues | None = None,
                  last_base: Mapping[Replica, str] | None = None) -> Plan:
    """The batches to send and the processing-bases command to propose, for a loop of Raft `term`. `last_base`:
    the base of the batch last sent to each replica (the next one comes from the next base that has tasks there)."""
    if is_deposed(state, term):
        return Plan()
    if queues is None:
        queues = replica_queues(state, state.processing_bases)
    idle = [r for r in sorted(queues) if r not in busy and r.node in live_nodes]
    batches = tuple(SendBatch(r.node, r.shard, ids) for r in idle
                    if (ids := _next_batch_of(queues[r], state.processing_bases, (last_base or {}).get(r), finished)))
    return Plan(batches=batches, commands=_processing_base_commands(state, term))


def _next_batch_of(queues: Mapping[str, tuple[Task, ...]], bases: Sequence[str], last: str | None,
                   finished: Set[str]) -> tuple[str, ...]:
    """The next batch of a replica: its staged rows first (a bulk load waits for them), then from the first base
    after `last` (in `bases` order, round) that has one."""
    staged = next_staging_batch(queues.get(STAGING, ()), finished)
    if staged:
        return staged
    for base in rotated(bases, last):
        ids = next_batch(queues.get(base, ()), finished)
        if ids:
            return ids
    return ()


def rotated(bases: Sequence[str], last: str | None) -> list[str]:
    """`bases` starting after `last` (all of them in order when `last` is not among them)."""
    if last not in bases:
        return list(bases)
    after = list(bases).index(last) + 1
    return list(bases[after:]) + list(bases[:after])


def plan_flush(state: Group0State, term: int, finished: Set[str],
               rows_scanned: Mapping[str, int] | None = None) -> FinishViewBuildingTasks | None:
    """The command removing the finished tasks group0 still holds (or settling statuses); None if nothing to do.

    `rows_scanned` maps a finished id to the base rows its batch scanned (missing ids count 0)."""
    if is_deposed(state, term):
        return None
    ids = tuple(sorted(pending_finished(state, finished)))[:FLUSH_LIMIT]
    if not ids and not unsettled_statuses(state):
        return None
    rows = tuple((rows_scanned or {}).get(i, 0) for i in ids)
    return FinishViewBuildingTasks(term=term, task_ids=ids, rows_scanned=rows if any(rows) else (), cmd_id=None)


def pending_finished(state: Group0State, finished: Iterable[str]) -> frozenset[str]:
    """The finished ids still worth removing: tasks group0 holds and has not aborted (the loop forgets the rest)."""
    return frozenset(i for i in finished if i in state.tasks and not state.tasks[i].aborted)


def is_deposed(state: Group0State, term: int) -> bool:
    """True when a loop of a newer term has had a command applied: this loop's commands would be refused."""
    return state.view_building_term > term


# -------------------------------------------------------------------- processing base


def is_live(task: Task) -> bool:
    """A task the loop may send: a non-aborted build_range task."""
    return task.type == TASK_BUILD_RANGE and not task.aborted


def is_sendable(state: Group0State, task: Task) -> bool:
    """A live task of a view whose build is not paused."""
    return is_live(task) and not is_paused(state, task.view_id)


def has_live_tasks(state: Group0State, base_id: str | None) -> bool:
    return base_id is not None and any(t.base_id == base_id and is_sendable(state, t) for t in state.tasks.values())


def choose_processing_bases(state: Group0State) -> tuple[str, ...]:
    """The bases being built that still have live tasks, then the bases of the oldest live tasks, up to the
    cluster's `parallel_bases`; tasks of paused views do not count, so a paused view holds no other table back."""
    limit = state.build_settings.parallel_bases
    chosen = [b for b in state.processing_bases if has_live_tasks(state, b)][:limit]
    for task in state.tasks.values():
        if len(chosen) >= limit:
            break
        if task.base_id not in chosen and is_sendable(state, task):
            chosen.append(task.base_id)
    return tuple(chosen)


def _processing_base_commands(state: Group0State, term: int) -> tuple[Command, ...]:
    wanted = choose_processing_bases(state)
    if wanted == state.processing_bases and state.view_building_term >= term:
        return ()
    return (SetProcessingBases(term=term, base_ids=wanted, cmd_id=None),)


# -------------------------------------------------------------------- batches


ReplicaQueues = Mapping[Replica, Mapping[str, tuple[Task, ...]]]
STAGING = "staging"  # the key of a replica's process_staging tasks in its queues (no table id looks like it)


def replica_queues(state: Group0State, base_ids: Sequence[str]) -> dict[Replica, dict[str, tuple[Task, ...]]]:
    """Every replica's live tasks of each base in `base_ids`, in dispatch order: by tablet id, then task id; and
    under `STAGING` its `process_staging` tasks of every base, by base, tablet id and task id."""
    by_replica: dict[Replica, dict[str, list[Task]]] = {}
    for task in state.tasks.values():
        if task.type == TASK_PROCESS_STAGING and not task.aborted:
            by_replica.setdefault(task.replica, {}).setdefault(STAGING, []).append(task)
    fewest = {view.id: fewest_view_replicas(state, view.id) for base_id in base_ids
              for view in state.views_of(base_id) if view.id in state.tablets}
    for task in state.tasks.values():
        if task.base_id in base_ids and is_sendable(state, task) and \
                view_replica_missing(state, task, fewest) is None:
            by_replica.setdefault(task.replica, {}).setdefault(task.base_id, []).append(task)
    return {replica: {base: tuple(sorted(tasks, key=lambda t: (t.base_id, t.tablet_id, t.id)))
                      for base, tasks in queues.items()}
            for replica, queues in by_replica.items()}


def next_staging_batch(queue: Iterable[Task], finished: Set[str] = frozenset()) -> tuple[str, ...]:
    """From one replica's `STAGING` queue: every unfinished task of its first (base, tablet), as sorted ids (one
    pass over the staged rows serves them all)."""
    first: tuple[str, int] | None = None
    chosen = []
    for task in queue:
        if task.id in finished:
            continue
        if first is None:
            first = (task.base_id, task.tablet_id)
        elif (task.base_id, task.tablet_id) != first:
            break
        chosen.append(task.id)
    return tuple(sorted(chosen))


def next_batch(queue: Iterable[Task], finished: Set[str] = frozenset()) -> tuple[str, ...]:
    """From one replica's queue (`replica_queues` order): the tasks not in `finished` of the lowest tablet id,
    one per view (the smallest id of each), as sorted ids; () when every task is finished."""
    tablet: int | None = None
    chosen: dict[str | None, str] = {}
    for task in queue:
        if task.id in finished:
            continue
        if tablet is None:
            tablet = task.tablet_id
        elif task.tablet_id != tablet:
            break
        chosen.setdefault(task.view_id, task.id)
    return tuple(sorted(chosen.values()))


# -------------------------------------------------------------------- retries and log rate


@dataclass(frozen=True)
class Backoff:
    """Exponential retry delays: `initial` seconds after the first failure, times `factor` each time, at most
    `maximum`."""

    initial: float = 0.1
    factor: float = 2.0
    maximum: float = 5.0

    def delay(self, attempt: int, jitter: float = 0.0) -> float:
        """Seconds to wait after failure number `attempt` (1, 2, ...); `jitter` in [0, 1), drawn by the caller,
        takes off up to half of it so that retries of many callers spread out."""
        exponent = max(attempt, 1) - 1
        raw = self.maximum if exponent >= 64 else min(self.maximum, self.initial * self.factor ** exponent)
        return raw * (1.0 - 0.5 * min(max(jitter, 0.0), 1.0))


@dataclass
class RetrySchedule:
    """Consecutive failures per key (a replica, say) and when each key may be tried again; the caller passes
    the clock (`now`, in seconds) and any jitter."""

    policy: Backoff = field(default_factory=Backoff)
    _attempts: dict[Hashable, int] = field(default_factory=dict)
    _not_before: dict[Hashable, float] = field(default_factory=dict)

    def failed(self, key: Hashable, now: float, jitter: float = 0.0) -> float:
        """Count a failure of `key`; the delay before it may be tried again."""
        self._attempts[key] = self._attempts.get(key, 0) + 1
        delay = self.policy.delay(self._attempts[key], jitter)
        self._not_before[key] = now + delay
        return delay

    def succeeded(self, key: Hashable) -> None:
        self._attempts.pop(key, None)
        self._not_before.pop(key, None)

    def attempts(self, key: Hashable) -> int:
        return self._attempts.get(key, 0)

    def waiting(self, now: float) -> frozenset:
        """The keys that may not be tried yet."""
        return frozenset(k for k, at in self._not_before.items() if at > now)

    def next_wakeup(self, now: float) -> float | None:
        """When the earliest waiting key may be tried again (None if none waits)."""
        return min((at for at in self._not_before.values() if at > now), default=None)


class LogDecision(NamedTuple):
    emit: bool
    suppressed: int  # messages held back since the last one emitted (to mention when emitting)


@dataclass
class LogLimiter:
    """At most one message per `interval` seconds; the caller passes the clock."""

    interval: float = 1.0
    _last: float | None = None
    _suppressed: int = 0

    def decide(self, now: float) -> LogDecision:
        """Whether to log a message at `now`, and how many were held back before it."""
        if self._last is not None and now - self._last < self.interval:
            self._suppressed += 1
            return LogDecision(False, self._suppressed)
        held_back, self._suppressed, self._last = self._suppressed, 0, now
        return LogDecision(True, held_back)
