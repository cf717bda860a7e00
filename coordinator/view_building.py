"""The view building loop: the thin adapter that drives the pure planner (`coordinator/core/planner.py`) on
the group0 leader.

It owns what the planner does not: a thread, the clock, jitter, the calls in flight, the finished ids not yet
flushed, retry bookkeeping, metrics and logging. It takes narrow callables only (no Node), so tests drive it
with an in-process group0 and a fake `send_batch`.

Behaviour, each round (the thread wakes on `notify_applied()` — wired to group0's on_applied —, on an RPC
completion, on `wake()`, or at the next deadline: the next flush, the next retry, the next leadership or pause
re-check; there is no fixed polling sleep for synchronisation):

- Not leader, or the Raft term changed since the last round: forget every call in flight (their late replies
  carry an old epoch and are ignored), the finished ids not yet flushed and the retry schedule. A new loop
  (here or on another node) picks up from the replicated state alone: tasks not removed are sent again and the
  worker answers finished ones from its ledger.
- Completions: a batch's finished ids (only ids of that batch are trusted) join the pending set and the
  replica's retry count is reset; a failure (exception from the future or from `send_batch` itself) puts the
  replica into `RetrySchedule` with jitter from `rng`, logged at most about once a second (`LogLimiter`).
- Flush: when finished ids are pending, at most every `flush_interval` seconds (~200 ms), `plan_flush` →
  propose `FinishViewBuildingTasks`; then keep only `pending_finished(...)` (flushed ids are gone from
  group0). With nothing pending, `plan_flush` is still asked (cheap) so that unsettled STARTED statuses get
  their SUCCESS.
- Dispatch, unless the injection point `coordinator_pause_main_loop` is enabled (then nothing is sent and no
  processing-base command is proposed; completions and flushes go on; the loop re-checks the point every
  `pause_recheck` seconds, or at once on `wake()`): `plan_dispatch` with busy = in flight ∪ waiting out a
  retry backoff, and live nodes = every registered node (a failing node is kept out by its replicas'
  backoff, not by a liveness guess). The plan's commands are proposed with a fresh `cmd_id` (uuid4), its
  batches sent with the current term and this node's applied group0 index.
- A "stale term" refusal of a loop command, or a plan with `deposed`, means a newer leader's loop took over:
  this loop stops dispatching and flushing until the term changes.

Proposals run synchronously on the loop thread (so a command is never re-proposed while one is in flight).
"""
from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from common.injection import InjectedFailure, Injections
from common.metrics import NodeMetrics
from coordinator.core.commands import Command
from coordinator.core.leader_loop import BatchReply
from coordinator.core.planner import (
    Backoff,
    LogLimiter,
    ReplicaQueues,
    RetrySchedule,
    SendBatch,
    pending_finished,
    plan_dispatch,
    plan_flush,
    replica_queues,
)
from coordinator.core.schema import Replica
from coordinator.core.state import Group0State

T = TypeVar("T")

PAUSE_POINT = "coordinator_pause_main_loop"
FLUSH_INTERVAL = 0.2
LEADER_RECHECK = 0.5  # seconds between leadership checks when nothing else wakes the loop
PAUSE_RECHECK = 0.1
ERROR_RETRY = 0.5  # after an unexpected error in a round (group0 unavailable, say)
PROPOSE_TIMEOUT = 5.0


class Group0Client(Protocol):
    """What the loop uses of group0 (`coordinator.raft.Group0`, `tests.fakes.FakeGroup0`)."""

    def read(self, fn: Callable[[Group0State], T]) -> T: ...

    def propose(self, command: Command, timeout: float = ...) -> Any: ...


# send_batch(node, shard, task_ids, term, applied_index) -> a future of the worker's BatchReply
SendBatchFn = Callable[[str, int, tuple[str, ...], int, int], "Future[BatchReply]"]


@dataclasses.dataclass
class _InFlight:
    epoch: int
    batch: SendBatch


class ViewBuildingLoop:
    """Drives `plan_dispatch`/`plan_flush` on the group0 leader; `start()`, `stop()`, `notify_applied()`."""

    def __init__(self, *, group0: Group0Client, term: Callable[[], int], is_leader: Callable[[], bool],
                 send_batch: SendBatchFn, applied_index: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 injections: Injections | None = None, metrics: NodeMetrics | None = None,
                 logger: logging.Logger | None = None, backoff: Backoff | None = None,
                 flush_interval: float = FLUSH_INTERVAL, leader_recheck: float = LEADER_RECHECK,
                 pause_recheck: float = PAUSE_RECHECK, propose_timeout: float = PROPOSE_TIMEOUT,
                 name: str = "view-building-loop"):
        self._group0 = group0
        self._term_fn = term
        self._is_leader = is_leader
        self._send_batch = send_batch
        self._applied_index = applied_index
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._injections = injections if injections is not None else Injections()
        self._metrics = metrics if metrics is not None else NodeMetrics()
        self._log = logger if logger is not None else logging.getLogger(__name__)
        self._backoff = backoff if backoff is not None else Backoff()
        self._flush_interval = flush_interval
        self._leader_recheck = leader_recheck
        self._pause_recheck = pause_recheck
        self._propose_timeout = propose_timeout
        self._name = name

        self._cond = threading.Condition()  # guards _woken, _stopping, _completions
        self._woken = False
        self._stopping = False
        self._completions: list[tuple[int, Replica, SendBatch, Future]] = []
        self._thread: threading.Thread | None = None
        self._rounds_done = 0
        self._published: tuple[frozenset[Replica], frozenset[str]] = (frozenset(), frozenset())

        # loop-thread state
        self._epoch = 0
        self._term: int | None = None  # the term the bookkeeping below belongs to (None: not leader)
        self._deposed = False
        self._in_flight: dict[Replica, _InFlight] = {}
        self._pending: set[str] = set()
        self._rows_scanned: dict[str, int] = {}  # finished id -> base rows its batch scanned (for rows_done)
        self._next_flush: float | None = None
        self._retry = RetrySchedule(self._backoff)
        self._warn_limiter = LogLimiter()
        self._queues: tuple[int, ReplicaQueues] | None = None  # (group0 applied index, replica_queues then)
        self._settled_at: int | None = None  # the applied index at which a flush last found nothing to do

    # ---------------------------------------------------------------- lifecycle and wake-ups

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

    def notify_applied(self, index: int | None = None) -> None:
        """group0 applied a command (called from group0's on_applied: quick, never blocks on the loop)."""
        self.wake()

    def wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    # ---------------------------------------------------------------- introspection (tests, status)

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
                self._warn("view building loop round failed: %s", error)
                deadline = self._clock() + ERROR_RETRY
            with self._cond:
                self._rounds_done += 1
                self._published = (frozenset(self._in_flight), frozenset(self._pending))
                self._cond.notify_all()
                while not self._stopping and not self._woken and not self._completions:
                    timeout = None if deadline is None else deadline - self._clock()
                    if timeout is not None and timeout <= 0:
                        break
                    self._cond.wait(timeout)

    def _round(self) -> float | None:
        """One round; returns when the loop must run again at the latest (None: only when woken)."""
        self._metrics.view_building_rounds.inc()
        now = self._clock()
        if not self._is_leader():
            if self._term is not None:
                self._log.info("view building loop: not the group0 leader any more (term %s)", self._term)
                self._reset(None)
            self._take_completions()  # drop late replies of the old epoch
            return now + self._leader_recheck
        term = self._term_fn()
        if term != self._term:
            self._log.info("view building loop: leading in term %d", term)
            self._reset(term)
        self._handle_completions(now)
        if self._deposed:
            return now + self._leader_recheck
        self._flush(now)
        paused = False
        if not self._deposed:
            paused = self._dispatch_paused()
            if not paused:
                self._dispatch(term, now)
        deadlines = [self._retry.next_wakeup(self._clock())]
        if self._pending:
            deadlines.append(self._next_flush)
        if paused:
            deadlines.append(now + self._pause_recheck)
        if self._deposed:
            deadlines.append(now + self._leader_recheck)
        return min((d for d in deadlines if d is not None), default=None)

    def _reset(self, term: int | None) -> None:
        """Forget the bookkeeping of the previous term: late replies to its calls are ignored from now on."""
        self._epoch += 1
        self._term = term
        self._deposed = False
        self._in_flight.clear()
        self._pending.clear()
        self._rows_scanned.clear()
        self._next_flush = None
        self._retry = RetrySchedule(self._backoff)
        self._queues = None
        self._settled_at = None

    # ---------------------------------------------------------------- completions

    def _on_done(self, epoch: int, replica: Replica, batch: SendBatch, future: Future) -> None:
        with self._cond:
            self._completions.append((epoch, replica, batch, future))
            self._cond.notify_all()

    def _take_completions(self) -> list[tuple[int, Replica, SendBatch, Future]]:
        with self._cond:
            done, self._completions = self._completions, []
        return done

    def _handle_completions(self, now: float) -> None:
        for epoch, replica, batch, future in self._take_completions():
            if epoch != self._epoch:
                continue  # a reply to a call of an older term (or leadership): ignored
            current = self._in_flight.get(replica)
            if current is not None and current.batch == batch:
                del self._in_flight[replica]
            error = future.exception()
            if error is not None:
                self._metrics.view_building_batch_failures.inc()
                delay = self._retry.failed(replica, now, self._rng.random())
                self._warn("view building batch %s on %s/%d failed (attempt %d, retry in %.2fs): %s",
                           ",".join(batch.task_ids), replica.node, replica.shard, self._retry.attempts(replica),
                           delay, error)
                continue
            self._retry.succeeded(replica)
            reply = future.result()
            finished = set(reply.finished) & set(batch.task_ids)
            rows = reply.rows_of()
            for task_id in finished - self._pending:
                self._rows_scanned[task_id] = rows.get(task_id, 0)
            self._metrics.view_building_tasks_finished.inc(len(finished - self._pending))
            if finished and not self._pending:
                self._next_flush = now + self._flush_interval
            self._pending |= finished

    # ---------------------------------------------------------------- flush and dispatch

    def _flush(self, now: float) -> None:
        term = self._term
        if self._pending and self._next_flush is not None and now < self._next_flush:
            return
        index = self._applied_index()
        if not self._pending and self._settled_at == index:
            return  # nothing finished and the state unchanged since the last flush found nothing to settle
        command = self._group0.read(lambda s: plan_flush(s, term, self._pending, self._rows_scanned))
        self._settled_at = index if command is None and not self._pending else None
        if command is not None and self._propose(command):
            self._metrics.view_building_flushes.inc()
        self._pending = set(self._group0.read(lambda s: pending_finished(s, self._pending)))
        self._rows_scanned = {i: n for i, n in self._rows_scanned.items() if i in self._pending}
        if command is None:
            return
        self._next_flush = self._clock() + self._flush_interval if self._pending else None

    def _dispatch_paused(self) -> bool:
        point = self._injections.points().get(PAUSE_POINT)
        if point is None or not point.enabled:
            return False
        if point.mode == "fail":  # counts the hit (wait_hit) and spends a one-shot point; never blocks here
            try:
                self._injections.hit(PAUSE_POINT)
            except InjectedFailure:
                pass
        return True

    def _replica_queues(self, state: Group0State, index: int) -> ReplicaQueues:
        """`replica_queues` of the processing base, computed once per group0 applied index.

        `index` is read before the state is: the state may be newer than it (then the next round misses the
        cache), never older."""
        if self._queues is None or self._queues[0] != index:
            self._queues = (index, replica_queues(state, state.processing_base))
        return self._queues[1]

    def _dispatch(self, term: int, now: float) -> None:
        index = self._applied_index()
        busy = frozenset(self._in_flight) | self._retry.waiting(now)
        pending = frozenset(self._pending)
        plan = self._group0.read(lambda s: plan_dispatch(s, term, busy, frozenset(s.nodes), pending,
                                                          self._replica_queues(s, index)))
        if plan.deposed:
            self._deposed_by_newer(term)
            return
        for command in plan.commands:
            if not self._propose(command):
                return
        if plan.commands:
            self.wake()  # plan again against the state the commands produced
        for batch in plan.batches:
            self._send(term, batch)

    def _send(self, term: int, batch: SendBatch) -> None:
        replica = batch.replica
        epoch = self._epoch
        self._in_flight[replica] = _InFlight(epoch, batch)
        self._metrics.view_building_batches_sent.inc()
        try:
            future = self._send_batch(batch.node, batch.shard, batch.task_ids, term, self._applied_index())
        except Exception as error:  # noqa: BLE001 - a failed send is a failed call
            future = Future()
            future.set_exception(error)
        future.add_done_callback(lambda f: self._on_done(epoch, replica, batch, f))

    def _propose(self, command: Command) -> bool:
        """Propose with a fresh cmd_id; False when refused (a stale term marks this loop deposed)."""
        outcome = self._group0.propose(dataclasses.replace(command, cmd_id=uuid.uuid4().hex),
                                       timeout=self._propose_timeout)
        if getattr(outcome, "ok", True):
            return True
        message = getattr(outcome, "error_message", "") or ""
        if getattr(outcome, "error_code", None) == "FAILED_PRECONDITION" and "stale term" in message:
            self._deposed_by_newer(self._term)
        else:
            self._warn("view building command %s refused: %s %s", type(command).__name__,
                       getattr(outcome, "error_code", None), message)
        return False

    def _deposed_by_newer(self, term: int | None) -> None:
        if not self._deposed:
            self._log.info("view building loop of term %s: a newer leader's loop took over; stopping", term)
        self._deposed = True
        self._epoch += 1  # replies to this loop's calls are ignored from now on
        self._in_flight.clear()
        self._pending.clear()
        self._rows_scanned.clear()

    def _warn(self, message: str, *args: object) -> None:
        decision = self._warn_limiter.decide(self._clock())
        if decision.emit:
            if decision.suppressed:
                message += f" ({decision.suppressed} similar warnings suppressed)"
            self._log.warning(message, *args)
