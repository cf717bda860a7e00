"""The Spark driver JVM's class-data archive (Java CDS): made once per machine, Spark and Java, then every driver
JVM of the machine starts from it.

A driver JVM loads some 16,000 classes before its first view job has run. Measured on 2 cores, a JVM started from
an archive of them opened its session in 2.6-3.3 s instead of 5.3-5.8 s, and ran its first job in 1.8-2.1 s
instead of 4.2-4.6 s. The archive is made in two steps, neither of which slows a running node down:

1. a driver JVM started while there is no archive lists the classes it loads (`-XX:DumpLoadedClassList`, a
   file appended as classes load: no measurable cost);
2. once that JVM has run its warm-up, a separate `java -Xshare:dump` process at the lowest CPU priority turns
   the list into the archive (30-40 CPU-seconds, ~180 MB), written under a temporary name and renamed when done.
   One process per machine does it (a lock file); a node that stops meanwhile ends it.

`vbc spark-archive` (run by `make`'s install step) does both steps at once, in a JVM of its own.

The archive's name carries the Spark version, the Java executable and the JVM options, so another Spark or Java
gets its own archive; the JVM checks the archive itself and runs without it (a warning in the node log) if it
does not match. `VBC_SPARK_CLASS_CACHE` names the directory (default `~/.cache/vbc/spark-classes`), or `off`.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.processes import killed_with_parent, process_exists

log = logging.getLogger(__name__)

ENVIRONMENT_VARIABLE = "VBC_SPARK_CLASS_CACHE"
DEFAULT_DIRECTORY = Path.home() / ".cache" / "vbc" / "spark-classes"
DUMP_TIMEOUT = 900.0
STALE_LOCK_SECONDS = 3600.0  # a lock older than this was left by a process that died while dumping


def cache_directory(configured: str | None = None) -> Path | None:
    """The archive directory: `configured`, else `VBC_SPARK_CLASS_CACHE`, else the default; None when "off"."""
    value = configured if configured is not None else os.environ.get(ENVIRONMENT_VARIABLE)
    if value is None:
        return DEFAULT_DIRECTORY
    if value.strip().lower() in ("", "off", "none", "false", "0"):
        return None
    return Path(value).expanduser().resolve()


def spark_installation() -> str:
    """The installed PySpark: its version and where its jars are. An archive holds the paths of the jars it was made
    from, and a JVM whose class path differs ignores it (measured: a session from another virtualenv with the same
    PySpark started in 5.4-5.8 s instead of 2.5-3.6 s), so each installation makes its own."""
    import pyspark

    return f"{pyspark.__version__}|{Path(pyspark.__file__).resolve().parent}"


def java_executable() -> Path | None:
    """The `java` PySpark's launcher runs: `$JAVA_HOME/bin/java`, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


@dataclass(frozen=True)
class ClassCache:
    """The archive of one (Spark version, Java, JVM options) in `directory`."""

    directory: Path
    java: Path
    key: str

    @classmethod
    def for_jvm(cls, directory: Path | None, java_options: str) -> ClassCache | None:
        """The cache of the driver JVMs started with `java_options`; None when disabled or Java is not found."""
        java = java_executable()
        if directory is None or java is None:
            return None
        stat = java.stat()
        identity = f"{spark_installation()}|{java}|{stat.st_size}|{stat.st_mtime_ns}|{java_options}"
        return cls(directory, java, hashlib.sha256(identity.encode()).hexdigest()[:16])

    @property
    def archive(self) -> Path:
        return self.directory / f"spark-{self.key}.jsa"

    @property
    def class_list(self) -> Path:
        """Where this process's driver JVM lists the classes it loads."""
        return self.directory / f"spark-{self.key}.{os.getpid()}.classlist"

    @property
    def lock(self) -> Path:
        return self.directory / f"spark-{self.key}.lock"

    def java_options(self) -> str:
        """The option a driver JVM starts with: use the archive, or list the classes for making one."""
        if self.archive.exists():
            return f"-XX:SharedArchiveFile={self.archive}"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.class_list.unlink(missing_ok=True)
        return f"-XX:DumpLoadedClassList={self.class_list}"

    def make_archive(self, classpath: str, java_options: str, stopping: threading.Event) -> bool:
        """Turn this process's class list into the archive (a `java -Xshare:dump` at the lowest CPU priority);
        whether an archive was made. Nothing to do when it exists, when the JVM did not list its classes, or when
        another process is making it; ended early when `stopping` is set."""
        if self.archive.exists() or not self.class_list.exists() or not self._take_lock():
            self.class_list.unlink(missing_ok=True)
            return False
        self._remove_leftovers()
        snapshot = self.class_list.with_suffix(".snapshot")
        partial = self.archive.with_suffix(f".{os.getpid()}.partial")
        try:
            shutil.copyfile(self.class_list, snapshot)  # the JVM goes on appending to its list
            command = [str(self.java), "-Xshare:dump", f"-XX:SharedClassListFile={snapshot}",
                       f"-XX:SharedArchiveFile={partial}", *shlex.split(java_options), "-cp", classpath]
            started = time.monotonic()
            if not _run_at_lowest_priority(command, stopping):
                return False
            os.replace(partial, self.archive)
            log.info("spark class-data archive made in %.0f s: %s (later driver JVMs start from it)",
                     time.monotonic() - started, self.archive)
            return True
        finally:
            for leftover in (snapshot, partial, self.class_list, self.lock):
                leftover.unlink(missing_ok=True)

    def _remove_leftovers(self) -> None:
        """(Holding the lock) the snapshots and partial archives of makers that died while dumping (~180 MB each)."""
        for pattern in (f"spark-{self.key}.*.snapshot", f"spark-{self.key}.*.partial"):
            for leftover in self.directory.glob(pattern):
                leftover.unlink(missing_ok=True)

    def _take_lock(self) -> bool:
        """Create the lock holding this process's id; a lock is taken over when its process is gone (a node killed
        while it dumped) or, whoever holds it, once it is STALE_LOCK_SECONDS old."""
        for _ in range(2):
            try:
                descriptor = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                if time.time() - _mtime(self.lock) < STALE_LOCK_SECONDS and _holder_alive(self.lock):
                    return False
                self.lock.unlink(missing_ok=True)
                continue
            with os.fdopen(descriptor, "w") as lock:
                lock.write(str(os.getpid()))
            return True
        return False


def _holder_alive(lock: Path) -> bool:
    """Whether the process whose id the lock holds runs (True when the lock names none: only its age tells)."""
    try:
        pid = int(lock.read_text().strip())
    except (OSError, ValueError):
        return True
    return process_exists(pid)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _lowest_priority() -> None:
    """(In the child, after setsid) nice 19 for the process and for its new scheduling autogroup. With autogroups
    (Linux's default on desktops and many servers) nice only orders the processes of one session, and sessions
    share the CPUs equally: at nice 19 in the node's session the dump still took 30-80% of a core from a JVM
    starting in another node's session."""
    try:
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write("19")
    except OSError:
        pass  # no autogroups here: nice alone orders the processes
    os.nice(19)


def _child_setup(request_death_signal: Callable[[], None]) -> Callable[[], None]:
    """The dump's `preexec_fn`: the lowest priority, and an end with the node (a node killed with `kill -9` left its
    dump running to its end, for an archive the node's next start makes anyway)."""
    def setup() -> None:
        request_death_signal()
        _lowest_priority()
    return setup


def _run_at_lowest_priority(command: list[str], stopping: threading.Event) -> bool:
    """Run `command` at the lowest priority (`_lowest_priority`) until it ends (True if it succeeded), `stopping` is
    set or DUMP_TIMEOUT passes."""
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=_child_setup(killed_with_parent()))
        deadline = time.monotonic() + DUMP_TIMEOUT
        while process.poll() is None:
            if stopping.wait(0.5) or time.monotonic() > deadline:
                process.kill()
                process.wait()
                return False
        if process.returncode != 0:
            output.seek(max(0, output.seek(0, os.SEEK_END) - 2000))
            log.warning("making the spark class-data archive failed (exit %d): %s", process.returncode,
                        output.read().decode("utf-8", "replace"))
        return process.returncode == 0
