"""Fixtures shared by the tests: a throwaway PostgreSQL server and a store URL for each engine, and group0's
invariants checked after every command a test applies in its own process (`Group0State.validate`).

The Spark class-data archive is off for every test (and the node processes they start) unless a test names a
directory of its own: making one costs 30-40 CPU-seconds, which would land in the middle of unrelated tests.
"""
from __future__ import annotations

import gc
import os

import pytest
import sqlalchemy as sa

import coordinator.raft  # noqa: F401 - first: it puts back the socket.inet_ntop that importing pysyncobj replaces

from coordinator.core.state import Group0State
from storage.store import NodeStore

from .postgres import create_database, drop_database, throwaway_postgres

os.environ.setdefault("VBC_SPARK_CLASS_CACHE", "off")


def _spread(item) -> bool:
    return bool(item.get_closest_marker("long") or item.get_closest_marker("waits"))


@pytest.hookimpl(trylast=True)  # after -m and -k deselected theirs
def pytest_collection_modifyitems(items):
    """The long tests and those that wait (blended evenly: a worker that waits leaves the cores to the others) spread
    over the first three quarters of the run, between the modules of the others (in order otherwise): the test
    workers, which take consecutive tests, share them and end on short ones."""
    computing = [item for item in items if item.get_closest_marker("long")]
    waiting = [item for item in items if _spread(item) and not item.get_closest_marker("long")]
    long = [item for _, item in sorted([((i + 0.5) / len(computing), item) for i, item in enumerate(computing)]
                                       + [((i + 0.5) / len(waiting), item) for i, item in enumerate(waiting)],
                                       key=lambda pair: pair[0])]
    short = [item for item in items if not _spread(item)]
    if not long or not short:
        return
    every = max(1, len(short) * 3 // 4 // len(long))
    ordered, owed = [], every
    for before, item in zip([None, *short], short):
        if getattr(item, "module", None) is not getattr(before, "module", None):
            ordered += long[:owed // every]
            del long[:owed // every]
            owed %= every
        ordered.append(item)
        owed += 1
    items[:] = ordered + long


def pytest_collection_finish(session):
    """What the imports made lives as long as the run: the garbage collector's full collections no longer go
    through it."""
    gc.freeze()


@pytest.fixture(autouse=True)
def group0_invariants(request, monkeypatch):
    """Every `Group0State.apply` in the test's process is followed by `validate()`, except in tests marked
    `handmade_group0` (they edit the state's fields by hand into a shape no command makes)."""
    if request.node.get_closest_marker("handmade_group0"):
        return
    apply = Group0State.apply

    def apply_and_validate(self, command):
        outcome = apply(self, command)
        self.validate()
        return outcome

    monkeypatch.setattr(Group0State, "apply", apply_and_validate)


@pytest.fixture(scope="module")
def postgres_server():
    with throwaway_postgres() as url:
        yield url


@pytest.fixture
def postgres_database(postgres_server):
    """A fresh, empty database on the module's server (so outboxes do not leak between tests)."""
    url = create_database(postgres_server)
    yield url
    drop_database(postgres_server, url.database)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def store_url(request, tmp_path):
    """The URL of an empty node store: SQLite in the test's directory, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return sa.URL.create("sqlite", database=str(tmp_path / "node.db"))
    return request.getfixturevalue("postgres_database")


@pytest.fixture
def store(store_url):
    """An open node store on `store_url`, closed after the test."""
    node_store = NodeStore(store_url)
    yield node_store
    node_store.close()
