"""Named fault-injection points that tests switch on a running node (fail or pause when hit)."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from coordinator.core.errors import Unavailable

FAIL, PAUSE = "fail", "pause"
MODES = (FAIL, PAUSE)


@dataclass(frozen=True)
class PointSpec:
    """Where the code hits a point, and the mode `enable` uses when given none (it follows the point's name)."""
    description: str
    default_mode: str


# Every point the node code hits; enabling an unknown name is refused so typos do not pass silently.
KNOWN_POINTS = {
    "write.coordinator.before_send": PointSpec("the coordinating node, before sending a write to the replicas", FAIL),
    "write.replica.before_apply": PointSpec("a base replica, before applying a write", FAIL),
    "write.replica.after_apply": PointSpec(
        "a base replica, after applying a write and before sending view updates", FAIL),
    "view_update.before_send": PointSpec("a base replica, before sending view updates to a paired view replica", FAIL),
    "view_update.receive": PointSpec("a view replica, when view updates arrive", FAIL),
    "view_rows.receive": PointSpec("a view replica, when view rows of a view building batch arrive", FAIL),
    "read.replica.scan": PointSpec("a replica, when serving a scan", PAUSE),
    "ddl.before_propose": PointSpec("a node, before proposing a schema change to Raft", FAIL),
    "worker.work_on_tasks": PointSpec("the view building worker, when a batch of tasks arrives", FAIL),
    "coordinator_pause_main_loop": PointSpec(
        "the view building loop on the group0 leader: while enabled it dispatches nothing", PAUSE),
    "worker_pause_build_range": PointSpec("a view building batch, before it scans its tablet replica", PAUSE),
    "worker_pause_process_staging": PointSpec(
        "a process_staging batch, before it moves its tablet replica's staged rows into the base", PAUSE),
    "worker_fail_build_range": PointSpec(
        "a view building batch, before it scans (fail mode: the batch fails)", FAIL),
    "worker_pause_after_chunk": PointSpec(
        "a chunked view building batch, after a chunk's view rows are applied and its checkpoint recorded", PAUSE),
    "worker_pause_before_finish": PointSpec(
        "a view building batch whose view rows are applied, before it is recorded finished", PAUSE),
    "stream_tablet_fail": PointSpec(
        "a pending replica streaming a tablet, before it merges each window of rows (fail mode: the stream fails)",
        FAIL),
    "pause_tablet_migration_stage": PointSpec(
        "the group0 leader's tablet migration driver, between the stages of a migration", PAUSE),
}


def default_mode(name: str) -> str:
    """The mode `name` is enabled in when no mode is given; "" for a point this code does not know."""
    spec = KNOWN_POINTS.get(name)
    return spec.default_mode if spec else ""


class InjectedFailure(Unavailable):
    """Raised at an enabled `fail` point; maps to UNAVAILABLE so clients retry like a real fault."""


@dataclass
class _Point:
    mode: str = FAIL
    one_shot: bool = False
    enabled: bool = False
    hits: int = 0
    spent: bool = False  # a one-shot pause point already paused once; it lets later hits pass


class Injections:
    """The registry of one node; `hit(name)` is called by the code at each point."""

    def __init__(self) -> None:
        self._points = {name: _Point(mode=spec.default_mode) for name, spec in KNOWN_POINTS.items()}
        self._changed = threading.Condition()

    def enable(self, name: str, mode: str | None = None, one_shot: bool = False) -> None:
        """Switch `name` on in `mode`; None or "" means the point's default mode."""
        self._check(name)
        mode = mode or KNOWN_POINTS[name].default_mode
        if mode not in MODES:
            raise ValueError(f"unknown injection mode {mode!r} for {name!r}; use 'fail' or 'pause' "
                             f"(or none: the point's default, {KNOWN_POINTS[name].default_mode!r})")
        with self._changed:
            self._points[name] = _Point(mode=mode, one_shot=one_shot, enabled=True)
            self._changed.notify_all()

    def disable(self, name: str) -> None:
        self._check(name)
        with self._changed:
            self._points[name].enabled = False
            self._changed.notify_all()

    def wait_hit(self, name: str, timeout: float) -> bool:
        """True once `name` has been hit at least once since it was enabled."""
        self._check(name)
        with self._changed:
            return self._changed.wait_for(lambda: self._points[name].hits > 0, timeout=timeout)

    def points(self) -> dict[str, _Point]:
        with self._changed:
            return {name: _Point(p.mode, p.one_shot, p.enabled, p.hits, p.spent) for name, p in self._points.items()}

    def disable_all(self) -> None:
        """Disable every point, releasing paused threads (used when the node stops)."""
        with self._changed:
            for point in self._points.values():
                point.enabled = False
            self._changed.notify_all()

    def hit(self, name: str) -> None:
        with self._changed:
            point = self._points[name]
            if not point.enabled or point.spent:
                return
            point.hits += 1
            self._changed.notify_all()
            if point.mode == PAUSE:
                point.spent = point.one_shot
                self._changed.wait_for(lambda: not point.enabled or self._points[name] is not point)
                return
            if point.one_shot:
                point.enabled = False
        raise InjectedFailure(f"injected failure at {name!r} ({KNOWN_POINTS[name].description})")

    def note_hit(self, name: str) -> None:
        """Count a hit of an enabled point, whatever its mode, without pausing or failing here: for a caller that
        holds its work back on its own while the point is enabled (a loop that must keep its thread). A one-shot
        point is spent."""
        with self._changed:
            point = self._points[name]
            if not point.enabled or point.spent:
                return
            point.hits += 1
            if point.one_shot:
                point.enabled = False
            self._changed.notify_all()

    def _check(self, name: str) -> None:
        if name not in self._points:
            raise KeyError(f"unknown injection point {name!r}; known points: {', '.join(sorted(self._points))}")
