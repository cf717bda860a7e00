"""Whether a process exists, by its id (signal 0: nothing is sent)."""
from __future__ import annotations

import os


def process_exists(pid: int) -> bool:
    """Whether a process with id `pid` exists: one of another user counts, and so does a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
