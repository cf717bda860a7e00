"""Tests of storage.ledger.FinishedTaskLedger: durable, idempotent, prunable."""
from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from storage.ledger import FILE_NAME, TaskCheckpoint, FinishedTaskLedger

ROOT = Path(__file__).resolve().parent.parent


def task_ids(count: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(count)]


@pytest.fixture
def ledger(tmp_path):
    opened = FinishedTaskLedger.for_data_dir(tmp_path)
    yield opened
    opened.close()


def test_recorded_ids_are_finished_and_others_are_not(ledger):
    done, pending = task_ids(3), task_ids(2)
    ledger.record(done)
    assert ledger.finished(done + pending) == set(done)
    assert ledger.finished([]) == set()
    assert set(ledger.all()) == set(done)


def test_record_is_idempotent(ledger):
    ids = task_ids(4)
    ledger.record(ids[:3])
    ledger.record(ids[:3])
    ledger.record(ids[1:] + ids[1:])
    ledger.record([])
    assert set(ledger.all()) == set(ids)


def test_invalid_ids_are_refused(ledger):
    with pytest.raises(ValueError):
        ledger.record(["ok", ""])
    with pytest.raises(ValueError):
        ledger.record([None])
    assert set(ledger.all()) == set()


def test_the_ledger_survives_reopening(tmp_path):
    ids = task_ids(5)
    with FinishedTaskLedger.for_data_dir(tmp_path) as first:
        first.record(ids)
    assert (tmp_path / FILE_NAME).exists()
    with FinishedTaskLedger.for_data_dir(tmp_path) as second:
        assert set(second.all()) == set(ids)
        assert second.finished(ids[:2]) == set(ids[:2])


def test_prune_keeps_only_the_ids_group0_holds(ledger):
    ids = task_ids(6)
    ledger.record(ids)
    assert ledger.prune(set(ids[:2]) | {"never-recorded"}) == 4
    assert set(ledger.all()) == set(ids[:2])
    assert ledger.prune(set(ids)) == 0
    assert ledger.prune(set()) == 2
    assert set(ledger.all()) == set()


def test_forget_removes_exactly_the_given_ids(ledger):
    ids = task_ids(4)
    ledger.record(ids)
    ledger.forget(ids[:2] + ["never-recorded"])
    ledger.forget([])
    assert set(ledger.all()) == set(ids[2:])


def test_large_sets_go_in_chunks(ledger):
    ids = task_ids(2_345)
    ledger.record(ids)
    assert ledger.finished(ids[::2] + task_ids(10)) == set(ids[::2])
    assert ledger.prune(ids[:1_000]) == 1_345
    ledger.forget(ids[:600])
    assert set(ledger.all()) == set(ids[600:1_000])


def test_concurrent_records_lose_nothing(ledger):
    batches = [task_ids(50) for _ in range(8)]
    threads = [threading.Thread(target=ledger.record, args=(batch,)) for batch in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(ledger.all()) == {task_id for batch in batches for task_id in batch}


def test_each_id_keeps_the_rows_its_batch_scanned_also_after_reopening(tmp_path):
    with FinishedTaskLedger.for_data_dir(tmp_path) as ledger:
        ledger.record(["a", "b"], [250_000, 250_000])
        ledger.record(["b", "c"], [7, 0])  # b is kept as it was first recorded
        ledger.record(["d"])
        with pytest.raises(ValueError, match="1 row counts for 2 task ids"):
            ledger.record(["e", "f"], [1])
    with FinishedTaskLedger.for_data_dir(tmp_path) as reopened:
        assert reopened.all() == {"a": 250_000, "b": 250_000, "c": 0, "d": 0}


def test_a_ledger_written_before_row_counts_gets_the_column(tmp_path):
    import sqlite3
    old = sqlite3.connect(tmp_path / FILE_NAME)
    old.execute("CREATE TABLE finished_tasks (task_id TEXT NOT NULL PRIMARY KEY)")
    old.execute("INSERT INTO finished_tasks VALUES ('old')")
    old.commit()
    old.close()
    with FinishedTaskLedger.for_data_dir(tmp_path) as ledger:
        ledger.record(["new"], [5])
        assert ledger.all() == {"old": 0, "new": 5}


CRASHING_WRITER = """
import os, sys
from storage.ledger import FinishedTaskLedger
ledger = FinishedTaskLedger.for_data_dir(sys.argv[1])
ledger.record(sys.argv[2:])
os._exit(0)  # no close, no atexit, no garbage collection: a crash right after record returned
"""


@pytest.mark.integration
def test_an_id_recorded_right_before_a_crash_survives(tmp_path):
    ids = task_ids(20)
    with FinishedTaskLedger.for_data_dir(tmp_path) as ledger:
        ledger.record(ids[:5])
    subprocess.run([sys.executable, "-c", CRASHING_WRITER, str(tmp_path), *ids[5:]], cwd=ROOT, check=True,
                   timeout=60)
    with FinishedTaskLedger.for_data_dir(tmp_path) as reopened:
        assert set(reopened.all()) == set(ids)


def test_a_running_task_keeps_its_checkpoint_until_it_finishes_or_goes(tmp_path):
    with FinishedTaskLedger(tmp_path / "l.db") as ledger:
        ledger.record_progress({"a": TaskCheckpoint(100, 1000), "b": TaskCheckpoint(50, 10)})
        ledger.record_progress({"a": TaskCheckpoint(200, 2000)})
    with FinishedTaskLedger(tmp_path / "l.db") as ledger:  # durable
        assert ledger.progress(["a", "b", "c"]) == {"a": TaskCheckpoint(200, 2000), "b": TaskCheckpoint(50, 10)}
        ledger.record(["a"], [2500])
        assert ledger.progress(["a", "b"]) == {"b": TaskCheckpoint(50, 10)}
        ledger.prune(keep=["a"])
        assert ledger.progress(["b"]) == {}
        ledger.record_progress({"c": TaskCheckpoint(7, 7)})
        ledger.forget(["c"])
        assert ledger.progress(["c"]) == {}
