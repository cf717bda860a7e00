"""Who a call comes from (node.security.Authenticator) and what it may call (node.security.Access)."""
from __future__ import annotations

import logging

import grpc
import pytest

from common import certs, passwords
from common.metrics import NodeMetrics
from coordinator.core.auth import CLUSTER, Principal
from coordinator.core.commands import AlterRole, CreateRole
from coordinator.core.errors import ResourceExhausted, Unauthenticated
from coordinator.core.state import Group0State
from node import security
from vbcpb import vbc_pb2 as pb

PASSWORD = "correct-horse"


class CallContext:
    """What the authenticator reads of a gRPC call: the peer's certificate, the call's metadata, the peer."""

    def __init__(self, pem: bytes | None = None, metadata: tuple = ()):
        self._auth = {"x509_pem_cert": [pem]} if pem else {}
        self._metadata = metadata

    def auth_context(self):
        return self._auth

    def invocation_metadata(self):
        return self._metadata

    def peer(self):
        return "ipv4:127.0.0.1:4242"


def login(user: str, password: str) -> CallContext:
    return CallContext(metadata=((security.USER_KEY, user), (security.PASSWORD_KEY, password)))


@pytest.fixture
def state() -> Group0State:
    s = Group0State()
    s.apply(CreateRole(name="alice", password_hash=passwords.hash_password(PASSWORD), login=True, cmd_id=None))
    s.apply(CreateRole(name="nologin", password_hash=passwords.hash_password(PASSWORD), cmd_id=None))
    return s


@pytest.fixture
def metrics() -> NodeMetrics:
    return NodeMetrics()


@pytest.fixture
def authenticator(state, metrics) -> security.Authenticator:
    return security.Authenticator(lambda fn: fn(state), metrics.failed_logins)


def failed(metrics: NodeMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value("vbc_failed_logins_total", {"reason": reason}) or 0.0


def test_a_password_login_is_checked_once_then_remembered(authenticator, monkeypatch):
    checks = []
    real_verify = passwords.verify
    monkeypatch.setattr(passwords, "verify", lambda *args: checks.append(1) or real_verify(*args))
    assert authenticator.principal(login("alice", PASSWORD)) == Principal("alice")
    assert authenticator.principal(login("alice", PASSWORD)) == Principal("alice")
    assert len(checks) == 1


def test_a_changed_password_is_checked_again(authenticator, state):
    assert authenticator.principal(login("alice", PASSWORD)) == Principal("alice")
    state.apply(AlterRole(name="alice", password_hash=passwords.hash_password("another"), cmd_id=None))
    with pytest.raises(Unauthenticated):
        authenticator.principal(login("alice", PASSWORD))
    assert authenticator.principal(login("alice", "another")) == Principal("alice")


@pytest.mark.parametrize("user, password, reason", [
    ("alice", "wrong-horse", "wrong password"),
    ("mallory", PASSWORD, "no such role, or it may not log in"),
    ("nologin", PASSWORD, "no such role, or it may not log in"),
    ("root", PASSWORD, "role without a password"),
])
def test_a_failed_login_is_counted_and_logged_without_the_password(authenticator, metrics, caplog, user, password,
                                                                    reason):
    with caplog.at_level(logging.WARNING, logger="node.security"):
        with pytest.raises(Unauthenticated, match=f"login of '{user}' failed") as refused:
            authenticator.principal(login(user, password))
    assert password not in str(refused.value)
    assert failed(metrics, reason) == 1
    assert f"refused login of '{user}'" in caplog.text and password not in caplog.text


def test_no_credentials_say_what_to_give(authenticator):
    with pytest.raises(Unauthenticated, match="client certificate.*--user NAME"):
        authenticator.principal(CallContext())


def test_certificates_name_a_node_or_a_role_that_may_log_in(authenticator, tmp_path):
    certs.create_ca(tmp_path)
    certs.create_node_cert(tmp_path, "n1", ["127.0.0.1"], out_dir=tmp_path / "n1")
    certs.create_client_cert(tmp_path, "alice")
    certs.create_client_cert(tmp_path, "bob")
    node = (tmp_path / "n1" / certs.NODE_CERT).read_bytes()
    assert authenticator.principal(CallContext(node)) == CLUSTER
    assert authenticator.principal(CallContext((tmp_path / "client.alice.crt").read_bytes())) == Principal("alice")
    with pytest.raises(Unauthenticated, match="client certificate of 'bob': no role 'bob'"):
        authenticator.principal(CallContext((tmp_path / "client.bob.crt").read_bytes()))


def test_the_certificate_of_a_node_removed_from_the_cluster_is_refused(authenticator, state, tmp_path):
    certs.create_ca(tmp_path)
    certs.create_node_cert(tmp_path, "n7", ["127.0.0.1"], out_dir=tmp_path / "n7")
    pem = (tmp_path / "n7" / certs.NODE_CERT).read_bytes()
    assert authenticator.principal(CallContext(pem)) == CLUSTER
    state.removed_nodes.add("n7")
    with pytest.raises(Unauthenticated, match="node n7 was removed from the cluster"):
        authenticator.principal(CallContext(pem))  # the next call


def test_administrative_calls_need_a_superuser_and_status_a_login(authenticator, state):
    access = security.Access(authenticator)
    alice = login("alice", PASSWORD)
    code, message = access._refusal(alice, "/vbc.v1.Admin/Inject", pb.InjectRequest())
    assert code == grpc.StatusCode.PERMISSION_DENIED and "needs a superuser" in message
    assert access._refusal(alice, "/vbc.v1.Admin/Status", pb.StatusRequest()) is None
    assert access._refusal(alice, "/vbc.v1.Admin/Balancer", pb.BalancerRequest(action="status")) is None
    assert access._refusal(alice, "/vbc.v1.Admin/Balancer", pb.BalancerRequest(action="off"))[0] == \
        grpc.StatusCode.PERMISSION_DENIED
    assert access._refusal(CallContext(), "/vbc.v1.Admin/Status", None)[0] == grpc.StatusCode.UNAUTHENTICATED
    assert access._refusal(alice, "/vbc.v1.Internode/ReplicaWrite", None)[0] == grpc.StatusCode.UNAUTHENTICATED
    state.apply(AlterRole(name="alice", superuser=True, cmd_id=None))
    assert access._refusal(alice, "/vbc.v1.Admin/Inject", pb.InjectRequest()) is None


def test_every_method_of_every_service_a_node_serves_has_an_access_policy_and_others_are_refused(authenticator):
    from grpc_health.v1 import health_pb2
    from grpc_reflection.v1alpha import reflection_pb2
    services = [*pb.DESCRIPTOR.services_by_name.values(), *health_pb2.DESCRIPTOR.services_by_name.values(),
                *reflection_pb2.DESCRIPTOR.services_by_name.values()]
    methods = {f"/{service.full_name}/{method.name}" for service in services for method in service.methods}
    assert methods == set(security.METHOD_POLICIES), "give every RPC a policy in node.security.METHOD_POLICIES"
    code, message = security.Access(authenticator)._refusal(login("alice", PASSWORD), "/vbc.v1.Admin/Shiny", None)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "no access policy names it" in message


def test_metrics_are_served_over_https_with_the_node_certificate(tmp_path, metrics):
    import ssl
    import urllib.request

    from common.metrics import serve_metrics
    from vbc.cluster import free_port

    certs.create_ca(tmp_path)
    certs.create_node_cert(tmp_path, "n1", ["127.0.0.1"], out_dir=tmp_path / "n1")
    address = f"127.0.0.1:{free_port()}"
    server, _ = serve_metrics(address, metrics.registry, certfile=str(tmp_path / "n1" / certs.NODE_CERT),
                              keyfile=str(tmp_path / "n1" / certs.NODE_KEY))
    try:
        metrics.failed_logins.labels("wrong password").inc()
        trusting = ssl.create_default_context(cafile=str(tmp_path / certs.CA_CERT))
        text = urllib.request.urlopen(f"https://{address}/metrics", timeout=5, context=trusting).read().decode()
        assert 'vbc_failed_logins_total{reason="wrong password"} 1.0' in text
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read()
    finally:
        server.shutdown()
        server.server_close()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_host_guessing_passwords_is_refused_before_scrypt_then_let_in_again(state, metrics, monkeypatch):
    """Five wrong passwords from one host, then its logins are refused at once (RESOURCE_EXHAUSTED, no scrypt) until
    a token refills; another host, and a login already verified, are not held back."""
    clock = Clock()
    authenticator = security.Authenticator(lambda fn: fn(state), metrics.failed_logins, clock=clock)
    assert authenticator.principal(login("alice", PASSWORD)) == Principal("alice")  # verified before the guessing
    checks = []
    real_verify = passwords.verify
    monkeypatch.setattr(passwords, "verify", lambda *args: checks.append(1) or real_verify(*args))
    for guess in range(5):
        with pytest.raises(Unauthenticated):
            authenticator.principal(login("alice", f"guess-{guess}"))
    with pytest.raises(ResourceExhausted, match=r"too many failed logins from 127\.0\.0\.1; try again in 2 s"):
        authenticator.principal(login("alice", "guess-5"))
    assert len(checks) == 5 and failed(metrics, "throttled") == 1.0
    assert authenticator.principal(login("alice", PASSWORD)) == Principal("alice")  # remembered: no check
    other_host = login("alice", "guess-6")
    other_host.peer = lambda: "ipv4:10.0.0.9:5000"
    with pytest.raises(Unauthenticated):
        authenticator.principal(other_host)
    clock.now += 2.0
    with pytest.raises(Unauthenticated):  # one token back: one more check
        authenticator.principal(login("alice", "guess-7"))
    assert len(checks) == 7


def test_each_failure_logs_one_line_the_one_that_throttles_says_so_and_refused_logins_log_none(state, metrics,
                                                                                                caplog):
    clock = Clock()
    authenticator = security.Authenticator(lambda fn: fn(state), metrics.failed_logins, clock=clock)
    with caplog.at_level(logging.WARNING, logger=security.__name__):
        for guess in range(5):
            with pytest.raises(Unauthenticated):
                authenticator.principal(login("alice", f"guess-{guess}"))
        for guess in range(3):
            with pytest.raises(ResourceExhausted):
                authenticator.principal(login("alice", f"again-{guess}"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["refused login of 'alice' from 127.0.0.1: wrong password"] * 4 + [
        "refused login of 'alice' from 127.0.0.1: wrong password; its password logins are refused for 2 s (and "
        "again after each further failure)"]
    assert failed(metrics, "throttled") == 3.0


def test_a_throttled_host_gets_the_same_answer_for_unknown_names_without_a_lookup(state, metrics):
    clock = Clock()
    lookups = []
    authenticator = security.Authenticator(lambda fn: lookups.append(1) or fn(state), metrics.failed_logins,
                                           clock=clock)
    for guess in range(5):
        with pytest.raises(Unauthenticated, match="wrong name or password"):
            authenticator.principal(login(f"nobody-{guess}", "x"))  # unknown names use up the allowance too
    seen = len(lookups)
    for name in ("alice", "nobody-9"):
        with pytest.raises(ResourceExhausted, match="too many failed logins from 127.0.0.1"):
            authenticator.principal(login(name, "guess"))
    assert len(lookups) == seen  # refused before any role is looked up


def test_the_login_throttle_refills_one_failure_per_interval_up_to_its_burst():
    throttle = security.LoginThrottle(burst=2, refill_s=3.0)
    assert throttle.wait_s("h", 0.0) == 0.0
    throttle.failed("h", 0.0)
    throttle.failed("h", 0.0)
    assert throttle.wait_s("h", 0.0) == 3.0 and throttle.wait_s("h", 1.5) == 1.5 and throttle.wait_s("h", 3.0) == 0.0
    assert throttle.wait_s("h", 100.0) == 0.0 and throttle.wait_s("other", 0.0) == 0.0
    throttle.failed("h", 100.0)
    assert throttle.wait_s("h", 100.0) == 0.0  # the bucket refilled to its burst, not beyond


def test_a_peer_host_is_its_address_without_the_port():
    assert security.peer_host("ipv4:127.0.0.1:4242") == "127.0.0.1"
    assert security.peer_host("ipv6:[::1]:4242") == "[::1]"


def test_a_call_s_principal_is_resolved_once(state, metrics):
    lookups = []
    authenticator = security.Authenticator(lambda fn: lookups.append(1) or fn(state), metrics.failed_logins)
    call = login("alice", PASSWORD)
    assert authenticator.principal(call) == authenticator.principal(call) == Principal("alice")
    assert len(lookups) == 1  # the access check and the handler share one answer


def test_a_session_s_role_dropped_or_denied_login_is_refused_at_its_next_statement(authenticator, state):
    from coordinator.core.commands import DropRole
    authenticator.still_allowed(Principal("alice"))
    authenticator.still_allowed(CLUSTER)
    state.apply(AlterRole(name="alice", login=False, cmd_id=None))
    with pytest.raises(Unauthenticated, match="may not log in"):
        authenticator.still_allowed(Principal("alice"))
    state.apply(DropRole(name="alice", cmd_id=None))
    with pytest.raises(Unauthenticated, match="no role 'alice'"):
        authenticator.still_allowed(Principal("alice"))
