"""Seeded schedules of group0's Raft members on a simulated network, clock and disk (`tests.raft_sim`): drops,
reorders, partitions, crashes, power losses, all members killed at once, joins under a partition, compactions.

`VBC_RAFT_SIM_SEEDS=N` runs N schedules (default 160, in four parts that test workers share)."""
from __future__ import annotations

import os
from collections import Counter

import pysyncobj.syncobj
import pytest

from coordinator import raft_storage

from .raft_sim import Clock, Disk, Simulation

SEEDS = int(os.environ.get("VBC_RAFT_SIM_SEEDS", "160"))
PARTS = 4
EXERCISED = ("acknowledged", "partitions", "crashes", "power losses", "all members killed", "restarts", "joins")


@pytest.fixture
def world(monkeypatch, tmp_path):
    clock, disk = Clock(), Disk()
    monkeypatch.setattr(pysyncobj.syncobj, "monotonicTime", clock)
    raft_storage.install()
    synced_journal = raft_storage.DurableJournal.sync
    synced_file = raft_storage.sync_file

    def sync_journal(journal) -> None:
        synced_journal(journal)
        disk.record(journal._path)

    def sync_file(path) -> None:
        synced_file(path)
        disk.record(path)

    monkeypatch.setattr(raft_storage.DurableJournal, "sync", sync_journal)
    monkeypatch.setattr(raft_storage, "sync_file", sync_file)
    return clock, disk, tmp_path


@pytest.mark.parametrize("part", range(PARTS))
def test_seeded_schedules_keep_raft_safe(world, part):
    clock, disk, root = world
    stats: Counter = Counter()
    for seed in range(part, SEEDS, PARTS):
        simulation = Simulation(seed, root / str(seed), stats, clock, disk)
        try:
            simulation.run()
        except AssertionError as error:
            hash_seed = os.environ.get("PYTHONHASHSEED", "random")  # pysyncobj keeps its members in sets
            raise AssertionError(f"seed {seed} (PYTHONHASHSEED={hash_seed}): {error}") from None
        finally:
            simulation.close()
    print(dict(stats))
    assert not [kind for kind in EXERCISED if not stats[kind]], stats
