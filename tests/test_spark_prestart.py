"""NodeSpark's states (off, starting, warming, ready, failed) and its prestart, over a fake Spark driver: no JVM."""
from __future__ import annotations

import threading
import time

import pytest

from coordinator.core.tokens import token_of
from replica.rows import storage_spec
from storage.arrow_layouts import storage_schema
from worker import spark_session, spark_warmup
from worker.spark_session import NodeSpark, SparkState

WAIT = 10


class FakeJvm:
    """The process's Spark driver as NodeSpark uses it: `acquire` waits for `gate` (a slow start), fails
    `failures` times, then hands out one session object."""

    def __init__(self, failures: int = 0):
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.failures = failures
        self.acquired = 0
        self.released = 0
        self.session = object()

    def acquire(self, config):
        self.entered.set()
        assert self.gate.wait(WAIT)
        self.acquired += 1
        if self.failures:
            self.failures -= 1
            raise RuntimeError("JAVA_GATEWAY_EXITED: java not found")
        return self.session

    def release(self):
        self.released += 1


@pytest.fixture
def jvm(monkeypatch):
    fake = FakeJvm()
    monkeypatch.setattr(spark_session, "_JVM", fake)
    return fake


def wait_for(predicate, message: str):
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        time.sleep(0.01)


def in_thread(target) -> tuple[threading.Thread, dict]:
    result = {}

    def run():
        try:
            result["value"] = target()
        except Exception as error:  # noqa: BLE001 - kept for the test to look at
            result["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_without_prestart_the_session_is_off_until_the_first_use(jvm):
    spark = NodeSpark()
    assert spark.state == SparkState("off", "", 0.0)
    assert spark.session() is jvm.session and spark.session() is jvm.session
    assert spark.state.state == "ready" and spark.state.start_seconds >= 0 and jvm.acquired == 1
    spark.stop()
    assert spark.state.state == "off" and jvm.released == 1
    with pytest.raises(RuntimeError, match="stopped"):
        spark.session()


def test_a_batch_during_the_prestart_waits_for_the_same_session_then_the_warm_up_makes_it_ready(jvm):
    jvm.gate.clear()
    seen = []
    warmed = threading.Event()

    def warm_up(node_spark, stopping):
        seen.append((node_spark.state.state, node_spark.session(), stopping.is_set()))
        warmed.wait(WAIT)

    spark = NodeSpark()
    spark.prestart(warm_up)
    assert jvm.entered.wait(WAIT)
    assert spark.state.state == "starting"
    batch, result = in_thread(spark.session)
    batch.join(0.1)
    assert batch.is_alive(), "a batch's call waits for the start in progress"
    jvm.gate.set()
    batch.join(WAIT)
    assert result == {"value": jvm.session}
    wait_for(lambda: seen, "the warm-up")
    assert seen == [("warming", jvm.session, False)] and spark.state.state == "warming"
    warmed.set()
    wait_for(lambda: spark.state.state == "ready", "the ready state")
    assert jvm.acquired == 1 and spark.state.error == "" and spark.state.start_seconds > 0
    spark.stop()
    assert jvm.released == 1


def test_a_failed_prestart_is_shown_and_the_next_batch_starts_the_session_again(monkeypatch):
    jvm = FakeJvm(failures=1)
    monkeypatch.setattr(spark_session, "_JVM", jvm)
    warm_ups = []
    spark = NodeSpark()
    spark.prestart(lambda node_spark, stopping: warm_ups.append(1))
    wait_for(lambda: spark.state.state == "failed", "the failed state")
    assert spark.state.error == "RuntimeError: JAVA_GATEWAY_EXITED: java not found" and warm_ups == []
    assert spark.session() is jvm.session
    assert spark.state.state == "ready" and spark.state.error == "" and jvm.acquired == 2
    spark.stop()
    assert jvm.released == 1


def test_a_failed_warm_up_leaves_a_working_session_with_the_error_shown(jvm):
    def warm_up(node_spark, stopping):
        raise ValueError("no such column")

    spark = NodeSpark()
    spark.prestart(warm_up)
    wait_for(lambda: spark.state.state == "ready", "the ready state")
    assert spark.state.error == "warm-up failed: ValueError: no such column"
    assert spark.session() is jvm.session and jvm.acquired == 1
    spark.stop()


def test_stopping_during_the_warm_up_ends_it_and_releases_the_driver(jvm):
    def warm_up(node_spark, stopping):
        stopping.wait(WAIT)  # a warm-up runs no further job once the node stops

    spark = NodeSpark()
    spark.prestart(warm_up)
    wait_for(lambda: spark.state.state == "warming", "the warming state")
    started = time.monotonic()
    spark.stop()
    assert time.monotonic() - started < 2
    assert spark.state.state == "off" and jvm.released == 1


def test_stopping_during_a_slow_start_does_not_hang_and_the_start_releases_its_session(jvm):
    jvm.gate.clear()
    spark = NodeSpark()
    spark.prestart(lambda node_spark, stopping: pytest.fail("no warm-up after a stop"))
    assert jvm.entered.wait(WAIT)
    started = time.monotonic()
    spark.stop(wait=0.2)
    assert time.monotonic() - started < 2 and jvm.released == 0
    jvm.gate.set()  # the start ends after the stop gave up waiting: it releases the driver itself
    wait_for(lambda: jvm.released == 1 and spark.state.state == "off", "the late start to release the driver")
    assert jvm.acquired == 1
    with pytest.raises(RuntimeError, match="stopped"):
        spark.session()


def test_the_warm_up_rows_have_the_storage_layout_of_the_warm_up_table():
    rows = spark_warmup.warmup_rows(30)
    assert rows.schema == storage_schema(storage_spec(spark_warmup.BASE)) and rows.num_rows == 30
    assert {f.type.__str__() for f in rows.schema} >= {"int32", "int64", "double", "bool", "string"}
    first = rows.slice(0, 1).to_pylist()[0]
    assert first["token"] == token_of((first["c_id"],), ("int",)) and first["tombstone"] is False
    assert all(view.view.base_id == spark_warmup.BASE.id for view in spark_warmup.VIEWS)


def test_the_warm_up_ends_once_real_batches_run(monkeypatch):
    """A build started before or during the warm-up gets the cores: no warm-up job starts once `busy()` is true."""
    jobs = []
    monkeypatch.setattr(spark_warmup, "run_view_job", lambda spark, rows: jobs.append(rows.num_rows))
    assert spark_warmup.warm_up(None, runs=(3, 30, 300), busy=lambda: True) == [] and jobs == []
    answers = iter([False, True])
    assert len(spark_warmup.warm_up(None, runs=(3, 30, 300), busy=lambda: next(answers))) == 1 and jobs == [3]
    jobs.clear()
    assert len(spark_warmup.warm_up(None, runs=(3, 30, 300), busy=lambda: False, planning_runs=2)) == 5
    assert jobs == [3, 30, 300, spark_warmup.WARMUP_ROWS, spark_warmup.WARMUP_ROWS]
