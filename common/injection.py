"""Named fault-injection points that tests switch on a running node (fail or pause when hit)."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from coordinator.core.errors import Unavailable

# Every point the node code hits; enabling an unknown name is refused so typos do not pass silently.
KNOWN_POINTS = {
    "write.coordinator.before_send": "the coordinating node, before sending a write to the replicas",
    "write.replica.before_apply": "a base replica, before applying a write",
    "write.replica.after_apply": "a base replica, after applying a write and before sending view updates",
    "view_update.before_send": "a base replica, before sending view updates to a paired view replica",
    "view_update.receive": "a view replica, when view updates arrive",
    "view_rows.receive": "a view replica, when view rows of a view building batch arrive",
    "read.replica.scan": "a replica, when serving a scan",
    "ddl.before_propose": "a node, before proposing a schema change to Raft",
    "worker.work_on_tasks": "the view building worker, when a batch of tasks arrives",
    "coordinator_pause_main_loop": "the view building loop on the group0 leader: while enabled it dispatches nothing",
    "worker_pause_build_range": "a view building batch, before it scans its tablet replica",
    "worker_fail_build_range": "a view building batch, before it scans (fail mode: the batch fails)",
    "worker_pause_before_finish": "a view building batch whose view rows are applied, before it is recorded finished",
    "stream_tablet_fail": "a pending replica streaming a tablet, before it merges each window of rows (fail mode: "
                          "the stream fails)",
    "pause_tablet_migration_stage": "the group0 leader's tablet migration driver, between the stages of a migration",
}


class InjectedFailure(Unavailable):
    """Raised at an enabled `fail` point; maps to UNAVAILABLE so clients retry like a real fault."""


@dataclass
class _Point:
    mode: str = "fail"
    one_shot: bool = False
    enabled: bool = False
    hits: int = 0
    spent: bool = False  # a one-shot pause point already paused once; it lets later hits pass


class Injections:
    """The registry of one node; `hit(name)` is called by the code at each point."""

    def __init__(self) -> None:
        self._points = {name: _Point() for name in KNOWN_POINTS}
        self._changed = threading.Condition()

    def enable(self, name: str, mode: str = "fail", one_shot: bool = False) -> None:
        self._check(name)
        if mode not in ("fail", "pause"):
            raise ValueError(f"unknown injection mode {mode!r}; use 'fail' or 'pause'")
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
            if point.mode == "pause":
                point.spent = point.one_shot
                self._changed.wait_for(lambda: not point.enabled or self._points[name] is not point)
                return
            if point.one_shot:
                point.enabled = False
        raise InjectedFailure(f"injected failure at {name!r} ({KNOWN_POINTS[name]})")

    def _check(self, name: str) -> None:
        if name not in self._points:
            raise KeyError(f"unknown injection point {name!r}; known points: {', '.join(sorted(self._points))}")
