"""Seeded schedules of the data simulation (tests/topology_sim.py): exact through every topology change.

2,000 schedules in `make test-fast`: the first 60 at full length (120 steps; the coverage test), the others at a
fifth of it; `make test` runs those again at full length (marked `deep`)."""
from __future__ import annotations

import os
from collections import Counter

import pytest

from .topology_sim import Simulation

pytestmark = pytest.mark.long

CHUNKS = 20
SEEDS = int(os.environ.get("VBC_TOPOLOGY_SIM_SEEDS", "2000"))  # more with VBC_TOPOLOGY_SIM_SEEDS=N
COVERAGE_SEEDS = range(60)  # the first schedules, which the coverage test runs (the chunks share the others)
RARE_FAULT_SEEDS = (167,)  # and one that fences a stale step (a step of the last leader's loop still in flight)
STEPS = 25  # the inner loop's schedules (`make test-fast`)
DEEP_STEPS = 120  # the same schedules at full length (`make test`, marked `deep`)
EXERCISED = ("writes", "late writes", "deletes", "writes retried", "views created", "batches finished",
             "batches failed", "reads checked", "read ranges re-planned", "splits", "merges requested",
             "proposed MergeTablets", "rf changes", "operator moves", "nodes added", "nodes decommissioned",
             "nodes removed (dead)", "members removed", "leader changes", "barriers not confirmed", "streams failed",
             "cleanups of a pending replica", "proposed AdvanceTabletMigration", "stale steps fenced",
             "step answers lost", "view rows kept for an unreachable replica", "holds released",
             "staged writes", "staged entries processed", "staged writes refused", "node restarts",
             "schedules checked")


def run_seeds(seeds, stats: Counter, steps: int = STEPS, staging: bool = True, restarts: bool = True) -> None:
    for seed in seeds:
        try:
            Simulation(seed, stats, staging=staging, restarts=restarts).run(steps)
        except AssertionError as error:
            raise AssertionError(f"schedule seed {seed}: {error}") from error


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_replica_equals_its_function_of_the_base_after_random_schedules(chunk):
    run_seeds(range(COVERAGE_SEEDS.stop + chunk, SEEDS, CHUNKS), Counter())


@pytest.mark.deep
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_replica_equals_its_function_of_the_base_after_full_length_schedules(chunk):
    run_seeds(range(COVERAGE_SEEDS.stop + chunk, SEEDS, CHUNKS), Counter(), DEEP_STEPS)


def test_the_schedules_exercise_every_operation_and_fault():
    """The first schedules, checked as every other, exercise every operation and fault between them."""
    stats: Counter = Counter()
    run_seeds([*COVERAGE_SEEDS, *RARE_FAULT_SEEDS], stats, DEEP_STEPS)
    never = [kind for kind in EXERCISED if not stats[kind]]
    print("\n".join(f"{kind}: {count}" for kind, count in sorted(stats.items())))
    assert not never, f"never exercised: {never}"


def test_the_schedule_settles_the_view_updates_its_last_writes_left_in_outboxes():
    """Seed 1487's 30 steps end on the delivery of its last write: nothing but the view updates in an outbox is left
    to settle, and the final check sees them delivered."""
    run_seeds([1487], Counter(), 30, staging=False, restarts=False)  # as found, before staged loads and restarts
