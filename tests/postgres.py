"""A throwaway PostgreSQL 15 server for tests (initdb + pg_ctl on a free loopback port, always stopped)."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from vbc.cluster import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
UNPRIVILEGED_USER = "nobody"


def _run_as_prefix() -> list[str]:
    """initdb refuses to run as root: run the server as an unprivileged user then."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        pytest.skip("running as root and runuser is unavailable, so initdb cannot run")
    try:
        pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        pytest.skip(f"running as root and there is no {UNPRIVILEGED_USER!r} user to run initdb as")
    return ["runuser", "-u", UNPRIVILEGED_USER, "--"]


def _give_to_unprivileged_user(path: Path) -> None:
    if os.geteuid() == 0:
        user = pwd.getpwnam(UNPRIVILEGED_USER)
        os.chown(path, user.pw_uid, user.pw_gid)


@contextmanager
def throwaway_postgres():
    """Yield the URL of a fresh server's `postgres` database; skips the test when PostgreSQL is missing."""
    initdb, pg_ctl = PG_BIN / "initdb", PG_BIN / "pg_ctl"
    if not (initdb.exists() and pg_ctl.exists()):
        pytest.skip(f"PostgreSQL binaries not found in {PG_BIN}")
    prefix = _run_as_prefix()
    root = Path(tempfile.mkdtemp(prefix="vbc-pg-"))
    data = root / "data"
    try:
        _give_to_unprivileged_user(root)
        subprocess.run([*prefix, str(initdb), "-D", str(data), "--auth=trust", "-U", "postgres", "--locale=C",
                        "-E", "UTF8"], check=True, capture_output=True)
        port = free_port()
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run([*prefix, str(pg_ctl), "-D", str(data), "-l", str(root / "server.log"), "-w", "-o", options,
                        "start"], check=True, capture_output=True)
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run([*prefix, str(pg_ctl), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run_admin_sql(server_url: str, sql: str) -> None:
    """Run one statement outside a transaction (CREATE/DROP DATABASE need that)."""
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(sql)
    finally:
        admin.dispose()


def create_database(server_url: str, name: str | None = None) -> sa.URL:
    """Create a database on the server and return its URL."""
    name = name or f"test_{uuid.uuid4().hex}"
    _run_admin_sql(server_url, f'CREATE DATABASE "{name}"')
    return sa.make_url(server_url).set(database=name)


def drop_database(server_url: str, name: str) -> None:
    _run_admin_sql(server_url, f'DROP DATABASE "{name}" WITH (FORCE)')
