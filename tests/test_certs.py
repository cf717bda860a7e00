"""Certificates of a secure cluster (common/certs.py, `vbc certs`), and mutual TLS with them on a real gRPC server."""
from __future__ import annotations

import datetime as dt
import ipaddress
import stat
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from common import certs
from common.certs import CertificateError, Identity
from vbc import cli

CALL_TIMEOUT = 5.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA with a node certificate for n1 (127.0.0.1 and localhost) and a client certificate for alice."""
    directory = tmp_path_factory.mktemp("pki")
    certs.create_ca(directory)
    certs.create_node_cert(directory, "n1", ["127.0.0.1", "localhost"])
    certs.create_client_cert(directory, "alice")
    return directory


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory) -> Path:
    """Another cluster's CA, with a client certificate for mallory."""
    directory = tmp_path_factory.mktemp("other-pki")
    certs.create_ca(directory)
    certs.create_client_cert(directory, "mallory")
    return directory


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def extension(cert: x509.Certificate, kind):
    return cert.extensions.get_extension_for_class(kind).value


def lifetime_of(cert: x509.Certificate) -> dt.timedelta:
    return cert.not_valid_after_utc - cert.not_valid_before_utc - certs.BACKDATE


# ------------------------------------------------------------------ files and their contents


def test_a_ca_is_a_self_signed_ca_certificate_with_an_owner_only_key(pki):
    ca = load(pki / "ca.crt")
    assert extension(ca, x509.BasicConstraints).ca
    assert ca.issuer == ca.subject
    ca.verify_directly_issued_by(ca)
    assert lifetime_of(ca) == dt.timedelta(days=certs.CA_LIFETIME_DAYS)
    assert mode_of(pki / "ca.key") == 0o600
    assert mode_of(pki / "ca.crt") == 0o644


def test_a_node_certificate_names_its_hosts_and_its_node_id(pki):
    cert = load(pki / "node.crt")
    cert.verify_directly_issued_by(load(pki / "ca.crt"))
    alt_names = extension(cert, x509.SubjectAlternativeName)
    assert alt_names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert alt_names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert alt_names.get_values_for_type(x509.UniformResourceIdentifier) == ["vbc://node/n1"]
    assert set(extension(cert, x509.ExtendedKeyUsage)) == {ExtendedKeyUsageOID.SERVER_AUTH,
                                                          ExtendedKeyUsageOID.CLIENT_AUTH}
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "node"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "vbc-node"
    assert not extension(cert, x509.BasicConstraints).ca
    assert lifetime_of(cert) == dt.timedelta(days=certs.CERT_LIFETIME_DAYS)
    assert mode_of(pki / "node.key") == 0o600


def test_a_client_certificate_names_its_user_for_client_authentication_only(pki):
    cert = load(pki / "client.alice.crt")
    cert.verify_directly_issued_by(load(pki / "ca.crt"))
    assert list(extension(cert, x509.ExtendedKeyUsage)) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "vbc-client"
    assert mode_of(pki / "client.alice.key") == 0o600


def test_identity_of_tells_a_node_from_a_client(pki):
    assert certs.identity_of(certs.read_pem(pki / "node.crt")) == Identity("node", "n1")
    assert certs.identity_of(certs.read_pem(pki / "client.alice.crt")) == Identity("client", "alice")


def test_identity_of_refuses_what_names_neither(pki):
    with pytest.raises(CertificateError, match="neither a node nor a client certificate"):
        certs.identity_of(certs.read_pem(pki / "ca.crt"))
    with pytest.raises(CertificateError, match="not a PEM certificate"):
        certs.identity_of(b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")


def test_an_existing_ca_is_replaced_only_when_asked(tmp_path):
    certs.create_ca(tmp_path)
    first_key = (tmp_path / "ca.key").read_bytes()
    with pytest.raises(CertificateError, match="ca.crt already exists .* give --overwrite"):
        certs.create_ca(tmp_path)
    assert (tmp_path / "ca.key").read_bytes() == first_key
    certs.create_ca(tmp_path, overwrite=True)
    assert (tmp_path / "ca.key").read_bytes() != first_key


def test_a_node_certificate_is_replaced_only_when_asked(pki):
    with pytest.raises(CertificateError, match="node.crt already exists"):
        certs.create_node_cert(pki, "n2", ["127.0.0.1"])
    assert certs.identity_of(certs.read_pem(pki / "node.crt")).name == "n1"


def test_a_node_directory_gets_the_ca_certificate_too(pki, tmp_path):
    out = tmp_path / "n2"
    cert_path, key_path = certs.create_node_cert(pki, "n2", ["::1", "node2.example.com"], out_dir=out,
                                                 lifetime_days=30)
    assert (cert_path, key_path) == (out / "node.crt", out / "node.key")
    assert (out / "ca.crt").read_bytes() == (pki / "ca.crt").read_bytes()
    assert lifetime_of(load(cert_path)) == dt.timedelta(days=30)
    assert certs.hosts_of(load(cert_path)) == ("::1", "node2.example.com")
    assert certs.node_tls_material(out).root_certificates == (pki / "ca.crt").read_bytes()


def test_a_directory_trusting_another_ca_is_not_silently_switched(pki, other_pki, tmp_path):
    (tmp_path / "ca.crt").write_bytes((other_pki / "ca.crt").read_bytes())
    with pytest.raises(CertificateError, match="another CA's certificate"):
        certs.create_node_cert(pki, "n3", ["127.0.0.1"], out_dir=tmp_path)
    assert not (tmp_path / "node.crt").exists()


@pytest.mark.parametrize("call, words", [
    (lambda d: certs.create_node_cert(d, "n9", []), "give the hosts"),
    (lambda d: certs.create_node_cert(d, "n9", ["127.0.0.1:9042"]), "without a port"),
    (lambda d: certs.create_node_cert(d, "n9", ["bad host"]), "bad host"),
    (lambda d: certs.create_node_cert(d, "../n9", ["localhost"]), "bad node id"),
    (lambda d: certs.create_client_cert(d, "a/b"), "bad user name"),
    (lambda d: certs.create_client_cert(d, "bob", lifetime_days=0), "positive number of days"),
    (lambda d: certs.create_client_cert(d, "bob", lifetime_days=certs.CA_LIFETIME_DAYS + 1), "outlive the CA"),
    (lambda d: certs.create_client_cert(d.parent, "bob"), "no CA in"),
])
def test_bad_requests_are_refused_with_what_to_do(pki, call, words):
    with pytest.raises(CertificateError, match=words):
        call(pki)


def test_tls_material_refuses_files_that_do_not_belong_together(pki, other_pki, tmp_path):
    for name in ("ca.crt", "node.crt"):
        (tmp_path / name).write_bytes((pki / name).read_bytes())
    (tmp_path / "node.key").write_bytes((pki / "client.alice.key").read_bytes())
    with pytest.raises(CertificateError, match="node.key is not the key of .*node.crt"):
        certs.node_tls_material(tmp_path)
    (tmp_path / "node.key").write_bytes((pki / "node.key").read_bytes())
    (tmp_path / "ca.crt").write_bytes((other_pki / "ca.crt").read_bytes())
    with pytest.raises(CertificateError, match="was not signed by the CA"):
        certs.node_tls_material(tmp_path)
    with pytest.raises(CertificateError, match="cannot read .*client.bob.crt"):
        certs.client_tls_material(pki, "bob")


def test_tls_material_refuses_an_expired_certificate(pki, monkeypatch):
    later = certs.utc_now() + dt.timedelta(days=certs.CERT_LIFETIME_DAYS + 1)
    monkeypatch.setattr(certs, "utc_now", lambda: later)
    with pytest.raises(CertificateError, match="node.crt expired on"):
        certs.node_tls_material(pki)


def test_peer_identity_needs_a_client_certificate():
    with pytest.raises(CertificateError, match="no certificate"):
        certs.peer_identity({"transport_security_type": [b"ssl"]})


def test_list_describes_every_certificate_file(pki):
    infos = {info.file.name: info for info in certs.list_certificates(pki)}
    assert {name: (info.kind, info.name, info.hosts) for name, info in infos.items()} == {
        "ca.crt": ("ca", "", ()),
        "client.alice.crt": ("client", "alice", ()),
        "node.crt": ("node", "n1", ("127.0.0.1", "localhost")),
    }


# ------------------------------------------------------------------ vbc certs


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_certs_commands_make_and_list_a_cluster_s_certificates(tmp_path, capsys):
    directory = str(tmp_path / "certs")
    code, out, _ = run_cli(capsys, "certs", "create-ca", directory)
    assert code == 0 and "ca.crt" in out and "ca.key" in out
    code, out, _ = run_cli(capsys, "certs", "create-node", directory, "n1", "--host", "127.0.0.1",
                           "--host", "localhost", "--lifetime-days", "365")
    assert code == 0 and "node n1" in out and "127.0.0.1, localhost" in out
    code, out, _ = run_cli(capsys, "certs", "create-client", directory, "alice")
    assert code == 0 and "client.alice.crt" in out
    assert mode_of(tmp_path / "certs" / "client.alice.key") == 0o600
    code, out, _ = run_cli(capsys, "certs", "list", directory)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    assert lines[0].startswith("ca.crt: ca, expires ")
    assert lines[1].startswith("client.alice.crt: client alice, expires ")
    assert lines[2].startswith("node.crt: node n1, hosts 127.0.0.1 localhost, expires ")
    assert "OU=vbc-node" in lines[2]


def test_the_certs_commands_report_errors_with_exit_status_1(tmp_path, capsys):
    assert run_cli(capsys, "certs", "create-ca", str(tmp_path))[0] == 0
    code, out, err = run_cli(capsys, "certs", "create-ca", str(tmp_path))
    assert code == 1 and out == "" and err.startswith("error: ") and "--overwrite" in err
    assert run_cli(capsys, "certs", "create-ca", str(tmp_path), "--overwrite")[0] == 0
    code, _, err = run_cli(capsys, "certs", "create-node", str(tmp_path / "nowhere"), "n1", "--host", "localhost")
    assert code == 1 and "no CA in" in err and "vbc certs create-ca" in err
    code, _, err = run_cli(capsys, "certs", "list", str(tmp_path / "nowhere"))
    assert code == 1 and "is not a directory" in err
    code, _, err = run_cli(capsys, "certs", "create-node", str(tmp_path), "n1")
    assert code == 2 and "--host" in err


def test_the_ca_key_can_live_apart_and_is_then_given_by_its_own_option(tmp_path, capsys):
    handed_out, safe = tmp_path / "credentials", tmp_path / "safe" / "ca.key"
    code, out, _ = run_cli(capsys, "certs", "create-ca", str(handed_out), "--ca-key", str(safe))
    assert code == 0 and str(safe) in out
    assert not (handed_out / "ca.key").exists() and mode_of(safe) == 0o600 and mode_of(safe.parent) == 0o700
    code, _, err = run_cli(capsys, "certs", "create-client", str(handed_out), "alice")
    assert code == 1 and f"not at {handed_out / 'ca.key'}" in err and "--ca-key" in err
    code, out, _ = run_cli(capsys, "certs", "create-client", str(handed_out), "alice", "--ca-key", str(safe))
    assert code == 0 and "client.alice.crt" in out


def test_a_cluster_s_credentials_folder_holds_no_ca_key_and_an_old_one_is_moved_apart(tmp_path):
    from vbc import cluster
    nodes = [{"id": "n1", "data_dir": str(tmp_path / "n1")}]
    old = tmp_path / "old"
    certs.create_ca(old / "credentials")  # the layout of before: the key beside the certificate
    for data_dir in (tmp_path, old):
        folder = cluster.prepare_credentials(data_dir, nodes if data_dir == tmp_path else [])
        assert not (folder / "ca.key").exists()
        key = data_dir / "ca" / "ca.key"
        assert key.exists() and mode_of(key) == 0o600
    assert mode_of(tmp_path / "ca") == 0o700
    assert certs.identity_of((tmp_path / "n1" / "node.crt").read_bytes()) == Identity("node", "n1")


# ------------------------------------------------------------------ mutual TLS on a real gRPC server


class WhoAsks(health.HealthServicer):
    """The standard health service, noting the identity of each caller's certificate."""

    def __init__(self) -> None:
        super().__init__()
        self.callers: list[Identity] = []

    def Check(self, request, context):
        self.callers.append(certs.peer_identity(context.auth_context()))
        return super().Check(request, context)


def start_server(cert_dir: Path) -> tuple[grpc.Server, WhoAsks, int]:
    material = certs.node_tls_material(cert_dir)
    credentials = grpc.ssl_server_credentials([(material.private_key, material.certificate_chain)],
                                              root_certificates=material.root_certificates,
                                              require_client_auth=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = WhoAsks()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, servicer, port


@pytest.fixture(scope="module")
def tls_server(pki):
    server, servicer, port = start_server(pki)
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


def check_health(channel: grpc.Channel) -> int:
    with channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT).status


def secure_channel(address: str, material: certs.TlsMaterial) -> grpc.Channel:
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(**material._asdict()))


def test_a_client_with_its_certificate_is_answered_and_known_by_name(pki, tls_server):
    servicer, address = tls_server
    assert check_health(secure_channel(address, certs.client_tls_material(pki, "alice"))) == \
        health_pb2.HealthCheckResponse.SERVING
    assert servicer.callers[-1] == Identity("client", "alice")


def test_a_node_calling_another_node_is_known_as_that_node(pki, tls_server):
    servicer, address = tls_server
    assert check_health(secure_channel(address, certs.node_tls_material(pki))) == health_pb2.HealthCheckResponse.SERVING
    assert servicer.callers[-1] == Identity("node", "n1")


def test_a_certificate_of_another_ca_fails_the_handshake(pki, other_pki, tls_server):
    servicer, address = tls_server
    calls_before = len(servicer.callers)
    stranger = certs.client_tls_material(other_pki, "mallory")._replace(
        root_certificates=(pki / "ca.crt").read_bytes())
    with pytest.raises(grpc.RpcError) as refused:
        check_health(secure_channel(address, stranger))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(servicer.callers) == calls_before


def test_a_client_trusting_another_ca_does_not_trust_the_node(pki, other_pki, tls_server):
    _, address = tls_server
    wrong_root = certs.client_tls_material(pki, "alice")._replace(
        root_certificates=(other_pki / "ca.crt").read_bytes())
    with pytest.raises(grpc.RpcError) as refused:
        check_health(secure_channel(address, wrong_root))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_plaintext_client_is_refused(tls_server):
    servicer, address = tls_server
    calls_before = len(servicer.callers)
    with pytest.raises(grpc.RpcError) as refused:
        check_health(grpc.insecure_channel(address))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(servicer.callers) == calls_before


def test_the_node_certificate_must_name_the_address_dialled(pki, tmp_path):
    """Dialling 127.0.0.1 passes hostname verification through the IP SAN: a certificate for localhost alone fails."""
    certs.create_node_cert(pki, "n4", ["localhost"], out_dir=tmp_path)
    server, _, port = start_server(tmp_path)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            check_health(secure_channel(f"127.0.0.1:{port}", certs.client_tls_material(pki, "alice")))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert check_health(secure_channel(f"localhost:{port}", certs.client_tls_material(pki, "alice"))) == \
            health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(grace=None)


def test_a_cluster_folder_made_again_with_a_new_ca_is_trusted_anew(tmp_path):
    """The demo wipes its folder and makes a new CA: credentials cached for the old one must not be reused."""
    import shutil

    from vbc import client

    folder = tmp_path / client.CREDENTIALS_DIR
    certs.create_ca(folder)
    certs.create_client_cert(folder, "root")
    client.use_cluster_credentials(tmp_path, ["127.0.0.1:1"])
    first = client._credentials["127.0.0.1:1"]
    shutil.rmtree(folder)
    certs.create_ca(folder)
    certs.create_client_cert(folder, "root")
    client.use_cluster_credentials(tmp_path, ["127.0.0.1:1"])
    try:
        assert client._credentials["127.0.0.1:1"] is not first
    finally:
        client.use_credentials(None, ["127.0.0.1:1"])


def test_a_password_login_sent_to_a_certificate_port_says_to_use_the_client_port(pki, tls_server, capsys,
                                                                                monkeypatch):
    from vbc import client
    _, address = tls_server
    monkeypatch.setenv(client.PASSWORD_ENV, "secret")
    monkeypatch.setattr(client, "_credentials", dict(client._credentials))  # this test's logins stay its own
    code, _, err = run_cli(capsys, "status", "--addr", address, "--user", "alice", "--credentials", str(pki))
    assert code == 1 and "client port" in err and address in err and "--client-addr" in err
