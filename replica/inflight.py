"""Tracks writes in flight per schema version, so a node reports a schema as applied only after older writes end."""
from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager


class InflightWrites:
    """A write registers the schema version it started under; `applied_version` waits for none older."""

    def __init__(self) -> None:
        self._by_version: Counter = Counter()
        self._changed = threading.Condition()

    @contextmanager
    def track(self, current_version):
        """Register a write under the schema version `current_version()` returns, read under this lock.

        Reading the version inside the lock closes the gap in which a new schema could be applied and
        reported before the write registered; the write must read its schema after entering.
        """
        with self._changed:
            schema_version = current_version()
            self._by_version[schema_version] += 1
        try:
            yield schema_version
        finally:
            with self._changed:
                self._by_version[schema_version] -= 1
                if not self._by_version[schema_version]:
                    del self._by_version[schema_version]
                self._changed.notify_all()

    def applied_version(self, current_version: int) -> int:
        """The newest schema version every write still running on this node was started under (or current)."""
        with self._changed:
            return self._applied(current_version)

    def wait_applied(self, target: int, current_version, timeout: float) -> bool:
        """Wait until applied_version(current_version()) >= target; `notify` wakes waiters on schema changes."""
        with self._changed:
            return self._changed.wait_for(lambda: self._applied(current_version()) >= target, timeout)

    def wait_version(self, target: int, current_version, timeout: float) -> bool:
        """Wait until current_version() >= target, whatever writes are still running (woken as `wait_applied`)."""
        with self._changed:
            return self._changed.wait_for(lambda: current_version() >= target, timeout)

    def _applied(self, current_version: int) -> int:
        return min([current_version, *self._by_version])

    def notify(self) -> None:
        with self._changed:
            self._changed.notify_all()
