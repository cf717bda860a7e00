"""A throwaway PostgreSQL 15 server for tests (initdb + pg_ctl on a free loopback port, always stopped)."""
from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from bench.postgres import PostgresUnavailable, throwaway_server


@contextmanager
def throwaway_postgres():
    """Yield the URL of a fresh server's `postgres` database; skips the test when PostgreSQL is missing."""
    try:
        with throwaway_server() as url:
            yield url
    except PostgresUnavailable as reason:
        pytest.skip(str(reason))


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
