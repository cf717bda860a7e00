"""A throwaway PostgreSQL 15 server (initdb + pg_ctl on a free loopback port, always stopped): benchmark baselines
and the tests' PostgreSQL store."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vbc.cluster import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
UNPRIVILEGED_USER = "nobody"


class PostgresUnavailable(Exception):
    """No PostgreSQL server can be started here (binaries missing, or root without a user to run it as)."""


def _run_as_prefix() -> list[str]:
    """initdb refuses to run as root: run the server as an unprivileged user then."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        raise PostgresUnavailable("running as root and runuser is unavailable, so initdb cannot run")
    try:
        pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        raise PostgresUnavailable(f"running as root and there is no {UNPRIVILEGED_USER!r} user to run initdb as") \
            from None
    return ["runuser", "-u", UNPRIVILEGED_USER, "--"]


def _give_to_unprivileged_user(path: Path) -> None:
    if os.geteuid() == 0:
        user = pwd.getpwnam(UNPRIVILEGED_USER)
        os.chown(path, user.pw_uid, user.pw_gid)


@contextmanager
def throwaway_server(fsync: bool = False) -> Iterator[str]:
    """Yield the SQLAlchemy URL of a fresh server's `postgres` database (PostgresUnavailable if none can start)."""
    initdb, pg_ctl = PG_BIN / "initdb", PG_BIN / "pg_ctl"
    if not (initdb.exists() and pg_ctl.exists()):
        raise PostgresUnavailable(f"PostgreSQL binaries not found in {PG_BIN}")
    prefix = _run_as_prefix()
    root = Path(tempfile.mkdtemp(prefix="vbc-pg-"))
    data = root / "data"
    try:
        _give_to_unprivileged_user(root)
        subprocess.run([*prefix, str(initdb), "-D", str(data), "--auth=trust", "-U", "postgres", "--locale=C",
                        "-E", "UTF8"], check=True, capture_output=True)
        port = free_port()
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync={'on' if fsync else 'off'}"
        subprocess.run([*prefix, str(pg_ctl), "-D", str(data), "-l", str(root / "server.log"), "-w", "-o", options,
                        "start"], check=True, capture_output=True)
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run([*prefix, str(pg_ctl), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
