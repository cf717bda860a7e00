"""Child processes that run the ADBC SQLite work away from the node's own SQLite library (`ChildPool`).

ADBC's SQLite driver carries its own copy of the SQLite library. Two copies in one process break SQLite's
locking (POSIX locks belong to the process, and each copy tracks only its own connections): closing an ADBC
connection deletes the WAL under the store's open sqlite3 connections (seen here: the next write was lost, then
"disk I/O error"), and one copy's checkpoint can overwrite WAL frames a reader of the other still uses. Across
processes the two copies lock each other like any two processes. So every ADBC use of the node's SQLite files
runs in a child process of this pool, never in the node's process.

A child imports the served module (`served_module`, e.g. `storage.adbc_child`), runs its `CHILD_WARM_UP` function
if it has one, and answers calls by name from its `CHILD_FUNCTIONS` dict; requests and answers are length-prefixed
pickles on the child's pipes. Plain subprocesses rather than multiprocessing: spawn would re-run the parent's
__main__ script.
"""
from __future__ import annotations

import fcntl
import importlib
import os
import pickle
import struct
import subprocess
import sys
import threading
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent  # the directory holding the `storage` package
# A window of rows is some MB of Arrow IPC: through the default 64 KiB pipe it took ~9.5 ms per 5.4 MB (about 80
# hand-overs between the processes), through 1 MiB ~5.3 ms. Linux's limit for an unprivileged process is 1 MiB.
PIPE_BYTES = 1 << 20


class _Child:
    """One child process running `serve(served_module)`."""

    def __init__(self, served_module: str) -> None:
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), environment.get("PYTHONPATH")]))
        command = f"import storage.adbc_pool as pool; pool.serve({served_module!r})"
        self._process = subprocess.Popen([sys.executable, "-c", command],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environment)
        for pipe in (self._process.stdin, self._process.stdout):
            _widen(pipe)

    def alive(self) -> bool:
        return self._process.poll() is None

    def call(self, name: str, args: tuple) -> tuple[str, object]:
        """("ok", result) or ("error", exception) as answered; EOFError/OSError when the child is gone."""
        _send(self._process.stdin, (name, args))
        return _receive(self._process.stdout)

    def close(self) -> None:
        try:
            self._process.stdin.close()
            self._process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()


class ChildPool:
    """Child processes serving `served_module`'s CHILD_FUNCTIONS, started on demand, one per call in flight;
    `keep_idle` of them are kept for the next calls."""

    def __init__(self, keep_idle: int, served_module: str) -> None:
        self._keep_idle = keep_idle
        self._served_module = served_module
        self._idle: list[_Child] = []
        self._lock = threading.Lock()

    def run(self, name: str, *args):
        """CHILD_FUNCTIONS[name](*args) in a child process: its result, or the exception it raised."""
        child = self._take()
        try:
            status, value = child.call(name, args)
        except BaseException:
            child.close()  # dead, or the exchange was cut in the middle: never reuse it
            raise
        self._give_back(child)
        if status == "error":
            raise value
        return value

    def prestart(self, count: int) -> None:
        """Keep `count` children idle from now on and start the missing ones (they import in the background), so
        the first calls in flight at once do not each wait for a new process."""
        with self._lock:
            self._keep_idle = max(self._keep_idle, count)
            for child in [c for c in self._idle if not c.alive()]:
                self._idle.remove(child)
                child.close()
            self._idle.extend(self._new_child() for _ in range(count - len(self._idle)))

    def shutdown(self) -> None:
        """Stop the idle children (new ones start on the next call)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for child in idle:
            child.close()

    def _new_child(self) -> _Child:
        return _Child(self._served_module)

    def _take(self) -> _Child:
        with self._lock:
            while self._idle:
                child = self._idle.pop()
                if child.alive():
                    return child
                child.close()
        return self._new_child()

    def _give_back(self, child: _Child) -> None:
        with self._lock:
            if len(self._idle) < self._keep_idle:
                self._idle.append(child)
                return
        child.close()


def _widen(pipe) -> None:
    """Give the pipe a buffer of PIPE_BYTES where the system allows it (else it keeps its default)."""
    try:
        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (OSError, AttributeError):
        pass


def _send(stream, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack(">Q", len(data)))
    stream.write(data)
    stream.flush()


def _receive(stream) -> object:
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError("the ADBC child process closed its pipe")
    size = struct.unpack(">Q", header)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the ADBC child process closed its pipe in the middle of an answer")
    return pickle.loads(data)


def _portable(error: Exception) -> Exception:
    """The exception itself if it survives pickling, else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _warm_up(warm_up) -> None:
    """Run the served module's CHILD_WARM_UP, if any, before the first request (a failure only leaves it cold)."""
    if warm_up is None:
        return
    try:
        warm_up()
    except Exception as error:  # noqa: BLE001
        print(f"the child's warm-up failed: {error}", file=sys.stderr)


def serve(served_module: str) -> None:
    """The child's loop: answer requests on stdin until it closes (the parent exited or shut the pool down)."""
    module = importlib.import_module(served_module)
    functions = module.CHILD_FUNCTIONS
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the answers
    _warm_up(getattr(module, "CHILD_WARM_UP", None))
    while True:
        try:
            name, args = _receive(requests)
        except EOFError:
            return
        try:
            answer = ("ok", functions[name](*args))
        except Exception as error:
            answer = ("error", _portable(error))
        _send(answers, answer)
