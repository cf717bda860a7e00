"""The Spark driver's class-data archive: where it lives, how a JVM uses or lists for it, one maker at a time."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pyspark
import pytest

from worker import spark_class_cache as cc
from worker.spark_session import NodeSpark, SparkConfig
from worker.spark_warmup import warm_up

from .cluster_harness import wait_until


def test_the_directory_comes_from_the_config_then_the_environment_and_off_disables_it(tmp_path, monkeypatch):
    monkeypatch.delenv(cc.ENVIRONMENT_VARIABLE, raising=False)
    assert cc.cache_directory() == cc.DEFAULT_DIRECTORY
    monkeypatch.setenv(cc.ENVIRONMENT_VARIABLE, str(tmp_path))
    assert cc.cache_directory() == tmp_path
    assert cc.cache_directory("off") is None and cc.cache_directory("") is None
    monkeypatch.chdir(tmp_path)
    assert cc.cache_directory("relative") == tmp_path / "relative"


def test_a_jvm_lists_its_classes_until_an_archive_exists_then_starts_from_it(tmp_path):
    cache = cc.ClassCache.for_jvm(tmp_path / "classes", "-XX:+UseParallelGC")
    assert cache is not None, "the tests need Java"
    assert cache.java_options() == f"-XX:DumpLoadedClassList={cache.class_list}"
    assert cache.class_list.parent.is_dir()
    cache.archive.write_bytes(b"")
    assert cache.java_options() == f"-XX:SharedArchiveFile={cache.archive}"
    other = cc.ClassCache.for_jvm(tmp_path / "classes", "")
    assert other.archive != cache.archive, "other JVM options, another archive"


def test_another_spark_installation_makes_its_own_archive(tmp_path, monkeypatch):
    cache = cc.ClassCache.for_jvm(tmp_path, "")
    assert cache is not None, "the tests need Java"
    installed = cc.spark_installation()
    assert installed.endswith(str(Path(pyspark.__file__).resolve().parent))
    monkeypatch.setattr(cc, "spark_installation", lambda: installed.replace("pyspark", "another/pyspark"))
    other = cc.ClassCache.for_jvm(tmp_path, "")
    assert other.archive != cache.archive, "its jars are elsewhere: a JVM would not use this archive"


def test_one_process_makes_the_archive_and_a_stale_lock_is_taken_over(tmp_path):
    cache = cc.ClassCache.for_jvm(tmp_path, "")
    cache.java_options()
    cache.class_list.write_text("java/lang/Object\n")
    cache.lock.touch()
    assert not cache.make_archive("", "", threading.Event()), "another process holds the lock"
    assert not cache.class_list.exists(), "the list is dropped: that process makes the archive"
    assert cache._take_lock() is False
    old = time.time() - cc.STALE_LOCK_SECONDS - 1
    os.utime(cache.lock, (old, old))
    assert cache._take_lock() is True
    assert cache.lock.read_text() == str(os.getpid())


def test_the_new_maker_removes_what_a_dead_maker_left(tmp_path):
    cache = cc.ClassCache.for_jvm(tmp_path, "")
    other = cc.ClassCache.for_jvm(tmp_path, "-Xss2m")
    left = [tmp_path / f"spark-{cache.key}.123.snapshot", tmp_path / f"spark-{cache.key}.123.partial"]
    kept = [tmp_path / f"spark-{other.key}.123.partial", tmp_path / f"spark-{cache.key}.456.classlist"]
    for path in left + kept:
        path.write_bytes(b"x")
    cache._remove_leftovers()
    assert [p.exists() for p in left + kept] == [False, False, True, True]


def test_the_lock_of_a_process_that_is_gone_is_taken_over_at_once(tmp_path):
    cache = cc.ClassCache.for_jvm(tmp_path, "")
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout.strip()
    cache.lock.write_text(gone)
    assert cache._take_lock() is True, "a node killed while it dumped leaves its lock"
    cache.lock.write_text(str(os.getppid()))
    assert cache._take_lock() is False, "a lock whose process runs is held"


@pytest.mark.integration
def test_a_node_makes_the_archive_after_its_warm_up_and_the_next_jvm_starts_from_it(tmp_path):
    config = SparkConfig(master="local[1]", data_dir=str(tmp_path / "node"), class_cache=str(tmp_path / "classes"))
    cache = cc.ClassCache.for_jvm(tmp_path / "classes", config.java_options)
    first = NodeSpark(config)
    try:
        first.prestart(lambda spark, stopping: warm_up(spark, stopping, runs=(50,)))
        # the archive is renamed into place first, then the lock and the class list go
        wait_until(lambda: cache.archive.exists() and not cache.lock.exists(), 600,
                   "the class-data archive to be made, its lock removed", interval=0.5)
        assert not cache.class_list.exists()
    finally:
        first.stop()
    second = NodeSpark(config)
    try:
        session = second.session()
        arguments = session._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
        assert f"-XX:SharedArchiveFile={cache.archive}" in list(arguments)
        assert warm_up(second, runs=(20,))
    finally:
        second.stop()


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no scheduling autogroups on this system")
def test_the_archive_is_made_at_the_lowest_priority_in_a_scheduling_group_of_its_own(tmp_path):
    seen = tmp_path / "seen"
    command = ["sh", "-c", f"cat /proc/self/autogroup > {seen}; ps -o ni= -p $$ >> {seen}"]
    assert cc._run_at_lowest_priority(command, threading.Event())
    autogroup, nice = seen.read_text().splitlines()
    # A process in the root autogroup (a daemon's child, as under CI) reads an empty file.
    own_group = Path("/proc/self/autogroup").read_text().split()[:1]
    assert autogroup.endswith("nice 19") and autogroup.split()[:1] != own_group
    assert nice.strip() == "19"


def test_spark_archive_reports_an_archive_already_made_and_a_disabled_one(tmp_path, monkeypatch, capsys):
    from vbc import cli
    from worker.spark_warmup import make_class_archive

    config = SparkConfig(class_cache=str(tmp_path))
    cache = cc.ClassCache.for_jvm(tmp_path, config.java_options)
    cache.archive.write_bytes(b"")
    assert make_class_archive(config) == (cache.archive, f"already made: {cache.archive}")
    monkeypatch.setenv(cc.ENVIRONMENT_VARIABLE, str(tmp_path))
    assert cli.main(["spark-archive"]) == 0
    assert capsys.readouterr().out == f"spark class-data archive already made: {cache.archive}\n"
    monkeypatch.setenv(cc.ENVIRONMENT_VARIABLE, "off")
    assert cli.main(["spark-archive"]) == 1
    assert "the class-data archive is off" in capsys.readouterr().out
