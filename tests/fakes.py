"""In-process stand-ins for the parts of a node that tests of one role do not need to run for real."""
from __future__ import annotations

import json
import threading
from typing import Callable, TypeVar

from coordinator.core.commands import Command, encode
from coordinator.core.state import Group0State

T = TypeVar("T")


class FakeGroup0:
    """group0 on one process without Raft: commands are applied at once to a real Group0State.

    It offers what the roles use of `coordinator.raft.Group0` (read, barrier, propose, term, applied index).
    Like the real adapter it applies the journal form of a typed command, after a JSON round trip that
    proves the entry holds plain values only.
    """

    def __init__(self, state: Group0State | None = None, term: int = 1):
        self.state = state if state is not None else Group0State()
        self.term = term
        self.applied_index = 0
        self.barriers = 0
        self._lock = threading.Lock()

    def read(self, fn: Callable[[Group0State], T]) -> T:
        with self._lock:
            return fn(self.state)

    def barrier(self, timeout: float = 10.0) -> int:
        self.barriers += 1
        return self.applied_index

    def propose(self, command: Command | dict, timeout: float = 10.0):
        entry = json.loads(json.dumps(encode(command) if isinstance(command, Command) else command))
        with self._lock:
            self.applied_index += 1
            return self.state.apply(entry)
