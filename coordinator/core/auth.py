"""Roles, their password hashes and their grants in group0, and the pure rules of who may do what.

A role holds a salted slow hash of its password (made by the proposing node; the password itself never reaches
group0), whether it may log in and whether it is a superuser. Permissions are granted on a resource: every
keyspace, one keyspace or one table, and a permission on a resource holds for everything inside it. The
superuser `root` always exists (as CockroachDB's root): it logs in with its client certificate, and by password
once one was set with ALTER ROLE. Grants on a dropped keyspace or table go with it, so a table re-created under
the same name starts with none.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .commands import AlterRole, CreateRole, DropRole, GrantPermissions, RevokePermissions
from .errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, Unauthenticated

if TYPE_CHECKING:
    from .state import Group0State

PERMISSIONS = ("SELECT", "MODIFY", "CREATE", "ALTER", "DROP")
ROOT = "root"

Resource = tuple  # (keyspace, table): (None, None) is every keyspace, (ks, None) one keyspace, (ks, t) one table
ALL_KEYSPACES: Resource = (None, None)


@dataclass(frozen=True)
class Role:
    name: str
    password_hash: str = field(default="", repr=False)  # "": no password login
    login: bool = True
    superuser: bool = False


@dataclass(frozen=True)
class Principal:
    """Who runs a request: a role, checked against its grants, or (role None) the cluster itself: a node, or any
    caller of a node serving without authentication (--insecure), which may do anything."""

    role: str | None

    @property
    def unrestricted(self) -> bool:
        return self.role is None

    def __str__(self) -> str:
        return "the cluster" if self.role is None else f"role {self.role!r}"


CLUSTER = Principal(None)


def initial_roles() -> dict[str, Role]:
    return {ROOT: Role(ROOT, login=True, superuser=True)}


def resource_name(resource: Resource) -> str:
    keyspace, table = resource
    if keyspace is None:
        return "ALL KEYSPACES"
    return f"KEYSPACE {keyspace}" if table is None else f"TABLE {keyspace}.{table}"


def enclosing(resource: Resource) -> list[Resource]:
    """`resource` and every resource that contains it, innermost first."""
    keyspace, table = resource
    chain = [resource] if keyspace is not None else []
    if table is not None:
        chain.append((keyspace, None))
    return chain + [ALL_KEYSPACES]


# ---------------------------------------------------------------- queries


def login_role(state: Group0State, name: str) -> Role:
    """The role `name` as a login, or Unauthenticated saying why it cannot log in."""
    role = state.roles.get(name)
    if role is None:
        raise Unauthenticated(f"no role {name!r}: a superuser creates it with CREATE ROLE {name} WITH LOGIN = true")
    if not role.login:
        raise Unauthenticated(f"role {name!r} may not log in (ALTER ROLE {name} WITH LOGIN = true allows it)")
    return role


def is_superuser(state: Group0State, principal: Principal) -> bool:
    if principal.unrestricted:
        return True
    role = state.roles.get(principal.role)
    return role is not None and role.superuser


def granted(state: Group0State, role: str, resource: Resource) -> frozenset[str]:
    return state.grants.get(role, {}).get(resource, frozenset())


def may(state: Group0State, principal: Principal, permission: str, resource: Resource) -> bool:
    if is_superuser(state, principal):
        return True
    return any(permission in granted(state, principal.role, outer) for outer in enclosing(resource))


def authorize(state: Group0State, principal: Principal, permission: str, resource: Resource) -> None:
    """PermissionDenied naming the permission, the resource and the GRANT that would allow it."""
    if not may(state, principal, permission, resource):
        name = resource_name(resource)
        raise PermissionDenied(f"{principal} has no {permission} permission on {name}; a superuser can allow it "
                               f"with GRANT {permission} ON {name} TO {principal.role}")


def require_superuser(state: Group0State, principal: Principal, action: str) -> None:
    if not is_superuser(state, principal):
        raise PermissionDenied(f"{action} needs a superuser; {principal} is not one")


def permission_rows(state: Group0State, role: str | None = None, resource: Resource | None = None,
                    permissions: tuple[str, ...] = PERMISSIONS) -> list[tuple[str, str, str]]:
    """(role, resource, permission) of every grant matching the filters, sorted; `resource` also matches the
    grants on the resources that contain it, as they apply to it."""
    wanted = None if resource is None else set(enclosing(resource))
    rows = []
    for name, by_resource in state.grants.items():
        if role is not None and name != role:
            continue
        for on, held in by_resource.items():
            if wanted is None or on in wanted:
                rows.extend((name, resource_name(on), p) for p in held if p in permissions)
    return sorted(rows, key=lambda row: (row[0], row[1], PERMISSIONS.index(row[2])))


# ---------------------------------------------------------------- commands


def check_caller(state: Group0State, caller: str | None, action: str) -> None:
    """A role command's caller must be a superuser as group0 has it when the command applies (a role demoted a moment
    ago cannot act through a node that has not seen it yet); None is the cluster."""
    require_superuser(state, CLUSTER if caller is None else Principal(caller), action)


def create_role(state: Group0State, cmd: CreateRole) -> str:
    check_caller(state, cmd.caller, "CREATE ROLE")
    name = _role_name(cmd.name)
    if name in state.roles:
        if cmd.if_not_exists:
            return "exists"
        raise AlreadyExists(f"role {name!r} already exists (ALTER ROLE changes it)")
    state.roles[name] = Role(name, cmd.password_hash, cmd.login, cmd.superuser)
    return "created"


def alter_role(state: Group0State, cmd: AlterRole) -> str:
    if cmd.caller != cmd.name or cmd.login is not None or cmd.superuser is not None:
        check_caller(state, cmd.caller, "ALTER ROLE (other than of one's own password)")
    role = _existing(state, cmd.name)
    if role.name == ROOT and (cmd.superuser is False or cmd.login is False):
        raise FailedPrecondition("root stays a superuser that may log in; create another role to restrict")
    state.roles[role.name] = Role(
        role.name,
        role.password_hash if cmd.password_hash is None else cmd.password_hash,
        role.login if cmd.login is None else cmd.login,
        role.superuser if cmd.superuser is None else cmd.superuser)
    return "altered"


def drop_role(state: Group0State, cmd: DropRole) -> str:
    check_caller(state, cmd.caller, "DROP ROLE")
    if cmd.caller == cmd.name:
        raise InvalidArgument(f"role {cmd.name} cannot drop itself; log in as another superuser")
    if cmd.name == ROOT:
        raise FailedPrecondition("root cannot be dropped")
    if cmd.name not in state.roles and cmd.if_exists:
        return "absent"
    _existing(state, cmd.name)
    del state.roles[cmd.name]
    state.grants.pop(cmd.name, None)
    return "dropped"


def grant(state: Group0State, cmd: GrantPermissions) -> str:
    check_caller(state, cmd.caller, "GRANT")
    role, resource, permissions = _grant_parts(state, cmd)
    by_resource = state.grants.setdefault(role.name, {})
    by_resource[resource] = by_resource.get(resource, frozenset()) | permissions
    return "granted"


def revoke(state: Group0State, cmd: RevokePermissions) -> str:
    check_caller(state, cmd.caller, "REVOKE")
    role, resource, permissions = _grant_parts(state, cmd)
    by_resource = state.grants.get(role.name, {})
    left = by_resource.get(resource, frozenset()) - permissions
    if left:
        by_resource[resource] = left
    else:
        by_resource.pop(resource, None)
    if not by_resource:
        state.grants.pop(role.name, None)
    return "revoked"


def forget_resource(state: Group0State, keyspace: str, table: str | None = None) -> None:
    """Drop every grant on a dropped keyspace (and its tables) or table."""
    for role in list(state.grants):
        by_resource = state.grants[role]
        for on in [on for on in by_resource if on[0] == keyspace and (table is None or on[1] == table)]:
            del by_resource[on]
        if not by_resource:
            del state.grants[role]


def _grant_parts(state: Group0State, cmd) -> tuple[Role, Resource, frozenset[str]]:
    role = _existing(state, cmd.role)
    unknown = [p for p in cmd.permissions if p not in PERMISSIONS]
    if unknown or not cmd.permissions:
        raise InvalidArgument(f"unknown permission {', '.join(unknown) or '(none given)'}; the permissions are "
                              f"{', '.join(PERMISSIONS)} and ALL")
    return role, _existing_resource(state, cmd.keyspace, cmd.table), frozenset(cmd.permissions)


def _existing_resource(state: Group0State, keyspace: str | None, table: str | None) -> Resource:
    if keyspace is None:
        if table is not None:
            raise InvalidArgument(f"table {table!r} needs its keyspace: TABLE keyspace.{table}")
        return ALL_KEYSPACES
    if table is None:
        state.require_keyspace(keyspace)
    else:
        state.require_table(keyspace, table)
    return (keyspace, table)


def _existing(state: Group0State, name: str) -> Role:
    role = state.roles.get(name)
    if role is None:
        raise NotFound(f"role {name!r} does not exist (LIST ROLES shows the roles)")
    return role


def _role_name(name: str) -> str:
    if not name or len(name) > 256 or any(ch in name for ch in "\0\n\r"):
        raise InvalidArgument(f"a role name has 1 to 256 characters and no control characters, got {name!r}")
    return name
