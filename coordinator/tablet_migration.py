"""The tablet migration driver's shell: the pure `MigrationLoop` on a thread, with the calls, clock, ids and metrics.

The decisions (which migrations start, each one's next step, retries, rollbacks, merges, node removals) are the core's,
`coordinator.core.migration_loop`. Each round feeds it the node's leadership and term as one pair, the time and the
results that arrived. A step (the pause point, a barrier, a stream, a cleanup) runs on a thread of its own (the core
keeps a few under way at once; a pause point that is not enabled is answered at once) and its result, with a typed
failure, comes back as an event; proposals and Raft membership changes run on the loop's thread and their outcomes go
back in the same round. The thread sleeps until the core's `WakeAt`, a step's result, `notify_applied()` (group0's
on_applied) or `wake()`. A new leader finds the transitions in group0 and resumes them at their stage: every step is
safe to run again.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from common.injection import InjectedFailure, Injections
from coordinator.core import migration_loop as core
from coordinator.core.commands import AdvanceTabletMigration, Command
from coordinator.core.errors import CoreError, StaleTerm, Unavailable
from coordinator.core.migrations import DONE, END_MIGRATION, FINAL, REVERTED
from coordinator.core.state import Group0State

T = TypeVar("T")

PAUSE_POINT = "pause_tablet_migration_stage"
DOWN_AFTER = 30.0  # a node whose barriers and calls failed this long, with no success between, is down
RETRY_DELAY = 1.0  # after a step that failed and may succeed later (a barrier a node did not confirm, say)
BARRIER_TIMEOUT = 10.0
PROPOSE_TIMEOUT = 10.0
ERROR_RETRY = 1.0  # after an unexpected error in a round (group0 unavailable, say)
PASSES_PER_ROUND = 8  # handle() calls per round while proposals come back; the rest waits for the next round

log = logging.getLogger(__name__)


class Group0Client(Protocol):
    def read(self, fn: Callable[[Group0State], T]) -> T: ...

    def propose(self, command: Command, timeout: float = ...) -> Any: ...

    def remove_member(self, raft_addr: str, timeout: float = ...) -> None: ...


@dataclass(frozen=True)
class MigrationCalls:
    """The node-to-node calls the driver makes (`common.internode.InternodeTransport` in a node)."""

    # barrier(nodes, schema_version, timeout) -> "node: why" for every node that did not confirm
    barrier: Callable[[list[str], int, float], list[str]]
    # stream(pending_node, term, migration_id, table_id, first_token, last_token, source_node, schema_version) -> rows
    stream: Callable[..., int]
    # cleanup(node, term, migration_id, table_id, first_token, last_token, schema_version) -> rows
    cleanup: Callable[..., int]


class MigrationDriver:
    """Runs `MigrationLoop` on the group0 leader; `start()`, `stop()`, `wake()`, `notify_applied()`."""

    def __init__(self, *, group0: Group0Client, leadership: Callable[[], tuple[bool, int]], calls: MigrationCalls,
                 injections: Injections | None = None, max_parallel: int = 4, metrics=None, node_id: str = "",
                 leave: Callable[[], None] = lambda: None, down_after: float = DOWN_AFTER,
                 retry_delay: float = RETRY_DELAY, clock: Callable[[], float] = time.monotonic,
                 new_id: Callable[[], str] = lambda: uuid.uuid4().hex):
        self._group0, self._leadership, self._calls = group0, leadership, calls
        self._leave = leave
        self._injections = injections if injections is not None else Injections()
        self._metrics, self._clock = metrics, clock
        config = core.MigrationConfig(down_after=down_after, max_parallel=max_parallel, retry_delay=retry_delay)
        self._core = core.MigrationLoop(config, node_id=node_id, new_id=new_id)
        self._cond = threading.Condition()  # guards everything below
        self._results: list[core.Event] = []
        self._stopping = self._woken = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tablet-migrations", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self, _applied_index: int | None = None) -> None:
        """Run a round now (also group0's on_applied: quick, never blocks on the loop)."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    notify_applied = wake

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                self._woken = False
            try:
                deadline = self._round()
            except Exception as error:  # noqa: BLE001 - a round must not kill the driver
                log.warning("tablet migration round failed: %s", error)
                deadline = self._clock() + ERROR_RETRY
            with self._cond:
                while not self._stopping and not self._woken and not self._results:
                    timeout = deadline - self._clock()
                    if timeout <= 0:
                        break
                    self._cond.wait(timeout)

    def _round(self) -> float:
        """Feed this round's events to the core and carry out what it says; when to run again at the latest."""
        with self._cond:
            results, self._results = self._results, []
        events: list[core.Event] = [core.LeadershipChanged(*self._leadership()), *results]
        wake_at = self._clock()
        for _ in range(PASSES_PER_ROUND):
            tick = core.Tick(self._clock())
            instructions = self._group0.read(lambda s: self._core.handle(s, tick, *events))
            events, wake_at = self._carry_out(instructions)
            if not events:
                break
        else:
            with self._cond:  # outcomes of this round's last proposals: the next round takes them first
                self._results[:0] = events
        return wake_at

    def _carry_out(self, instructions: list[core.Instruction]) -> tuple[list[core.Event], float]:
        """Start steps, propose, log; the outcomes known at once (the next events) and when to wake."""
        outcomes: list[core.Event] = []
        wake_at = self._clock()
        for instruction in instructions:
            if isinstance(instruction, core.WakeAt):
                wake_at = instruction.time
                continue
            outcome = self._INSTRUCTIONS[type(instruction)](self, instruction)
            if outcome is not None:
                outcomes.append(outcome)
        return outcomes, wake_at

    def _do_propose(self, instruction: core.Propose) -> core.Event:
        return core.ProposalDone(instruction.epoch, instruction.command, self._propose(instruction.command))

    def _do_remove_member(self, instruction: core.RemoveMember) -> core.Event:
        try:
            self._group0.remove_member(instruction.raft_addr, timeout=PROPOSE_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - reported to the core, which retries later
            return core.MemberRemoved(instruction.epoch, instruction.node_id, str(error) or type(error).__name__)
        return core.MemberRemoved(instruction.epoch, instruction.node_id)

    def _do_leave(self, _instruction: core.Leave) -> None:
        self._leave()

    def _do_log(self, instruction: core.Log) -> None:
        getattr(log, instruction.level)("%s", instruction.message)

    def _do_step(self, step: core.Step) -> core.Event | None:
        if isinstance(step, core.HitPausePoint) and not self._pause_point_enabled():
            return core.StepDone(step)  # nothing to wait for: no thread
        threading.Thread(target=self._run_step, args=(step,), daemon=True,
                         name=f"migration-{step.migration_id[:8]}-{step.action}").start()
        return None

    _INSTRUCTIONS = {core.Propose: _do_propose, core.RemoveMember: _do_remove_member, core.Leave: _do_leave,
                     core.Log: _do_log, core.HitPausePoint: _do_step, core.RunBarrier: _do_step,
                     core.RunStream: _do_step, core.RunCleanup: _do_step}

    # ---------------------------------------------------------------- steps (each on a thread of its own)

    def _run_step(self, step: core.Step) -> None:
        try:
            failure = self._STEPS[type(step)](self, step)
        except Exception as error:  # noqa: BLE001 - a step must not kill the driver
            failure = core.CallError(f"{type(error).__name__}: {error}")
        event = core.StepDone(step) if failure is None else core.StepFailed(step, failure)
        with self._cond:
            self._results.append(event)
            self._cond.notify_all()

    def _pause(self, _step: core.HitPausePoint) -> core.Failure | None:
        try:
            self._injections.hit(PAUSE_POINT)  # waits while the point is enabled in pause mode
        except InjectedFailure as failure:
            return core.InjectedFault(failure.message)
        return None

    def _barrier(self, step: core.RunBarrier) -> core.Failure | None:
        problems = self._calls.barrier(list(step.nodes), step.version, BARRIER_TIMEOUT)
        return core.BarrierFailure(unconfirmed_by_node(step.nodes, problems)) if problems else None

    def _stream(self, step: core.RunStream) -> core.Failure | None:
        started = self._clock()
        try:
            rows = self._calls.stream(step.pending_node, step.term, step.migration_id, step.table_id,
                                      step.first_token, step.last_token, step.source_node, step.version)
        except StaleTerm as error:
            return core.Fenced(step.pending_node, error.message)
        except CoreError as error:
            return core.StreamFailure(error.message)
        log.info("migration %s: streamed %d rows of tablet %d from %s to %s in %.2fs", step.migration_id, rows,
                 step.tablet_id, step.source_node, step.pending_node, self._clock() - started)
        return None

    def _cleanup(self, step: core.RunCleanup) -> core.Failure | None:
        try:
            self._calls.cleanup(step.node, step.term, step.migration_id, step.table_id, step.first_token,
                                step.last_token, step.version)
        except StaleTerm as error:
            return core.Fenced(step.node, error.message)
        except CoreError as error:
            return core.CleanupFailure(step.node, error.message)
        return None

    _STEPS = {core.HitPausePoint: _pause, core.RunBarrier: _barrier, core.RunStream: _stream,
              core.RunCleanup: _cleanup}

    # ---------------------------------------------------------------- helpers

    def _pause_point_enabled(self) -> bool:
        point = self._injections.points().get(PAUSE_POINT)
        return point is not None and point.enabled

    def _propose(self, command: Command) -> CoreError | None:
        """Propose with a fresh cmd_id; the typed refusal, if any (a failure to commit is `Unavailable`)."""
        try:
            outcome = self._group0.propose(dataclasses.replace(command, cmd_id=uuid.uuid4().hex),
                                           timeout=PROPOSE_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - group0 unavailable or stopping: the core retries later
            return Unavailable(f"proposing {type(command).__name__} failed: {error}")
        if outcome.ok:
            self._count(command)
        return outcome.error

    def _count(self, command: Command) -> None:
        if self._metrics is None or not isinstance(command, AdvanceTabletMigration):
            return
        self._metrics.migration_stages.labels(command.to_stage).inc()
        if command.to_stage in FINAL:
            self._metrics.migrations_ended.labels(DONE if command.to_stage == END_MIGRATION else REVERTED).inc()


def unconfirmed_by_node(nodes: tuple[str, ...], problems: list[str]) -> dict[str, str]:
    """The barrier's "node: why" answers as node -> why (the longest node id a problem starts with)."""
    unconfirmed = {}
    for problem in problems:
        node = max((n for n in nodes if problem.startswith(f"{n}: ")), key=len, default=None)
        if node is None:
            node, _, why = problem.partition(": ")
        else:
            why = problem[len(node) + 2:]
        unconfirmed[node] = why
    return unconfirmed
