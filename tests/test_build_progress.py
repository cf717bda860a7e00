"""A chunked batch's checkpoints (`worker.build_progress`): resume at the earliest token a task has not done, count
each task's rows once."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from storage.ledger import TaskCheckpoint
from worker.build_progress import after_chunk, resume_token


def test_a_batch_resumes_at_the_earliest_token_one_of_its_tasks_has_not_done():
    checkpoints = {"a": TaskCheckpoint(500, 5000), "b": TaskCheckpoint(300, 3000)}
    assert resume_token(0, checkpoints, ["a", "b"]) == 300
    assert resume_token(0, checkpoints, ["a", "new"]) == 0  # a task without a checkpoint starts at the beginning
    assert resume_token(100, {}, ["a"]) == 100


def test_a_chunk_moves_only_the_tasks_that_had_not_done_it():
    checkpoints = {"a": TaskCheckpoint(500, 5000)}
    moved = after_chunk(checkpoints, ["a", "b"], 0, chunk_last=199, rows=2000)
    assert moved == {"a": TaskCheckpoint(500, 5000), "b": TaskCheckpoint(200, 2000)}
    moved = after_chunk(moved, ["a", "b"], 0, chunk_last=599, rows=4000)
    assert moved == {"a": TaskCheckpoint(600, 9000), "b": TaskCheckpoint(600, 6000)}


@given(st.lists(st.integers(1, 50), min_size=1, max_size=12), st.integers(0, 11))
def test_a_run_cut_anywhere_and_resumed_counts_every_row_once(chunk_rows, crash_after):
    """Chunks of token width 10 with the given rows; the worker stops after `crash_after` chunks (their checkpoint
    kept) and a new batch resumes: each task counts the tablet's rows once."""
    checkpoints: dict[str, TaskCheckpoint] = {}
    for run in (chunk_rows[:crash_after], chunk_rows):
        start = resume_token(0, checkpoints, ["t"])
        for index, rows in enumerate(run):
            if index * 10 >= start:
                checkpoints = after_chunk(checkpoints, ["t"], 0, index * 10 + 9, rows)
    assert checkpoints["t"] == TaskCheckpoint(len(chunk_rows) * 10, sum(chunk_rows))
