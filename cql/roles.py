"""Role statements (CREATE/ALTER/DROP ROLE, GRANT, REVOKE, LIST ROLES, LIST PERMISSIONS) as group0 commands.

A password is hashed here, on the node that runs the statement (scrypt with a random salt), and only its hash
goes into the command: no journal, snapshot, log or status ever holds it. Changing roles and grants needs a
superuser; a role may change its own password, and list its own roles and permissions.
"""
from __future__ import annotations

from common import passwords
from coordinator.core import auth
from coordinator.core.auth import Principal, Resource
from coordinator.core.commands import AlterRole, Command, CreateRole, DropRole, GrantPermissions, RevokePermissions
from coordinator.core.errors import InvalidArgument, PermissionDenied

from . import ast
from .catalog import Group0Client
from .ddl import new_id
from .result import Result

ROLE_TIMEOUT = 20.0


class RoleStatements:
    """Runs the role statements for a principal. The superuser checks here answer at once from this node's state;
    group0 checks them again when the command applies (its `caller`), against the state of that moment."""

    def __init__(self, group0: Group0Client):
        self._group0 = group0

    def run(self, principal: Principal, statement: ast.Statement) -> Result:
        return _HANDLERS[type(statement)](self, principal, statement)

    def _create_role(self, principal: Principal, s: ast.CreateRole) -> Result:
        self._require_superuser(principal, "CREATE ROLE")
        value = self._propose(CreateRole(name=s.name, password_hash=_hashed(s.password) or "", login=bool(s.login),
                                         superuser=bool(s.superuser), if_not_exists=s.if_not_exists,
                                         caller=principal.role, cmd_id=new_id()))
        if value == "exists":
            return Result(message=f"role {s.name} already exists (IF NOT EXISTS): nothing done")
        return Result(message=f"created role {s.name}")

    def _alter_role(self, principal: Principal, s: ast.AlterRole) -> Result:
        own_password_only = principal.role == s.name and s.login is None and s.superuser is None
        if not own_password_only:
            self._require_superuser(principal, "ALTER ROLE (other than of one's own password)")
        self._propose(AlterRole(name=s.name, password_hash=_hashed(s.password), login=s.login, superuser=s.superuser,
                                caller=principal.role, cmd_id=new_id()))
        return Result(message=f"altered role {s.name}")

    def _drop_role(self, principal: Principal, s: ast.DropRole) -> Result:
        self._require_superuser(principal, "DROP ROLE")
        if principal.role == s.name:
            raise InvalidArgument(f"role {s.name} cannot drop itself; log in as another superuser")
        value = self._propose(DropRole(name=s.name, if_exists=s.if_exists, caller=principal.role, cmd_id=new_id()))
        if value == "absent":
            return Result(message=f"role {s.name} does not exist (IF EXISTS): nothing done")
        return Result(message=f"dropped role {s.name}")

    def _grant(self, principal: Principal, s: ast.Grant) -> Result:
        return self._change_grants(principal, s, GrantPermissions, "granted", "to")

    def _revoke(self, principal: Principal, s: ast.Revoke) -> Result:
        return self._change_grants(principal, s, RevokePermissions, "revoked", "from")

    def _change_grants(self, principal: Principal, s: ast.Grant | ast.Revoke, command: type[Command], done: str,
                       preposition: str) -> Result:
        self._require_superuser(principal, type(s).__name__.upper())
        keyspace, table = _resource(s.resource)
        self._propose(command(role=s.role, permissions=s.permissions, keyspace=keyspace, table=table,
                              caller=principal.role, cmd_id=new_id()))
        return Result(message=f"{done} {', '.join(s.permissions)} on {auth.resource_name((keyspace, table))} "
                              f"{preposition} {s.role}")

    def _list_roles(self, principal: Principal, s: ast.ListRoles) -> Result:
        def rows(state) -> list[list]:
            everyone = auth.is_superuser(state, principal)
            return [[r.name, r.superuser, r.login] for name, r in sorted(state.roles.items())
                    if everyone or name == principal.role]
        return Result(columns=[("role", "text"), ("super", "boolean"), ("login", "boolean")],
                      rows=self._group0.read(rows))

    def _list_permissions(self, principal: Principal, s: ast.ListPermissions) -> Result:
        resource = None if s.resource is None else _resource(s.resource)

        def rows(state) -> list[list]:
            role = s.role
            if not auth.is_superuser(state, principal):
                if role not in (None, principal.role):
                    raise PermissionDenied(f"{principal} may list only its own permissions (LIST ... OF "
                                           f"{principal.role}); a superuser may list any role's")
                role = principal.role
            return [list(row) for row in auth.permission_rows(state, role, resource, s.permissions)]
        return Result(columns=[("role", "text"), ("resource", "text"), ("permission", "text")],
                      rows=self._group0.read(rows))

    def _require_superuser(self, principal: Principal, action: str) -> None:
        self._group0.read(lambda state: auth.require_superuser(state, principal, action))

    def _propose(self, command: Command) -> object:
        outcome = self._group0.propose(command, timeout=ROLE_TIMEOUT)
        if not outcome.ok:
            raise outcome.error
        return outcome.value


def _hashed(password: str | None) -> str | None:
    if password is None:
        return None
    try:
        return passwords.hash_password(password)
    except passwords.PasswordError as error:
        raise InvalidArgument(str(error)) from None


def _resource(resource: ast.RoleResource) -> Resource:
    return (resource.keyspace, resource.table)



_HANDLERS = {
    ast.CreateRole: RoleStatements._create_role,
    ast.AlterRole: RoleStatements._alter_role,
    ast.DropRole: RoleStatements._drop_role,
    ast.Grant: RoleStatements._grant,
    ast.Revoke: RoleStatements._revoke,
    ast.ListRoles: RoleStatements._list_roles,
    ast.ListPermissions: RoleStatements._list_permissions,
}
ROLE_STATEMENTS = tuple(_HANDLERS)
