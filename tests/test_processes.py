"""Children that end with their parent: a `kill -9` of the parent leaves no child running (common.processes)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from common.processes import process_exists
from vbc.cluster import pid_alive

from .cluster_harness import wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")]

PARENT = """
import subprocess, sys
from common.processes import killed_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=killed_with_parent())
print(child.pid, flush=True)
sys.stdin.read()
"""


def test_a_child_started_with_killed_with_parent_ends_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        assert process_exists(child)
        parent.kill()
        parent.wait(10)
        wait_until(lambda: not pid_alive(child), timeout=10.0, message="the child to end with its parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if child is not None and pid_alive(child):
            os.kill(child, signal.SIGKILL)

