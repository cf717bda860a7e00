"""Roles and grants in group0: commands, their refusals, and who may do what."""
from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import auth
from coordinator.core.auth import Principal
from coordinator.core.commands import (
    AlterRole,
    CreateKeyspace,
    CreateRole,
    CreateTable,
    ColumnSpec,
    DropKeyspace,
    RegisterNode,
    DropRole,
    DropTable,
    GrantPermissions,
    RevokePermissions,
    decode,
    encode,
)
from coordinator.core.errors import PermissionDenied, Unauthenticated
from coordinator.core.state import Group0State

ALICE = Principal("alice")


def applied(state: Group0State, command) -> object:
    outcome = state.apply(decode(encode(command)))  # through the journal form, as every replica applies it
    assert outcome.ok, outcome.error_message
    return outcome.value


def refused(state: Group0State, command) -> tuple[str, str]:
    outcome = state.apply(command)
    assert not outcome.ok
    return outcome.error_code, outcome.error_message


def with_two_tables() -> Group0State:
    """A node, keyspaces ks and other, each with a table t."""
    s = Group0State()
    applied(s, RegisterNode(node_id="n1", grpc="127.0.0.1:1", raft="127.0.0.1:2", shards=1, cmd_id=None))
    for keyspace in ("ks", "other"):
        applied(s, CreateKeyspace(name=keyspace, rf=1, initial_tablets=1, cmd_id=None))
        applied(s, CreateTable(id=("a" if keyspace == "ks" else "b") * 32, keyspace=keyspace, name="t",
                               columns=(ColumnSpec("k", "int"),), partition_key=("k",), clustering_key=(), cmd_id=None))
    return s


@pytest.fixture
def state() -> Group0State:
    s = with_two_tables()
    applied(s, CreateRole(name="alice", password_hash="scrypt$x", login=True, cmd_id=None))
    return s


def test_root_always_exists_as_a_superuser_that_may_log_in():
    state = Group0State()
    root = auth.login_role(state, "root")
    assert root.superuser and root.login and root.password_hash == ""
    assert auth.is_superuser(state, Principal("root"))
    assert refused(state, DropRole(name="root", cmd_id=None))[0] == "FAILED_PRECONDITION"
    assert refused(state, AlterRole(name="root", superuser=False, cmd_id=None))[0] == "FAILED_PRECONDITION"


def test_a_grant_on_a_keyspace_covers_its_tables_and_nothing_else(state):
    applied(state, GrantPermissions(role="alice", permissions=("SELECT",), keyspace="ks", cmd_id=None))
    assert auth.may(state, ALICE, "SELECT", ("ks", "t"))
    assert not auth.may(state, ALICE, "MODIFY", ("ks", "t"))
    assert not auth.may(state, ALICE, "SELECT", ("other", "t"))
    with pytest.raises(PermissionDenied, match="no MODIFY permission on TABLE ks.t.*GRANT MODIFY ON TABLE ks.t TO"):
        auth.authorize(state, ALICE, "MODIFY", ("ks", "t"))


def test_revoke_takes_back_what_grant_gave(state):
    applied(state, GrantPermissions(role="alice", permissions=("SELECT", "MODIFY"), keyspace="ks", table="t",
                                    cmd_id=None))
    applied(state, RevokePermissions(role="alice", permissions=("MODIFY",), keyspace="ks", table="t", cmd_id=None))
    assert auth.may(state, ALICE, "SELECT", ("ks", "t")) and not auth.may(state, ALICE, "MODIFY", ("ks", "t"))
    applied(state, RevokePermissions(role="alice", permissions=("SELECT",), keyspace="ks", table="t", cmd_id=None))
    assert state.grants == {}


def test_grants_on_all_keyspaces_hold_everywhere(state):
    applied(state, GrantPermissions(role="alice", permissions=auth.PERMISSIONS, cmd_id=None))
    assert all(auth.may(state, ALICE, p, ("other", "t")) for p in auth.PERMISSIONS)
    assert auth.permission_rows(state, "alice", ("ks", "t"))[0] == ("alice", "ALL KEYSPACES", "SELECT")


def test_a_grant_names_an_existing_role_resource_and_permission(state):
    assert refused(state, GrantPermissions(role="bob", permissions=("SELECT",), cmd_id=None))[0] == "NOT_FOUND"
    assert refused(state, GrantPermissions(role="alice", permissions=("SELECT",), keyspace="nope",
                                           cmd_id=None))[0] == "NOT_FOUND"
    assert refused(state, GrantPermissions(role="alice", permissions=("SELECT",), keyspace="ks", table="nope",
                                           cmd_id=None))[0] == "NOT_FOUND"
    code, message = refused(state, GrantPermissions(role="alice", permissions=("EXECUTE",), cmd_id=None))
    assert code == "INVALID_ARGUMENT" and "SELECT, MODIFY, CREATE, ALTER, DROP" in message


def test_dropping_a_table_or_keyspace_drops_its_grants(state):
    applied(state, GrantPermissions(role="alice", permissions=("SELECT",), keyspace="ks", table="t", cmd_id=None))
    applied(state, GrantPermissions(role="alice", permissions=("SELECT",), keyspace="other", cmd_id=None))
    applied(state, DropTable(keyspace="ks", name="t", cmd_id=None))
    applied(state, CreateTable(id="c" * 32, keyspace="ks", name="t", columns=(ColumnSpec("k", "int"),),
                               partition_key=("k",), clustering_key=(), cmd_id=None))
    assert not auth.may(state, ALICE, "SELECT", ("ks", "t"))  # a re-created table starts with no grant
    applied(state, DropKeyspace(name="other", cmd_id=None))
    assert state.grants == {}


def test_roles_are_created_altered_and_dropped_once(state):
    assert refused(state, CreateRole(name="alice", cmd_id=None))[0] == "ALREADY_EXISTS"
    assert applied(state, CreateRole(name="alice", if_not_exists=True, cmd_id=None)) == "exists"
    applied(state, AlterRole(name="alice", login=False, cmd_id=None))
    assert state.roles["alice"].password_hash == "scrypt$x"  # what is not given is kept
    with pytest.raises(Unauthenticated, match="may not log in"):
        auth.login_role(state, "alice")
    applied(state, GrantPermissions(role="alice", permissions=("SELECT",), cmd_id=None))
    applied(state, DropRole(name="alice", cmd_id=None))
    assert "alice" not in state.roles and state.grants == {}
    assert applied(state, DropRole(name="alice", if_exists=True, cmd_id=None)) == "absent"
    with pytest.raises(Unauthenticated, match="no role 'alice'"):
        auth.login_role(state, "alice")


def test_a_password_hash_never_shows_in_a_repr(state):
    assert "scrypt$x" not in repr(state.roles["alice"])
    assert "scrypt$x" not in repr(CreateRole(name="a", password_hash="scrypt$x", cmd_id=None))


def test_roles_and_grants_survive_a_snapshot(state):
    applied(state, GrantPermissions(role="alice", permissions=("DROP",), keyspace="ks", cmd_id=None))
    restored = pickle.loads(pickle.dumps(state))
    assert restored.roles == state.roles and restored.grants == state.grants


def test_a_snapshot_from_before_roles_restores_root():
    old = Group0State()
    saved = {k: v for k, v in old.__dict__.items() if k not in ("roles", "grants")}
    restored = Group0State.__new__(Group0State)
    restored.__setstate__(saved)
    assert auth.is_superuser(restored, Principal("root")) and restored.grants == {}


def test_the_cluster_itself_is_unrestricted(state):
    assert auth.may(state, auth.CLUSTER, "DROP", auth.ALL_KEYSPACES)


OPERATIONS = st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from(auth.PERMISSIONS), min_size=1, max_size=3),
                                st.sampled_from([(None, None), ("ks", None), ("ks", "t"), ("other", "t")])),
                      max_size=12)


@settings(max_examples=150, deadline=None)
@given(OPERATIONS)
def test_a_permission_holds_exactly_when_a_grant_on_an_enclosing_resource_remains(operations):
    """Against a model: the set of (permission, resource) granted and not revoked since."""
    state = with_two_tables()
    applied(state, CreateRole(name="alice", login=True, cmd_id=None))
    model: set[tuple[str, tuple]] = set()
    for is_grant, permissions, (keyspace, table) in operations:
        command = GrantPermissions if is_grant else RevokePermissions
        applied(state, command(role="alice", permissions=tuple(permissions), keyspace=keyspace, table=table,
                               cmd_id=None))
        change = {(p, (keyspace, table)) for p in permissions}
        model = model | change if is_grant else model - change
    for permission in auth.PERMISSIONS:
        for resource in [(None, None), ("ks", None), ("ks", "t"), ("other", None), ("other", "t")]:
            expected = any((permission, outer) in model for outer in auth.enclosing(resource))
            assert auth.may(state, ALICE, permission, resource) == expected


def test_role_commands_are_authorized_by_group0_when_they_apply_against_the_caller_of_that_moment():
    state = Group0State()
    applied(state, CreateRole(name="boss", login=True, superuser=True, cmd_id=None))
    checked_on_a_lagging_node = CreateRole(name="mallory", login=True, superuser=True, caller="boss", cmd_id=None)
    applied(state, AlterRole(name="boss", superuser=False, cmd_id=None))  # demoted meanwhile, by the cluster
    assert refused(state, checked_on_a_lagging_node)[0] == "PERMISSION_DENIED"
    assert "mallory" not in state.roles
    for command in (GrantPermissions(role="boss", permissions=("SELECT",), caller="boss", cmd_id=None),
                    RevokePermissions(role="boss", permissions=("SELECT",), caller="boss", cmd_id=None),
                    DropRole(name="root", caller="boss", cmd_id=None),
                    AlterRole(name="boss", superuser=True, caller="boss", cmd_id=None)):
        code, message = refused(state, command)
        assert code == "PERMISSION_DENIED" and "needs a superuser; role 'boss' is not one" in message
    applied(state, AlterRole(name="boss", password_hash="scrypt$new", caller="boss", cmd_id=None))  # its own password
    assert applied(state, CreateRole(name="carol", caller="root", cmd_id=None)) == "created"
    assert refused(state, DropRole(name="root", caller="root", cmd_id=None))[0] == "INVALID_ARGUMENT"
