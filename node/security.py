"""Transport security of a node: TLS with the cluster's certificates, who is calling, and what they may call.

A secure node serves gRPC over mutual TLS: every caller presents a certificate signed by the cluster's CA. It may
also serve a client port over TLS without client certificates, where a caller logs in with a role's name and
password (call metadata `vbc-user` and `vbc-password`). The node-to-node services (`Internode`, `Worker`) answer
node certificates only; a client certificate calling them is refused with PERMISSION_DENIED naming the method.
Every other call needs a login (a client certificate naming a role that may log in, or a password); the
administrative calls need a superuser. The node calls its peers with its own node certificate.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import math
import os
import threading
import weakref
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import grpc

from common import passwords
from coordinator.core import auth
from coordinator.core.auth import CLUSTER, Principal
from coordinator.core.errors import CoreError, ResourceExhausted, Unauthenticated
from common.certs import (
    CA_CERT,
    NODE_CERT,
    NODE_KEY,
    CertificateError,
    Identity,
    TlsMaterial,
    identity_of,
    node_tls_material,
)

log = logging.getLogger(__name__)

USER_KEY = "vbc-user"
PASSWORD_KEY = "vbc-password"

NODES = "a node of this cluster"  # node-to-node calls: a node certificate only
LOGIN = "a login"  # any role that may log in (statements are authorized one by one after it)
SUPERUSER = "a superuser"  # administrative calls


def _balancer_policy(request) -> str:
    return LOGIN if getattr(request, "action", "") == "status" else SUPERUSER  # its status needs a login only


def _build_config_policy(request) -> str:
    changes = request.chunk_rows or request.parallel_bases or request.HasField("rate_rows_per_s")
    return SUPERUSER if changes else LOGIN  # showing the settings needs a login only


# Who may call each method of every service a node serves: a method no policy names is refused (PERMISSION_DENIED),
# so a new RPC is closed until it is given one here (tests/test_node_authentication.py checks every method).
METHOD_POLICIES: dict[str, str | Callable[[object], str]] = {
    **{f"/vbc.v1.Client/{name}": LOGIN for name in ("Execute", "ExecuteStream", "Prepare", "Session")},
    **{f"/vbc.v1.Admin/{name}": LOGIN for name in ("Status", "Tablets", "Migration", "NodeState")},
    **{f"/vbc.v1.Admin/{name}": SUPERUSER
       for name in ("Inject", "CheckView", "MoveTablet", "ResizeTablets", "JoinCluster", "Decommission",
                    "PauseView")},
    "/vbc.v1.Admin/Balancer": _balancer_policy,
    "/vbc.v1.Admin/BuildConfig": _build_config_policy,
    **{f"/vbc.v1.Internode/{name}": NODES
       for name in ("ReplicaWrite", "ReplicaWrites", "ViewUpdate", "ViewUpdates", "Scan", "LocalStatus",
                    "SchemaBarrier", "MergeViewRows", "ReadRange", "StreamTablet", "CleanupTablet", "ReadTabletRows")},
    "/vbc.v1.Worker/WorkOnViewBuildingTasks": NODES,
    **{f"/grpc.health.v1.Health/{name}": LOGIN for name in ("Check", "List", "Watch")},
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": LOGIN,
}
VERIFIED_LOGINS = 1024  # password logins remembered, so that a session's calls do not each pay for scrypt


def load_node_material(certs_dir: Path) -> TlsMaterial:
    """The node's CA, certificate and key (CertificateError naming the file and what to do)."""
    missing = [name for name in (CA_CERT, NODE_CERT, NODE_KEY) if not (certs_dir / name).exists()]
    if missing:
        raise CertificateError(f"no node certificate in {certs_dir} ({', '.join(missing)} missing): make one with "
                               "`vbc certs create-node CA_DIR NODE_ID --host HOST --out DIR`, or start the node with "
                               "--insecure")
    return node_tls_material(certs_dir)


def server_credentials(material: TlsMaterial) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(material.private_key, material.certificate_chain)],
                                       root_certificates=material.root_certificates, require_client_auth=True)


def channel_credentials(material: TlsMaterial) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(**material._asdict())


@functools.lru_cache(maxsize=1024)
def _identity(pem: bytes) -> Identity | None:
    try:
        return identity_of(pem)
    except CertificateError:
        return None


def caller(context: grpc.ServicerContext) -> Identity | None:
    """Who called, from the certificate the caller presented (None: no certificate, or one naming nobody)."""
    certificates = context.auth_context().get("x509_pem_cert")
    return _identity(certificates[0]) if certificates else None


def client_server_credentials(material: TlsMaterial) -> grpc.ServerCredentials:
    """TLS that asks no client certificate: the client port, where callers log in by password."""
    return grpc.ssl_server_credentials([(material.private_key, material.certificate_chain)])


class LoginThrottle:
    """Failed password logins per client host, as a token bucket: `burst` failures at once, then one per `refill_s`
    seconds. A host out of tokens is refused before its password is checked, so guessing cannot keep a node's
    cores busy with scrypt (about 65 ms of CPU per check). Times are given, so the rule is testable."""

    def __init__(self, burst: int = 5, refill_s: float = 2.0, hosts: int = 4096):
        self._burst, self._refill_s, self._hosts = burst, refill_s, hosts
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # host -> (tokens, at)
        self._lock = threading.Lock()

    def wait_s(self, host: str, now: float) -> float:
        """0 when `host` may try a password now, else the seconds until it may."""
        with self._lock:
            tokens = self._tokens(host, now)
        return 0.0 if tokens >= 1 else (1 - tokens) * self._refill_s

    def failed(self, host: str, now: float) -> None:
        """`host` gave a wrong password (or a name that cannot log in)."""
        with self._lock:
            self._buckets[host] = (max(self._tokens(host, now) - 1, 0.0), now)
            self._buckets.move_to_end(host)
            while len(self._buckets) > self._hosts:
                self._buckets.popitem(last=False)

    def _tokens(self, host: str, now: float) -> float:
        tokens, at = self._buckets.get(host, (self._burst, now))
        return min(self._burst, tokens + max(now - at, 0.0) / self._refill_s)


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string ("ipv4:127.0.0.1:4242", "ipv6:[::1]:4242"), without its port."""
    address = peer.split(":", 1)[1] if ":" in peer else peer
    return address.rsplit(":", 1)[0] if address.count(":") >= 1 and not address.endswith("]") else address


class Authenticator:
    """Who a call comes from: a node, a role named by its client certificate, or a role logged in by password.

    A verified password is remembered (by a keyed digest of name and password, never the password) with the
    hash it matched, so a later call with it costs no scrypt until the role's password changes."""

    def __init__(self, read_state: Callable, failed_logins=None, throttle: LoginThrottle | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._read = read_state
        self._failed_logins = failed_logins
        self._throttle = throttle or LoginThrottle()
        self._clock = clock
        self._key = os.urandom(32)
        self._verified: OrderedDict[bytes, str] = OrderedDict()
        self._by_call: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # call context -> its principal
        self._lock = threading.Lock()

    def principal(self, context: grpc.ServicerContext) -> Principal:
        """The caller's principal, or Unauthenticated saying what to give; resolved once per call (the access check
        and the handler ask the same call's context)."""
        with self._lock:
            known = self._by_call.get(context)
        if known is not None:
            return known
        principal = self._resolve(context)
        with self._lock:
            self._by_call[context] = principal
        return principal

    def _resolve(self, context: grpc.ServicerContext) -> Principal:
        identity = caller(context)
        if identity is not None:
            if identity.kind == "node":
                return self._node(identity.name, context)
            return self._certificate_login(identity.name, context)
        metadata = dict(context.invocation_metadata() or ())
        user = metadata.get(USER_KEY)
        if user is None:
            raise Unauthenticated("no credentials: connect with a client certificate (--credentials DIR, or "
                                  "--cluster DIR) or log in with --user NAME on the node's client port")
        return self.password_login(user, metadata.get(PASSWORD_KEY, ""), peer_host(context.peer()))

    def _node(self, node_id: str, context) -> Principal:
        """A node's certificate acts for the cluster, unless group0 removed that node: its certificate (left in its
        data directory) must not outlive its membership."""
        if self._read(lambda state: node_id in state.removed_nodes):
            self._refused(f"node {node_id}", "certificate of a node removed from the cluster", context)
            raise Unauthenticated(f"node {node_id} was removed from the cluster: its certificate is no longer accepted")
        return CLUSTER

    def still_allowed(self, principal: Principal) -> None:
        """Unauthenticated when `principal`'s role was dropped or may no longer log in (a session opened before)."""
        if not principal.unrestricted:
            self._read(lambda state: auth.login_role(state, principal.role))

    def _certificate_login(self, name: str, context) -> Principal:
        try:
            self._read(lambda state: auth.login_role(state, name))
        except Unauthenticated as error:
            self._refused(name, "certificate of a role that cannot log in", context)
            raise Unauthenticated(f"client certificate of {name!r}: {error.message}") from None
        return Principal(name)

    def password_login(self, user: str, password: str, host: str) -> Principal:
        """A login from `host` (a gRPC call's metadata, a CQL connection's SASL PLAIN): a host out of login attempts
        is refused before the name is looked up, whatever the name; an unknown name, a role that may not log in and
        a wrong password get the same answer."""
        digest = hmac.new(self._key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        if self._remembered(digest, user):
            return Principal(user)  # verified before: no scrypt to spare, and no guess (so no throttle)
        wait_s = self._throttle.wait_s(host, self._clock())
        if wait_s > 0:
            if self._failed_logins is not None:
                self._failed_logins.labels("throttled").inc()
            raise ResourceExhausted(f"too many failed logins from {host}; try again in {math.ceil(wait_s)} s")
        stored = self._read(lambda state: _password_hash(state, user))
        if stored is None:
            reason = "no such role, or it may not log in"
        elif not stored:
            reason = "role without a password"
        elif not self._verify(digest, password, stored):
            reason = "wrong password"
        else:
            return Principal(user)
        self._failed(user, reason, host)
        raise Unauthenticated(f"login of {user!r} failed: wrong name or password, or the role may not log in")

    def _failed(self, user: str, reason: str, host: str) -> None:
        """Count a failed password login against its host, in one log line (the refusals of a throttled host that
        follow are counted as "throttled" and not logged, so a guessing host cannot flood the log)."""
        if self._failed_logins is not None:
            self._failed_logins.labels(reason).inc()
        now = self._clock()
        self._throttle.failed(host, now)
        wait_s = self._throttle.wait_s(host, now)
        throttled = (f"; its password logins are refused for {math.ceil(wait_s)} s (and again after each further "
                     "failure)") if wait_s > 0 else ""
        log.warning("refused login of %r from %s: %s%s", user, host, reason, throttled)

    def _remembered(self, digest: bytes, user: str) -> bool:
        """Whether this name and password were verified before against the role's password of now."""
        with self._lock:
            known = self._verified.get(digest)
        if known is None or known != self._read(lambda state: _password_hash(state, user)):
            return False
        with self._lock:
            if digest in self._verified:
                self._verified.move_to_end(digest)
        return True

    def _verify(self, digest: bytes, password: str, stored: str) -> bool:
        if not passwords.verify(password, stored):
            return False
        with self._lock:
            self._verified[digest] = stored
            while len(self._verified) > VERIFIED_LOGINS:
                self._verified.popitem(last=False)
        return True

    def _refused(self, user: str, reason: str, context) -> None:
        if self._failed_logins is not None:
            self._failed_logins.labels(reason).inc()
        log.warning("refused login of %r from %s: %s", user, context.peer(), reason)

    def is_superuser(self, principal: Principal) -> bool:
        return self._read(lambda state: auth.is_superuser(state, principal))


def _password_hash(state, user: str) -> str | None:
    role = state.roles.get(user)
    return None if role is None or not role.login else role.password_hash


class Access(grpc.ServerInterceptor):
    """Checks every call before its handler runs: node-to-node services answer nodes only, everything else a
    login, administrative calls a superuser."""

    def __init__(self, authenticator: Authenticator):
        self._authenticator = authenticator

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return handler
        return _checked(handler, handler_call_details.method, self._refusal)

    def _refusal(self, context: grpc.ServicerContext, method: str, request) -> tuple[grpc.StatusCode, str] | None:
        policy = METHOD_POLICIES.get(method)
        if policy is None:
            return grpc.StatusCode.PERMISSION_DENIED, f"{method} is not open to anyone: no access policy names it"
        needs = policy(request) if callable(policy) else policy
        if needs == NODES:
            refused = _node_refusal(context, method)
            if refused is not None:
                return refused
        try:
            principal = self._authenticator.principal(context)
        except CoreError as error:
            return grpc.StatusCode[error.code], error.message
        if needs == SUPERUSER and not self._authenticator.is_superuser(principal):
            return grpc.StatusCode.PERMISSION_DENIED, f"{method} needs a superuser; {principal} is not one"
        return None


def _node_refusal(context: grpc.ServicerContext, method: str) -> tuple[grpc.StatusCode, str] | None:
    identity = caller(context)
    if identity is None:
        return grpc.StatusCode.UNAUTHENTICATED, f"{method} needs a node certificate of this cluster"
    if identity.kind != "node":
        return (grpc.StatusCode.PERMISSION_DENIED,
                f"{method} is for the cluster's nodes only; the {identity.kind} certificate of {identity.name!r} "
                "may not call it")
    return None


def _checked(handler: grpc.RpcMethodHandler, method: str, refusal) -> grpc.RpcMethodHandler:
    """`handler` with the access check in front of its behaviour, whatever its streaming shape."""
    for kind, make in (("unary_unary", grpc.unary_unary_rpc_method_handler),
                       ("unary_stream", grpc.unary_stream_rpc_method_handler),
                       ("stream_unary", grpc.stream_unary_rpc_method_handler),
                       ("stream_stream", grpc.stream_stream_rpc_method_handler)):
        behaviour = getattr(handler, kind)
        if behaviour is not None:
            unary_request = kind.startswith("unary")
            return make(_guarded(behaviour, method, refusal, unary_request),
                        request_deserializer=handler.request_deserializer,
                        response_serializer=handler.response_serializer)
    return handler


def _guarded(behaviour, method: str, refusal, unary_request: bool):
    def guarded(request_or_iterator, context):
        refused = refusal(context, method, request_or_iterator if unary_request else None)
        if refused is not None:
            log.warning("refused %s from %s: %s", method, context.peer(), refused[1])
            context.abort(*refused)
        return behaviour(request_or_iterator, context)
    return guarded
