"""The view building loop's shell: runs the pure `LeaderLoop` on a thread, with the clock, jitter, ids and futures.

Each round feeds `LeaderLoop.handle` (under group0's read lock) the node's leadership and term as one pair, the
time, the pause point and the answers that arrived; batches go out through `send_batch` (a future per call),
commands are proposed synchronously with a fresh `cmd_id` and their outcomes go back in the same round. The thread
sleeps until the core's `WakeAt`, an answer, `notify_applied()` (group0's on_applied) or `wake()`.
"""
from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import Any, Protocol, TypeVar

from common.injection import Injections
from common.metrics import NodeMetrics
from coordinator.core import leader_loop as core
from coordinator.core.commands import Command
from coordinator.core.errors import CoreError, Unavailable
from coordinator.core.planner import SendBatch as Batch
from coordinator.core.schema import Replica
from coordinator.core.state import Group0State

T = TypeVar("T")

PAUSE_POINT = "coordinator_pause_main_loop"
ERROR_RETRY = 0.5  # after an unexpected error in a round (group0 unavailable, say)
PROPOSE_TIMEOUT = 5.0
PASSES_PER_ROUND = 8  # handle() calls per round while proposals come back; the rest waits for the next round


class Group0Client(Protocol):
    """What the loop uses of group0 (`coordinator.raft.Group0`, `tests.fakes.FakeGroup0`)."""

    def read(self, fn: Callable[[Group0State], T]) -> T: ...

    def propose(self, command: Command, timeout: float = ...) -> Any: ...


# send_batch(node, shard, task_ids, term, applied_index) -> a future of the worker's BatchReply
SendBatchFn = Callable[[str, int, tuple[str, ...], int, int], "Future[core.BatchReply]"]


class ViewBuildingLoop:
    """Runs `LeaderLoop` on the group0 leader; `start()`, `stop()`, `notify_applied()`, `wake()`."""

    def __init__(self, *, group0: Group0Client, leadership: Callable[[], tuple[bool, int]], send_batch: SendBatchFn,
                 applied_index: Callable[[], int], clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, injections: Injections | None = None,
                 metrics: NodeMetrics | None = None, logger: logging.Logger | None = None,
                 config: core.LoopConfig | None = None, propose_timeout: float = PROPOSE_TIMEOUT,
                 name: str = "view-building-loop"):
        self._group0, self._leadership, self._send_batch = group0, leadership, send_batch
        self._applied_index, self._clock = applied_index, clock
        self._rng = rng if rng is not None else random.Random()
        self._injections = injections if injections is not None else Injections()
        self._metrics = metrics if metrics is not None else NodeMetrics()
        self._log = logger if logger is not None else logging.getLogger(__name__)
        self._propose_timeout, self._name = propose_timeout, name
        self._core = core.LeaderLoop(config)
        self._published_counters = core.LoopCounters()
        self._cond = threading.Condition()  # guards everything below
        self._woken = self._stopping = False
        self._answers: list[core.Event] = []
        self._thread: threading.Thread | None = None
        self._rounds_done = 0
        self._pause_hit = False
        self._published: tuple[frozenset[Replica], frozenset[str]] = (frozenset(), frozenset())

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("view building loop already started")
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
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

    def in_flight(self) -> frozenset[Replica]:
        """Replicas with a call in flight at the end of the last round."""
        with self._cond:
            return self._published[0]

    def pending(self) -> frozenset[str]:
        """Finished ids not yet flushed at the end of the last round."""
        with self._cond:
            return self._published[1]

    def wait_rounds(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Wake the loop and wait until it has completed `count` more rounds (tests; False on timeout)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._rounds_done + count
            while self._rounds_done < target and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._woken = True
                self._cond.notify_all()
                self._cond.wait(remaining)
            return self._rounds_done >= target

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                self._woken = False
            try:
                deadline = self._round()
            except Exception as error:  # noqa: BLE001 - a round must not kill the loop
                self._log.warning("view building loop round failed: %s", error)
                deadline = self._clock() + ERROR_RETRY
            with self._cond:
                self._rounds_done += 1
                self._published = (frozenset(self._core.in_flight), frozenset(self._core.pending))
                self._cond.notify_all()
                while not self._stopping and not self._woken and not self._answers:
                    timeout = deadline - self._clock()
                    if timeout <= 0:
                        break
                    self._cond.wait(timeout)

    def _round(self) -> float:
        """Feed this round's events to the core and carry out what it says; when to run again at the latest."""
        self._metrics.view_building_rounds.inc()
        with self._cond:
            answers, self._answers = self._answers, []
        pause_point = self._injections.points().get(PAUSE_POINT)
        paused = pause_point is not None and pause_point.enabled
        events: list[core.Event] = [core.LeadershipChanged(*self._leadership()), *answers]
        wake_at, self._pause_hit = self._clock(), False
        for _ in range(PASSES_PER_ROUND):
            index, tick = self._applied_index(), core.Tick(self._clock(), paused)
            instructions = self._group0.read(lambda s: self._core.handle(s, tick, core.Applied(index), *events))
            events, wake_at = self._carry_out(instructions)
            if not events:
                break
        else:
            with self._cond:  # outcomes of this round's last proposals: the next round takes them first
                self._answers[:0] = events
        self._publish_counters()
        return wake_at

    def _carry_out(self, instructions: list[core.Instruction]) -> tuple[list[core.Event], float]:
        """Send, log, propose; the outcomes of the proposals (the next events) and when to wake."""
        outcomes: list[core.Event] = []
        wake_at = self._clock()
        for instruction in instructions:
            if isinstance(instruction, core.SendBatch):
                self._send(instruction)
            elif isinstance(instruction, core.ProposeCommand):
                outcomes.append(core.ProposalDone(instruction.epoch, instruction.command,
                                                  self._propose(instruction.command)))
            elif isinstance(instruction, core.Log):
                getattr(self._log, instruction.level)("%s", instruction.message)
            elif isinstance(instruction, core.DispatchPaused) and not self._pause_hit:
                self._pause_hit = True  # once a round
                self._hit_pause_point()
            else:
                wake_at = instruction.time
        return outcomes, wake_at

    def _send(self, send: core.SendBatch) -> None:
        batch = send.batch
        try:
            future = self._send_batch(batch.node, batch.shard, batch.task_ids, send.term, send.applied_index)
        except Exception as error:  # noqa: BLE001 - a failed send is a failed call
            future = Future()
            future.set_exception(error)
        future.add_done_callback(lambda f: self._answered(send.epoch, batch, f))

    def _answered(self, epoch: int, batch: Batch, future: Future) -> None:
        error = CancelledError("the call was cancelled") if future.cancelled() else future.exception()
        event = (core.BatchAnswered(epoch, batch, future.result()) if error is None else
                 core.BatchFailed(epoch, batch, str(error), self._rng.random()))
        with self._cond:
            self._answers.append(event)
            self._cond.notify_all()

    def _propose(self, command: Command) -> CoreError | None:
        """Propose with a fresh cmd_id; the typed refusal, if any (a failure to commit is `Unavailable`)."""
        try:
            outcome = self._group0.propose(dataclasses.replace(command, cmd_id=uuid.uuid4().hex),
                                           timeout=self._propose_timeout)
        except Exception as error:  # noqa: BLE001 - group0 unavailable or stopping: the core retries later
            return Unavailable(f"proposing {type(command).__name__} failed: {error}")
        return outcome.error

    def _hit_pause_point(self) -> None:
        self._injections.note_hit(PAUSE_POINT)  # counts the hit (wait_hit); spends a one-shot point

    def _publish_counters(self) -> None:
        now, before, metrics = self._core.counters, self._published_counters, self._metrics
        for name in ("batches_sent", "batch_failures", "tasks_finished", "flushes"):
            getattr(metrics, f"view_building_{name}").inc(getattr(now, name) - getattr(before, name))
        self._published_counters = dataclasses.replace(now)
