"""Seeded schedules of group0's Raft members on a simulated network, clock and disk (`tests.raft_sim`): drops,
reorders, partitions, crashes, power losses, all members killed at once, joins under a partition, compactions.

`VBC_RAFT_SIM_SEEDS=N` runs N schedules (default 2,000, in eight parts that test workers share): of 75 steps each in
`make test-fast`, and again at their full 300 steps in `make test` (marked `deep`)."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from .raft_sim import Simulation, install_world

pytestmark = pytest.mark.long

SEEDS = int(os.environ.get("VBC_RAFT_SIM_SEEDS", "2000"))
PARTS = 8
STEPS = 75  # the inner loop's schedules
DEEP_STEPS = 300  # the same schedules at full length (`make test`)
EXERCISED = ("acknowledged", "partitions", "crashes", "power losses", "all members killed", "restarts", "joins")


@pytest.fixture
def world(monkeypatch, tmp_path):
    """The simulated clock and disk; the members' files in memory (tmpfs) where there is one: a schedule's syncs and
    renames cost more than its Raft on a real disk, and a power loss is simulated from the recorded syncs anyway."""
    clock, disk = install_world(monkeypatch.setattr)
    in_memory = Path("/dev/shm")
    if in_memory.is_dir() and os.access(in_memory, os.W_OK):
        root = Path(tempfile.mkdtemp(prefix="vbc-raft-sim-", dir=in_memory))
        yield clock, disk, root
        shutil.rmtree(root, ignore_errors=True)
    else:
        yield clock, disk, tmp_path


@pytest.mark.parametrize("part", range(PARTS))
def test_seeded_schedules_keep_raft_safe(world, part):
    run_part(world, part, STEPS)


@pytest.mark.deep
@pytest.mark.parametrize("part", range(PARTS))
def test_seeded_schedules_at_full_length_keep_raft_safe(world, part):
    run_part(world, part, DEEP_STEPS)


def run_part(world, part: int, steps: int) -> None:
    clock, disk, root = world
    stats: Counter = Counter()
    for seed in range(part, SEEDS, PARTS):
        simulation = Simulation(seed, root / str(seed), stats, clock, disk, steps=steps)
        try:
            simulation.run()
        except AssertionError as error:
            hash_seed = os.environ.get("PYTHONHASHSEED", "random")  # pysyncobj keeps its members in sets
            raise AssertionError(f"seed {seed} (PYTHONHASHSEED={hash_seed}): {error}") from None
        finally:
            simulation.close()
    print(dict(stats))
    assert not [kind for kind in EXERCISED if not stats[kind]], stats
