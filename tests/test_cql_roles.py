"""Role statements and per-statement permissions through the executor (real group0 state, recording replicas)."""
from __future__ import annotations

import pytest

from common import passwords
from coordinator.core.auth import CLUSTER, Principal
from coordinator.core.errors import InvalidArgument, PermissionDenied

from .fakes import FakeGroup0
from .test_cql_prepared import schema_on

ALICE = Principal("alice")


@pytest.fixture
def executor():
    group0 = FakeGroup0()
    executor, _ = schema_on(group0)
    executor.execute("CREATE KEYSPACE other WITH replication = {'rf': 1} AND tablets = {'initial': 1}")
    executor.execute("CREATE TABLE other.t (p int PRIMARY KEY, v text)")
    executor.execute("CREATE ROLE alice WITH PASSWORD = 'secret-1' AND LOGIN = true")
    executor.group0 = group0
    return executor


def roles(executor) -> dict:
    return executor.group0.read(lambda state: dict(state.roles))


def test_create_role_stores_a_salted_hash_and_never_the_password(executor):
    stored = roles(executor)["alice"].password_hash
    assert stored.startswith("scrypt$") and "secret-1" not in stored
    assert passwords.verify("secret-1", stored) and not passwords.verify("secret-2", stored)
    executor.execute("CREATE ROLE bob WITH PASSWORD = 'secret-1' AND LOGIN = true")
    assert roles(executor)["bob"].password_hash != stored  # salted


@pytest.mark.parametrize("statement, permission, resource", [
    ("SELECT * FROM ks.t", "SELECT", "TABLE ks.t"),
    ("INSERT INTO ks.t (p, c, v) VALUES (1, 1, 'a')", "MODIFY", "TABLE ks.t"),
    ("DELETE FROM ks.t WHERE p = 1 AND c = 1", "MODIFY", "TABLE ks.t"),
    ("CREATE KEYSPACE third WITH replication = {'rf': 1}", "CREATE", "ALL KEYSPACES"),
    ("CREATE TABLE ks.u (k int PRIMARY KEY)", "CREATE", "KEYSPACE ks"),
    ("ALTER TABLE ks.t ADD w int", "ALTER", "TABLE ks.t"),
    ("DROP TABLE ks.t", "DROP", "TABLE ks.t"),
    ("DROP KEYSPACE ks", "DROP", "KEYSPACE ks"),
    ("CREATE INDEX ON ks.t (v)", "ALTER", "TABLE ks.t"),
])
def test_each_statement_needs_its_permission(executor, statement, permission, resource):
    with pytest.raises(PermissionDenied, match=f"no {permission} permission on {resource}"):
        executor.execute(statement, principal=ALICE)


def test_a_view_is_read_with_its_base_tables_grant(executor):
    executor.execute("CREATE MATERIALIZED VIEW ks.by_v AS SELECT * FROM ks.t WHERE v IS NOT NULL AND c IS NOT NULL "
                     "PRIMARY KEY (v, p, c)")
    executor.execute("GRANT SELECT ON TABLE ks.t TO alice")
    executor.execute("SELECT * FROM ks.by_v ALLOW STALE", principal=ALICE)
    with pytest.raises(PermissionDenied, match="ALTER permission on TABLE ks.t"):
        executor.execute("DROP MATERIALIZED VIEW ks.by_v", principal=ALICE)


def test_grant_and_revoke_change_what_a_role_may_do(executor):
    executor.execute("GRANT SELECT ON KEYSPACE ks TO alice")
    executor.execute("SELECT * FROM ks.t", principal=ALICE)
    with pytest.raises(PermissionDenied):
        executor.execute("SELECT * FROM other.t", principal=ALICE)
    executor.execute("GRANT ALL PERMISSIONS ON ALL KEYSPACES TO alice")
    executor.execute("INSERT INTO other.t (p, v) VALUES (1, 'a')", principal=ALICE)
    executor.execute("REVOKE ALL ON ALL KEYSPACES FROM alice")
    with pytest.raises(PermissionDenied):
        executor.execute("INSERT INTO other.t (p, v) VALUES (1, 'a')", principal=ALICE)
    executor.execute("SELECT * FROM ks.t", principal=ALICE)  # the keyspace grant stays


def test_only_a_superuser_manages_roles_but_a_role_changes_its_own_password(executor):
    for statement in ("CREATE ROLE eve WITH LOGIN = true", "DROP ROLE alice", "GRANT SELECT ON KEYSPACE ks TO alice",
                      "ALTER ROLE alice WITH SUPERUSER = true", "ALTER ROLE root WITH PASSWORD = 'x'"):
        with pytest.raises(PermissionDenied, match="needs a superuser"):
            executor.execute(statement, principal=ALICE)
    before = roles(executor)["alice"].password_hash
    executor.execute("ALTER ROLE alice WITH PASSWORD = 'secret-2'", principal=ALICE)
    assert passwords.verify("secret-2", roles(executor)["alice"].password_hash) and before != \
        roles(executor)["alice"].password_hash
    executor.execute("ALTER ROLE alice WITH SUPERUSER = true")
    executor.execute("CREATE ROLE eve", principal=ALICE)


def test_list_roles_and_permissions_show_a_role_its_own_and_a_superuser_everything(executor):
    executor.execute("GRANT SELECT ON KEYSPACE ks TO alice")
    executor.execute("CREATE ROLE bob")
    executor.execute("GRANT MODIFY ON TABLE other.t TO bob")
    assert executor.execute("LIST ROLES").rows == [["alice", False, True], ["bob", False, False], ["root", True, True]]
    assert executor.execute("LIST ROLES", principal=ALICE).rows == [["alice", False, True]]
    assert executor.execute("LIST ALL PERMISSIONS").rows == [["alice", "KEYSPACE ks", "SELECT"],
                                                            ["bob", "TABLE other.t", "MODIFY"]]
    assert executor.execute("LIST ALL PERMISSIONS ON TABLE ks.t", principal=ALICE).rows == [
        ["alice", "KEYSPACE ks", "SELECT"]]
    with pytest.raises(PermissionDenied, match="only its own"):
        executor.execute("LIST ALL PERMISSIONS OF bob", principal=ALICE)


def test_role_statements_refuse_bind_values_and_preparation(executor):
    with pytest.raises(InvalidArgument, match="cannot be prepared"):
        executor.prepare("CREATE ROLE x WITH PASSWORD = 'y'")
    with pytest.raises(InvalidArgument, match="no bind values"):
        executor.execute("LIST ROLES", [[1]])


def test_the_cluster_principal_may_do_anything(executor):
    executor.execute("DROP TABLE other.t", principal=CLUSTER)


def test_a_statement_kind_no_permission_rule_names_is_refused_to_all_but_the_cluster():
    from dataclasses import dataclass

    from cql.authorization import StatementAuthorization

    @dataclass(frozen=True)
    class Truncate:  # a statement kind added to the grammar without a rule
        table: str

    authorization = StatementAuthorization(catalog=None)
    authorization.check(CLUSTER, Truncate("ks.t"))
    with pytest.raises(PermissionDenied, match="Truncate is not open to anyone but the cluster"):
        authorization.check(ALICE, Truncate("ks.t"))
