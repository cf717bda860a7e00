"""One SparkSession per node: prestarted or lazy, bounded memory, Arrow on, UI off, JVM output in the node's log."""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from worker.spark_class_cache import ClassCache, cache_directory

log = logging.getLogger(__name__)
jvm_log = logging.getLogger(__name__ + ".jvm")

_LEVELS = {"FATAL": logging.CRITICAL, "ERROR": logging.ERROR, "WARN": logging.WARNING,
           "INFO": logging.INFO, "DEBUG": logging.DEBUG, "TRACE": logging.DEBUG}
LAUNCH_ATTEMPTS = 3
# The driver JVM runs at a lower CPU priority than the node (nice +5: a third of the CPU share of the node's own
# threads when both want a core), as ScyllaDB runs view building in a scheduling group of lower shares than
# statements. Without it, a node that joined while two cores were busy started its JVM (28 s, cold) in the same
# scheduling group as its own threads, and answered neither replica writes nor schema barriers within 10 s.
DRIVER_NICE = 5
_LEVEL_PREFIX = re.compile(r"^(FATAL|ERROR|WARN|INFO|DEBUG|TRACE) ")

# log4j2 configuration of the JVM: one console line per event ("LEVEL logger: message"), parsed by
# `_forward_jvm_output` into Python logging records.
_LOG4J2 = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %p %c{{1}}: %m%n%ex
rootLogger.level = {level}
rootLogger.appenderRef.console.ref = console
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = error
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
logger.sparkconf.name = org.apache.spark.SparkConf
logger.sparkconf.level = error
"""


# The driver JVM's default options. A view-building job is short (a few seconds per tablet) and the JVM of a
# node runs few of them, so most of a build's JVM time went into C2 JIT compilation: measured over four
# 250,000-row view jobs after a 10-row warm-up, C1 only with the parallel collector used 5.6 CPU-seconds
# against 8.3 with the JVM's defaults, in the same wall time. Long-lived nodes with heavy builds may prefer
# full tiered compilation (`--spark-java-options ""`).
DEFAULT_JAVA_OPTIONS = "-XX:+UseParallelGC -XX:TieredStopAtLevel=1"


def default_master() -> str:
    """`local[N]` with N the number of CPUs of this machine."""
    return f"local[{os.cpu_count() or 1}]"


@dataclass(frozen=True)
class SparkConfig:
    """How a node's Spark session is started (`data_dir` None: Spark's own temporary directories)."""

    master: str = field(default_factory=default_master)
    driver_memory: str = "1g"
    data_dir: str | None = None
    max_records_per_batch: int = 100_000
    shuffle_partitions: int = 2
    jvm_log_level: str = "WARN"
    java_options: str = DEFAULT_JAVA_OPTIONS
    extra: tuple[tuple[str, str], ...] = ()
    class_cache: str | None = None  # the class-data archive's directory, "off", or None: VBC_SPARK_CLASS_CACHE/default
    driver_host: str = "127.0.0.1"  # where a cluster's executors reach the driver (it binds there too)
    remote: str | None = None  # a Spark Connect server (sc://HOST:PORT): no JVM in the node, `master` unused

    @property
    def is_local(self) -> bool:
        """Whether the jobs run in this node's own JVM (a local master), whose disk they share."""
        return self.remote is None and self.master.startswith("local")

    @property
    def spark_dir(self) -> Path | None:
        return None if self.data_dir is None else Path(self.data_dir).resolve() / "spark"  # Spark takes file URIs

    def local_dir(self) -> Path | None:
        """Spark's scratch space (shuffle and spill files)."""
        return None if self.spark_dir is None else self.spark_dir / "local"

    def log_dir(self) -> Path | None:
        """Where the JVM's log configuration (and event logs, if enabled) go."""
        return None if self.spark_dir is None else self.spark_dir / "logs"


def driver_host(config: SparkConfig) -> str:
    """Where the driver binds and executors reach it: loopback with a local master, else `config.driver_host`."""
    return "127.0.0.1" if config.is_local else config.driver_host


# The settings of a session through Spark Connect: the session's own SQL settings of `spark_conf` (the server's
# JVM has its own memory, master and logs).
CONNECT_SETTINGS = ("spark.sql.execution.arrow.maxRecordsPerBatch", "spark.sql.shuffle.partitions",
                    "spark.sql.session.timeZone", "spark.sql.caseSensitive")


def spark_conf(config: SparkConfig, log4j_file: Path, class_cache_option: str = "") -> dict[str, str]:
    """The Spark properties a node's session starts with."""
    conf = {
        "spark.master": config.master,
        "spark.app.name": "vbc-view-builder",
        "spark.driver.memory": config.driver_memory,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(config.max_records_per_batch),
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.caseSensitive": "true",  # quoted CQL names keep their case: "X" and x are two columns
        "spark.driver.extraJavaOptions": " ".join(
            option for option in (f"-Dlog4j2.configurationFile={log4j_file.as_uri()}", config.java_options,
                                  class_cache_option) if option),
    }
    conf.update({"spark.driver.host": driver_host(config), "spark.driver.bindAddress": driver_host(config)})
    if config.spark_dir is not None:
        conf.update({"spark.local.dir": str(config.local_dir()),
                     "spark.sql.warehouse.dir": str(config.spark_dir / "warehouse")})
    conf.update(dict(config.extra))
    return conf


def _write_log4j_config(config: SparkConfig) -> Path:
    directory = config.log_dir()
    if directory is None:
        directory = Path(tempfile.mkdtemp(prefix="vbc-spark-"))
    directory.mkdir(parents=True, exist_ok=True)
    if config.local_dir() is not None:
        config.local_dir().mkdir(parents=True, exist_ok=True)
    path = directory / "log4j2.properties"
    path.write_text(_LOG4J2.format(level=config.jvm_log_level.lower()))
    return path


def _forward_jvm_output(stream) -> None:
    """Turn the JVM's output lines into log records (a line without a level continues the previous one)."""
    level = logging.INFO  # the launcher's notes before log4j starts
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip()
        if not line:
            continue
        prefix = _LEVEL_PREFIX.match(line)
        if prefix:
            level = _LEVELS[prefix.group(1)]
            line = line[prefix.end():]
        jvm_log.log(level, "%s", line)
    stream.close()


class _Jvm:
    """The process's one Spark driver (SparkContext is a per-process singleton); shared by reference count.

    It launches the driver JVM unless one already runs in the process (then it only creates a SparkContext
    there, or uses the active one), and on the last release stops only what it started.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.session = None
        self.owners = 0
        self.proc: subprocess.Popen | None = None
        self.owns_context = False
        self.class_cache: ClassCache | None = None
        self.java_options = ""

    def acquire(self, config: SparkConfig):
        with self.lock:
            if self.session is None:
                self.session = self._start_or_clean_up(config)
            self.owners += 1
            return self.session

    def release(self) -> None:
        with self.lock:
            self.owners -= 1
            if self.owners == 0 and self.session is not None:
                self._stop()

    def _start_or_clean_up(self, config: SparkConfig):
        try:
            return self._start(config)
        except BaseException:
            self._end_jvm()
            raise

    def _start(self, config: SparkConfig):
        from pyspark import SparkConf, SparkContext
        from pyspark.sql import SparkSession

        if config.remote is not None:
            return self._connect(config)
        started = time.monotonic()
        os.environ.setdefault("SPARK_LOCAL_IP", driver_host(config))
        logging.getLogger("py4j").setLevel(logging.WARNING)  # py4j logs every gateway connection at INFO
        launching = SparkContext._gateway is None
        self.java_options = config.java_options
        self.class_cache = ClassCache.for_jvm(cache_directory(config.class_cache), config.java_options) \
            if launching and config.is_local else None
        cache_option = self.class_cache.java_options() if self.class_cache else ""
        conf = SparkConf(loadDefaults=False).setAll(
            list(spark_conf(config, _write_log4j_config(config), cache_option).items()))
        if launching:
            self._launch(conf)
        else:
            log.warning("a Spark driver JVM already runs in this process: using it (its memory and log settings)")
        self.owns_context = SparkContext._active_spark_context is None
        session = SparkSession.builder.config(conf=conf).getOrCreate()
        log.info("spark session started (master %s, driver memory %s) in %.1f s",
                 config.master, config.driver_memory, time.monotonic() - started)
        return session

    def _connect(self, config: SparkConfig):
        """A session of the Spark Connect server `config.remote`: no JVM starts here."""
        from pyspark.sql import SparkSession

        started = time.monotonic()
        settings = spark_conf(config, Path(os.devnull))
        builder = SparkSession.builder.remote(config.remote)
        for name in CONNECT_SETTINGS:
            builder = builder.config(name, settings[name])
        session = builder.getOrCreate()
        self.owns_context = True
        log.info("spark connect session to %s started in %.1f s", config.remote, time.monotonic() - started)
        return session

    def make_class_archive(self, stopping: threading.Event) -> bool:
        """Make the class-data archive from this JVM's class list, if it listed its classes (see
        worker.spark_class_cache); whether one was made."""
        with self.lock:
            cache, session = self.class_cache, self.session
        if cache is None or session is None:
            return False
        classpath = session._jvm.java.lang.System.getProperty("java.class.path")
        return cache.make_archive(classpath, self.java_options, stopping)

    def _launch(self, conf) -> None:
        """Start the driver JVM with its output piped into `jvm_log`, as the process's Spark gateway.

        The pipe and its reader exist before the launch, so the output of a launcher that exits at once reaches
        the log too; such a launch is retried (LAUNCH_ATTEMPTS) before the error is raised.
        """
        from pyspark import SparkContext
        from pyspark.errors import PySparkRuntimeError
        from pyspark.java_gateway import launch_gateway

        for attempt in range(1, LAUNCH_ATTEMPTS + 1):
            read_end, write_end = os.pipe()
            reader = threading.Thread(target=_forward_jvm_output, args=(os.fdopen(read_end, "rb"),),
                                      name="spark-jvm-log", daemon=True)
            reader.start()
            try:
                gateway = _at_lower_priority(DRIVER_NICE, launch_gateway, conf,
                                             {"stdout": write_end, "stderr": subprocess.STDOUT})
            except PySparkRuntimeError as error:
                if attempt == LAUNCH_ATTEMPTS:
                    raise
                log.warning("the Spark driver JVM exited while starting (attempt %d: %s); its output is above; "
                            "retrying", attempt, error)
                continue
            finally:
                os.close(write_end)  # the JVM holds its own copy; the reader ends when the JVM does
            self.proc = gateway.proc
            SparkContext._ensure_initialized(gateway=gateway, conf=conf)
            return

    def _stop(self) -> None:
        if self.owns_context:
            self.session.stop()
        self.session = None
        self._end_jvm()
        log.info("spark session stopped")

    def _end_jvm(self) -> None:
        """End the JVM if this process's driver was launched here, so the next start launches a fresh one."""
        from pyspark import SparkContext

        if self.proc is None:
            return
        gateway, SparkContext._gateway, SparkContext._jvm = SparkContext._gateway, None, None
        if gateway is not None:
            gateway.shutdown()
        _end_process(self.proc)
        self.proc = None


def _at_lower_priority(increment: int, function: Callable, *args):
    """`function(*args)` on a thread of its own whose nice value is raised by `increment`, so that the processes it
    starts, and all their threads, inherit it (on Linux a nice value belongs to a thread); its result or error."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            if increment and sys.platform == "linux":
                os.nice(increment)
            outcome["result"] = function(*args)
        except BaseException as error:  # noqa: BLE001 - raised again on the calling thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name="spark-launch", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _end_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """Close the JVM's stdin (it exits on EOF) and wait for it; terminate it if it lingers."""
    if proc is None:
        return
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(timeout)


_JVM = _Jvm()


SPARK_OFF = "off"  # not started: prestart disabled (the first batch starts it) or the node stopped
SPARK_STARTING = "starting"
SPARK_WARMING = "warming"  # started; the prestart's warm-up jobs run
SPARK_READY = "ready"
SPARK_FAILED = "failed"  # the last start failed; the next `session()` call tries again
STOP_WAIT = 15.0  # how long `stop()` waits for a start or warm-up in progress
MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class SparkState:
    """What a node shows of its Spark session: the state, the error of a failed start, and the seconds its start
    took (with the prestart's warm-up)."""

    state: str = SPARK_OFF
    error: str = ""
    start_seconds: float = 0.0


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".strip()[:MAX_ERROR_CHARS]


class NodeSpark:
    """The Spark session of one node: started by `prestart()` or on the first `session()` call, stopped by `stop()`.

    Thread-safe: a `session()` call during a start in progress waits for that start. Several nodes in one
    process share the process's one Spark driver (the first one's configuration wins); the driver stops when
    the last of them stops.
    """

    def __init__(self, config: SparkConfig | None = None) -> None:
        self.config = config or SparkConfig()
        self._lock = threading.Lock()
        self._session = None
        self._stopping = threading.Event()
        self._scratch_ready = False
        self._prestart: threading.Thread | None = None
        self.state = SparkState()

    @property
    def started(self) -> bool:
        return self._session is not None

    def session(self):
        """The node's SparkSession, started now if this is the first use (or the last start failed)."""
        return self._open(SPARK_READY)

    def prestart(self, warm_up: Callable[[NodeSpark, threading.Event], object]) -> None:
        """Start the session on a daemon thread, then run `warm_up(self, stopping)` there; returns at once.

        A failed start is logged and leaves the state "failed": the next `session()` call starts again."""
        self._prestart = threading.Thread(target=self._run_prestart, args=(warm_up,), name="spark-prestart",
                                          daemon=True)
        self._prestart.start()

    def _run_prestart(self, warm_up: Callable[[NodeSpark, threading.Event], object]) -> None:
        started = time.monotonic()
        try:
            self._open(SPARK_WARMING)
        except Exception as error:  # noqa: BLE001 - the node runs on; its first batch starts the session again
            if not self._stopping.is_set():
                log.error("starting the node's Spark session failed (the first view building batch tries again): "
                          "%s", error_text(error))
            return
        warm_up_error = ""
        try:
            warm_up(self, self._stopping)
        except Exception as error:  # noqa: BLE001 - the session works; only the first batch is slower
            if self._stopping.is_set():
                return
            log.warning("the Spark warm-up failed; the session is used as it is", exc_info=True)
            warm_up_error = f"warm-up failed: {error_text(error)}"
        with self._lock:
            if self._session is None or self._stopping.is_set():
                return
            self.state = SparkState(SPARK_READY, warm_up_error, time.monotonic() - started)
            log.info("spark session ready (started and warmed up in %.1f s)", self.state.start_seconds)
        self._make_class_archive()

    def make_class_archive(self) -> bool:
        """Make the class-data archive from this process's driver JVM now, if it listed its classes (see
        worker.spark_class_cache); whether one was made."""
        return _JVM.make_class_archive(self._stopping)

    def _make_class_archive(self) -> None:
        try:
            self.make_class_archive()
        except Exception:  # noqa: BLE001 - the next JVMs start without the archive, as this one did
            log.warning("making the spark class-data archive failed", exc_info=True)

    def _open(self, state_once_started: str):
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("the node's Spark session was stopped")
            if self._session is None:
                self._session = self._start(state_once_started)
            return self._session

    def _start(self, state_once_started: str):
        """Acquire the process's Spark driver (under `_lock`), following it in `state`."""
        started = time.monotonic()
        self.state = SparkState(SPARK_STARTING)
        try:
            session = _JVM.acquire(self.config)
        except BaseException as error:
            self.state = SparkState(SPARK_FAILED, error_text(error), time.monotonic() - started)
            raise
        if self._stopping.is_set():  # `stop()` gave up waiting for this start: end it here
            _JVM.release()
            self.state = SparkState()
            raise RuntimeError("the node's Spark session was stopped while it started")
        self.state = SparkState(state_once_started, "", time.monotonic() - started)
        return session

    def scratch_dir(self) -> Path | None:
        """Where Arrow tables are staged as Parquet files for Spark to read: the node's Spark scratch space when
        the master is local (a remote cluster's executors could not see the file), else None."""
        if not self.config.is_local or self.config.local_dir() is None:
            return None
        directory = self.config.local_dir() / "frames"
        with self._lock:
            if not self._scratch_ready:
                shutil.rmtree(directory, ignore_errors=True)  # files a killed process left behind
                self._scratch_ready = True
            directory.mkdir(parents=True, exist_ok=True)
        return directory

    def stop(self, wait: float = STOP_WAIT) -> None:
        """Stop the session (a no-op when it never started); later `session()` calls fail.

        A prestart in progress is waited for up to `wait` seconds (its warm-up runs no further job); a start
        still running after that stops its session itself when it ends (the JVM also exits with the process)."""
        self._stopping.set()
        deadline = time.monotonic() + wait
        if self._prestart is not None:
            self._prestart.join(wait)
        if not self._lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            log.warning("the Spark session is still starting after %g s: it stops once its start ends", wait)
            return
        try:
            if self._session is not None:
                self._session = None
                _JVM.release()
            self.state = SparkState()
        finally:
            self._lock.release()

    def __enter__(self) -> NodeSpark:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
