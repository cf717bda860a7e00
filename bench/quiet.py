"""Wait until the machine is idle before a timed step, so work left over from the step before (a node's background
WAL checkpoint after a stream, a cleanup, dirty pages not yet written) does not slow the next figure down."""
from __future__ import annotations

import os
import time
from pathlib import Path

BUSY_BELOW = 0.15  # share of all cores busy over one sample that counts as idle
SAMPLE_SECONDS = 0.5


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share(seconds: float = SAMPLE_SECONDS) -> float:
    """The share of the machine's cores busy over the next `seconds`."""
    busy_before, total_before = _cpu_times()
    time.sleep(seconds)
    busy_after, total_after = _cpu_times()
    return (busy_after - busy_before) / max(1, total_after - total_before)


def wait_until_idle(timeout: float = 30.0, busy_below: float = BUSY_BELOW) -> float:
    """Write the dirty pages out (a timed commit's sync then flushes its own pages only), then sample until a sample
    finds the cores busy less than `busy_below` (or `timeout` passed); the last share."""
    os.sync()
    deadline = time.monotonic() + timeout
    share = busy_share()
    while share >= busy_below and time.monotonic() < deadline:
        share = busy_share()
    return share
