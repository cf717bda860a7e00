"""Processes by id: whether one exists, and children that end when their parent does."""
from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def process_exists(pid: int) -> bool:
    """Whether a process with id `pid` exists: one of another user counts, and so does a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def killed_with_parent() -> Callable[[], None]:
    """A function for a forked child (a `preexec_fn`) that has the kernel SIGKILL the child when the thread that
    forked it ends, as when its parent is killed with `kill -9` (Linux; elsewhere it does nothing). Resolved here, in
    the parent, so the child makes no dynamic-loader call between fork and exec."""
    if not sys.platform.startswith("linux"):
        return lambda: None
    prctl, parent = _prctl(), os.getpid()
    return lambda: _killed_with(prctl, parent)


def end_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent, `parent`, ends (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        _killed_with(_prctl(), parent)


def _prctl() -> Callable:
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


def _killed_with(prctl: Callable, parent: int) -> None:
    """The death signal requested; an exit at once if `parent` had ended before the request was made."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
