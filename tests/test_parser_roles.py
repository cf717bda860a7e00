"""Tests for the role and permission statements of cql: every form, the AST values, errors and hidden passwords."""

from __future__ import annotations

import dataclasses

import pytest

from cql import (
    PERMISSIONS,
    AlterRole,
    ColumnDef,
    CqlSyntaxError,
    CreateRole,
    DropRole,
    Grant,
    Insert,
    ListPermissions,
    ListRoles,
    QualifiedName,
    Relation,
    Revoke,
    RoleResource,
    Select,
    parse,
)

ALL_KEYSPACES = RoleResource()
KS = RoleResource("ks")
KS_T = RoleResource("ks", "t")


def _error(text: str) -> str:
    with pytest.raises(CqlSyntaxError) as info:
        parse(text)
    return str(info.value)


# ---------------------------------------------------------------------- roles


def test_create_role_bare():
    assert parse("CREATE ROLE alice") == CreateRole(
        name="alice", password=None, login=None, superuser=None, if_not_exists=False
    )


def test_create_role_with_every_option():
    stmt = parse("CREATE ROLE IF NOT EXISTS alice WITH PASSWORD = 'it''s' AND LOGIN = true AND SUPERUSER = false;")
    assert stmt == CreateRole(name="alice", password="it's", login=True, superuser=False, if_not_exists=True)


def test_create_role_options_in_any_order_and_case():
    stmt = parse("create role Alice with superuser = TRUE and Login = False and pAsSwOrD = 'Pw'")
    assert stmt == CreateRole(name="alice", password="Pw", login=False, superuser=True, if_not_exists=False)


@pytest.mark.parametrize(
    "name, expected",
    [("Alice", "alice"), ('"Alice"', "Alice"), ('"a""b"', 'a"b'), ("'Alice'", "Alice"), ("'o''brien'", "o'brien")],
)
def test_role_names(name, expected):
    assert parse(f"CREATE ROLE {name}").name == expected
    assert parse(f"DROP ROLE {name}").name == expected
    assert parse(f"GRANT SELECT ON ks.t TO {name}").role == expected
    assert parse(f"LIST ALL OF {name}").role == expected


def test_alter_role():
    assert parse("ALTER ROLE bob WITH PASSWORD = 'new'") == AlterRole(
        name="bob", password="new", login=None, superuser=None
    )
    assert parse("alter role 'Bob' with login = false and superuser = true") == AlterRole(
        name="Bob", password=None, login=False, superuser=True
    )


def test_drop_role():
    assert parse("DROP ROLE bob") == DropRole(name="bob", if_exists=False)
    assert parse("drop role if exists 'Bob';") == DropRole(name="Bob", if_exists=True)


def test_password_is_not_in_repr():
    stmt = parse("CREATE ROLE a WITH PASSWORD = 'sekrit99' AND LOGIN = true")
    assert stmt.password == "sekrit99"
    assert "sekrit99" not in repr(stmt)
    assert "sekrit99" not in repr(parse("ALTER ROLE a WITH PASSWORD = 'sekrit99'"))
    assert "login=True" in repr(stmt)


def test_role_ast_is_frozen():
    stmt = parse("CREATE ROLE a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        stmt.login = True  # type: ignore[misc]


# ---------------------------------------------------------------- permissions


@pytest.mark.parametrize(
    "permission, expected",
    [
        ("SELECT", ("SELECT",)),
        ("modify", ("MODIFY",)),
        ("Create", ("CREATE",)),
        ("ALTER", ("ALTER",)),
        ("drop", ("DROP",)),
        ("ALL", PERMISSIONS),
        ("all permissions", PERMISSIONS),
    ],
)
def test_permissions(permission, expected):
    assert parse(f"GRANT {permission} ON ks.t TO r").permissions == expected
    assert parse(f"REVOKE {permission} ON ks.t FROM r").permissions == expected
    assert parse(f"LIST {permission}").permissions == expected


def test_all_is_the_five_permissions_in_order():
    assert PERMISSIONS == ("SELECT", "MODIFY", "CREATE", "ALTER", "DROP")


@pytest.mark.parametrize(
    "resource, expected",
    [
        ("ALL KEYSPACES", ALL_KEYSPACES),
        ("all keyspaces", ALL_KEYSPACES),
        ("KEYSPACE ks", KS),
        ("keyspace KS", KS),
        ('KEYSPACE "Ks"', RoleResource("Ks")),
        ("TABLE ks.t", KS_T),
        ("ks.t", KS_T),
        ('"Ks"."T"', RoleResource("Ks", "T")),
    ],
)
def test_resources(resource, expected):
    assert parse(f"GRANT SELECT ON {resource} TO r").resource == expected
    assert parse(f"REVOKE SELECT ON {resource} FROM r").resource == expected
    assert parse(f"LIST SELECT ON {resource}").resource == expected


def test_grant_and_revoke():
    assert parse("GRANT MODIFY ON KEYSPACE ks TO writer;") == Grant(("MODIFY",), KS, "writer")
    assert parse("revoke all on all keyspaces from 'Admin'") == Revoke(PERMISSIONS, ALL_KEYSPACES, "Admin")


def test_list_roles():
    assert parse("LIST ROLES") == ListRoles()
    assert parse("list roles;") == ListRoles()


def test_list_permissions():
    assert parse("LIST ALL") == ListPermissions(PERMISSIONS, None, None)
    assert parse("LIST ALL PERMISSIONS;") == ListPermissions(PERMISSIONS, None, None)
    assert parse("LIST SELECT ON ks.t") == ListPermissions(("SELECT",), KS_T, None)
    assert parse("LIST DROP OF bob") == ListPermissions(("DROP",), None, "bob")
    assert parse("list all permissions on keyspace ks of 'Bob'") == ListPermissions(PERMISSIONS, KS, "Bob")


def test_new_keywords_still_usable_as_names():
    names = "role, login, password, list"
    create = parse(
        "CREATE TABLE ks.t (role int, login text, password text, list int, superuser int, permissions int, "
        "keyspaces int, grant int, revoke int, modify int, to int, of int, roles int, all int, "
        "PRIMARY KEY (role, login))"
    )
    assert create.columns[:4] == (
        ColumnDef("role", "int"), ColumnDef("login", "text"), ColumnDef("password", "text"), ColumnDef("list", "int")
    )
    assert create.clustering_key == ("login",)
    assert parse(f"INSERT INTO ks.t ({names}) VALUES (1, 'a', 'b', 2)") == Insert(
        QualifiedName("ks", "t"), ("role", "login", "password", "list"), (1, "a", "b", 2), None
    )
    select = parse(f"SELECT {names}, to, of, all FROM role.list WHERE role = 1 AND password = 'x'")
    assert isinstance(select, Select)
    assert select.table == QualifiedName("role", "list")
    assert select.columns == ("role", "login", "password", "list", "to", "of", "all")
    assert select.where == (Relation("role", "=", 1), Relation("password", "=", "x"))


def test_keywords_usable_as_names_in_role_statements():
    assert parse("GRANT SELECT ON role.to TO list") == Grant(("SELECT",), RoleResource("role", "to"), "list")
    assert parse("LIST ALL ON grant.permissions OF of").role == "of"


# --------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("CREATE ROLE a WITH LOGIN = true AND LOGIN = false", ["line 1:37", "LOGIN", "more than once"]),
        ("CREATE ROLE a WITH password = 'x' AND PASSWORD = 'y'", ["PASSWORD", "more than once"]),
        ("ALTER ROLE a WITH superuser = true AND superuser = true", ["SUPERUSER", "more than once"]),
        ("CREATE ROLE a WITH options = 1", ["line 1:20", "unknown role option 'options'", "PASSWORD", "LOGIN",
                                            "SUPERUSER"]),
        ("CREATE ROLE a WITH PASSWORD = ?", ["line 1:31", "PASSWORD", "string", "bind marker"]),
        ("CREATE ROLE a WITH PASSWORD = 1234", ["line 1:31", "PASSWORD", "string"]),
        ("CREATE ROLE a WITH PASSWORD = true", ["PASSWORD", "string"]),
        ("CREATE ROLE a WITH LOGIN = 'true'", ["line 1:28", "LOGIN", "true or false"]),
        ("CREATE ROLE a WITH SUPERUSER = 1", ["SUPERUSER", "true or false"]),
        ("CREATE ROLE a WITH LOGIN = ?", ["LOGIN", "true or false"]),
        ("CREATE ROLE a WITH LOGIN = yes", ["'yes'", "literal"]),
        ("CREATE ROLE a b", ["line 1:15", "'b'", "WITH"]),
        ("CREATE ROLE", ["end of input", "identifier", "string"]),
        ("ALTER ROLE a", ["end of input", "WITH"]),
        ("DROP ROLE", ["end of input", "identifier"]),
        ("GRANT SELECT ON t TO r", ["line 1:17", "'t'", "keyspace.table"]),
        ("GRANT SELECT ON TABLE t TO r", ["line 1:23", "'t'", "keyspace.table"]),
        ("LIST ALL ON t", ["'t'", "keyspace.table"]),
        ("GRANT EXECUTE ON ks.t TO r", ["line 1:7", "'EXECUTE'", "SELECT", "MODIFY", "ALL"]),
        ("GRANT SELECT PERMISSION ON ks.t TO r", ["'PERMISSION'", "ON"]),
        ("GRANT SELECT ON ks.t FROM r", ["'FROM'", "TO"]),
        ("REVOKE SELECT ON ks.t TO r", ["'TO'", "FROM"]),
        ("GRANT SELECT TO r", ["'TO'", "ON"]),
        ("GRANT SELECT ON ALL TO r", ["'TO'", "KEYSPACES"]),
        ("GRANT SELECT ON ks.t", ["end of input", "TO"]),
        ("LIST", ["end of input", "ROLES", "ALL", "SELECT"]),
        ("LIST ROLES OF bob", ["'OF'"]),
        ("LIST SELECT OF bob ON ks.t", ["'ON'"]),
    ],
)
def test_errors(text, fragments):
    message = _error(text)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "Token(" not in message and "Expected one of" not in message


# ----------------------------------------------------------- hidden passwords


@pytest.mark.parametrize(
    "text",
    [
        "CREATE ROLE a WITH PASSWORD = 'sekrit99' AND LOGIN = maybe",
        "CREATE ROLE a WITH PASSWORD 'sekrit99'",
        "CREATE ROLE a WITH PASSWORD = 'sekrit99' 'sekrit99'",
        "CREATE ROLE a WITH PASSWORD = 'x' AND LOGIN = 'sekrit99'",
        "CREATE ROLE a WITH PASSWORD = 'x' AND 'sekrit99' = 1",
        "create role a with password = \"sekrit99\"",
        "CREATE ROLE a WITH PASSWORD = sekrit99",
        "CREATE ROLE a WITH PASSWORD = 99sekrit99",
        "CREATE ROLE a WITH PASSWORD = 'sekrit99",
        "  alter ROLE a WITH PASSWORD = 'sekrit99' LOGIN = true",
        "ALTER ROLE a WITH LOGIN = true AND PASSWORD 'sekrit99'",
        "CREATE ROLE a WITH PASSWORD = '" + "sekrit99" * 10 + "' x",
        "CREATE ROLE a WITH PASSWORD = 'x' AND LOGIN = '" + "sekrit99" * 10 + "'",
        "CREATE ROLE a WITH PASSWORD = 'x' '" + "sekrit99" * 10 + "'",
        "CREATE ROLE a WITH PASSWORD = 'x' \"" + "sekrit99" * 10 + "\"",
    ],
)
def test_syntax_errors_do_not_show_the_password(text):
    message = _error(text)
    assert "sekrit" not in message, message
    assert message.startswith("line 1:")


def test_quoted_text_in_a_role_statement_shows_masked():
    message = _error("CREATE ROLE a WITH PASSWORD = 'sekrit99' 'other'")
    assert "'***'" in message and "other" not in message


def test_other_tokens_of_a_role_statement_are_shown():
    assert "'maybe'" in _error("CREATE ROLE a WITH PASSWORD = 'sekrit99' AND LOGIN = maybe")
    assert "'LOGIN'" in _error("ALTER ROLE a WITH PASSWORD = 'sekrit99' LOGIN = true")


def test_strings_are_still_shown_in_other_statements():
    assert "'oops'" in _error("SELECT * FROM t WHERE a = 1 'oops'")
