"""Certificates of a secure cluster: a CA, node and client certificates, and the identity a peer's certificate names.

A CA is `ca.crt` in a directory handed to nodes and clients, and `ca.key`, by default beside it, better in a
directory of its own that only the operator reads (`ca_key`, CockroachDB's `--ca-key`): whoever holds the key can
make node certificates. Node and client certificates are signed by it. Every
key is EC P-256, written readable by its owner only (0600). A certificate's kind is its subject's organizational
unit, which only the CA's holder can choose:

- a node certificate: OU `vbc-node`, CN `node`, the node id as the SAN URI `vbc://node/NODE_ID`, and the node's
  hosts as IP or DNS SANs; extended key usage serverAuth and clientAuth (nodes also call each other with it);
- a client certificate: OU `vbc-client`, CN the user name; extended key usage clientAuth.

A server asks `peer_identity(context.auth_context())` who called (`identity_of` the peer's PEM certificate,
`x509_pem_cert` there); `tls_material` gives the PEM bytes gRPC's credentials take.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
NODE_CERT = "node.crt"
NODE_KEY = "node.key"
CA_LIFETIME_DAYS = 3650
CERT_LIFETIME_DAYS = 1825

ORGANIZATION = "vbc"
CA_COMMON_NAME = "vbc CA"
NODE_COMMON_NAME = "node"
NODE_UNIT = "vbc-node"
CLIENT_UNIT = "vbc-client"
NODE_URI_PREFIX = "vbc://node/"

# A peer whose clock is a little behind still accepts a certificate made a moment ago.
BACKDATE = dt.timedelta(hours=1)
# Node ids and user names: they end up in file names, URIs and common names (at most 64 characters).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
DNS_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
PRIVATE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
PUBLIC_MODE = 0o644


class CertificateError(Exception):
    """A certificate or key that cannot be made, read or used, with what to do about it."""


@dataclass(frozen=True)
class Identity:
    """Who a peer certificate names."""
    kind: str  # "node" | "client"
    name: str  # node id or user name


@dataclass(frozen=True)
class CertificateInfo:
    """What `vbc certs list` shows of one certificate file."""
    file: Path
    kind: str  # "ca" | "node" | "client" | "other" | "invalid"
    subject: str
    name: str  # node id or user name; "" for a CA or another certificate
    hosts: tuple[str, ...]
    expires: dt.datetime | None
    problem: str = ""  # why an invalid file could not be read


class TlsMaterial(NamedTuple):
    """PEM bytes for gRPC, named as its credentials' arguments are.

    `grpc.ssl_channel_credentials(**material._asdict())`;
    `grpc.ssl_server_credentials([(material.private_key, material.certificate_chain)],
    root_certificates=material.root_certificates, require_client_auth=True)`.
    """
    root_certificates: bytes
    certificate_chain: bytes
    private_key: bytes


# ------------------------------------------------------------------ making certificates


def create_ca(directory: str | os.PathLike, lifetime_days: int = CA_LIFETIME_DAYS, overwrite: bool = False,
              ca_key: str | os.PathLike | None = None) -> Path:
    """Make a new CA: ca.crt in `directory`, its key at `ca_key` (default `directory`/ca.key; a folder made for it
    is readable by its owner only); returns the certificate's path."""
    directory = Path(directory)
    check_lifetime(lifetime_days)
    cert_path, key_path = directory / CA_CERT, ca_key_path(directory, ca_key)
    refuse_to_replace([cert_path, key_path], overwrite,
                      "a new CA would no longer trust the certificates the present one signed")
    key = new_key()
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                      x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME)])
    now = utc_now()
    cert = (x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + dt.timedelta(days=lifetime_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(key_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    key_path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    write_file(key_path, key_pem(key), PRIVATE_MODE)
    write_file(cert_path, cert.public_bytes(serialization.Encoding.PEM), PUBLIC_MODE)
    return cert_path


def ca_key_path(ca_dir: Path, ca_key: str | os.PathLike | None) -> Path:
    """Where the CA's key is: `ca_key` when given, else beside the certificate."""
    return Path(ca_key) if ca_key is not None else ca_dir / CA_KEY


def create_node_cert(ca_dir: str | os.PathLike, node_id: str, hosts: list[str],
                     out_dir: str | os.PathLike | None = None, lifetime_days: int = CERT_LIFETIME_DAYS,
                     overwrite: bool = False, ca_key: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Make node.crt and node.key for `node_id`, valid for `hosts`, in `out_dir` (default `ca_dir`, which holds the CA).

    When `out_dir` is another directory, ca.crt is copied there too, so it holds all a node needs.
    """
    check_name(node_id, "node id")
    host_names = [general_name_of(host) for host in unique(hosts)]
    if not host_names:
        raise CertificateError(f"give the hosts node {node_id} is reached at (--host, e.g. --host 127.0.0.1 "
                               "--host localhost): peers check the name they connect to against the certificate")
    return sign_into(Path(ca_dir), out_dir, NODE_CERT, NODE_KEY,
                     subject=leaf_subject(NODE_UNIT, NODE_COMMON_NAME),
                     alt_names=[x509.UniformResourceIdentifier(NODE_URI_PREFIX + node_id), *host_names],
                     usages=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
                     lifetime_days=lifetime_days, overwrite=overwrite,
                     taken="it may be another node's certificate", ca_key=ca_key)


def create_client_cert(ca_dir: str | os.PathLike, user: str, out_dir: str | os.PathLike | None = None,
                       lifetime_days: int = CERT_LIFETIME_DAYS, overwrite: bool = False,
                       ca_key: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Make client.USER.crt and client.USER.key in `out_dir` (default `ca_dir`), signed by the CA of `ca_dir`.

    When `out_dir` is another directory, ca.crt is copied there too (the client checks the nodes with it).
    """
    check_name(user, "user name")
    return sign_into(Path(ca_dir), out_dir, client_cert_file(user), client_key_file(user),
                     subject=leaf_subject(CLIENT_UNIT, user), alt_names=[],
                     usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
                     lifetime_days=lifetime_days, overwrite=overwrite,
                     taken=f"user {user} already has a certificate there", ca_key=ca_key)


def client_cert_file(user: str) -> str:
    return f"client.{user}.crt"


def client_key_file(user: str) -> str:
    return f"client.{user}.key"


def leaf_subject(unit: str, common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@dataclass(frozen=True)
class Authority:
    """A CA that signs: its certificate (also as PEM, to copy) and its private key."""
    cert: x509.Certificate
    cert_pem: bytes
    key: ec.EllipticCurvePrivateKey


def load_authority(ca_dir: Path, ca_key: str | os.PathLike | None = None) -> Authority:
    """The CA of `ca_dir` with its key (at `ca_key`, default beside the certificate); the key must be the
    certificate's."""
    cert_path, key_path = ca_dir / CA_CERT, ca_key_path(ca_dir, ca_key)
    if not cert_path.exists():
        raise CertificateError(f"no CA in {ca_dir}: {cert_path} is missing (make one with `vbc certs create-ca "
                               f"{ca_dir}`)")
    if not key_path.exists():
        raise CertificateError(f"the key of the CA of {ca_dir} is not at {key_path}: give its path with --ca-key")
    cert_pem = read_pem(cert_path)
    cert = parse_certificate(cert_pem, cert_path)
    key = load_private_key(read_pem(key_path), key_path)
    if not same_public_key(cert, key):
        raise CertificateError(f"{key_path} is not the key of {cert_path}")
    if not is_ca(cert):
        raise CertificateError(f"{cert_path} is not a CA certificate")
    return Authority(cert, cert_pem, key)


def sign_into(ca_dir: Path, out_dir: str | os.PathLike | None, cert_file: str, key_file: str, *,
              subject: x509.Name, alt_names: list[x509.GeneralName], usages: list[x509.ObjectIdentifier],
              lifetime_days: int, overwrite: bool, taken: str,
              ca_key: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Sign a certificate for a new key with the CA of `ca_dir`; write both, and ca.crt, in `out_dir`.

    `taken` says why an existing certificate is not replaced without `overwrite`.
    """
    check_lifetime(lifetime_days)
    out_dir = Path(out_dir) if out_dir is not None else ca_dir
    authority = load_authority(ca_dir, ca_key)
    now = utc_now()
    expires = now + dt.timedelta(days=lifetime_days)
    check_within_ca_lifetime(authority, now, expires, lifetime_days)
    cert_path, key_path = out_dir / cert_file, out_dir / key_file
    refuse_to_replace([cert_path, key_path], overwrite, taken)
    copy_ca = not same_directory(ca_dir, out_dir)
    if copy_ca:
        refuse_other_ca(out_dir / CA_CERT, authority.cert_pem, overwrite)
    key = new_key()
    builder = (x509.CertificateBuilder()
               .subject_name(subject)
               .issuer_name(authority.cert.subject)
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - BACKDATE)
               .not_valid_after(expires)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(key_usage(cert_sign=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()),
                              critical=False))
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    cert = builder.sign(authority.key, hashes.SHA256())
    out_dir.mkdir(parents=True, exist_ok=True)
    write_file(key_path, key_pem(key), PRIVATE_MODE)
    write_file(cert_path, cert.public_bytes(serialization.Encoding.PEM), PUBLIC_MODE)
    if copy_ca:
        write_file(out_dir / CA_CERT, authority.cert_pem, PUBLIC_MODE)
    return cert_path, key_path


def check_within_ca_lifetime(authority: Authority, now: dt.datetime, expires: dt.datetime, lifetime_days: int) -> None:
    """A certificate may not outlive its CA: peers would refuse it from the CA's expiry on."""
    ca_expires = authority.cert.not_valid_after_utc
    days_left = (ca_expires - now).days
    if days_left < 1:
        raise CertificateError(f"the CA expires on {ca_expires:%Y-%m-%d %H:%M} UTC, in less than a day: make a new CA "
                               "(and new certificates with it)")
    if expires > ca_expires:
        raise CertificateError(f"a {lifetime_days}-day certificate would outlive the CA, which expires on "
                               f"{ca_expires:%Y-%m-%d}: give --lifetime-days {days_left} or less, or make a new CA")


def key_usage(cert_sign: bool) -> x509.KeyUsage:
    """A CA signs certificates; a node or client key only signs its TLS handshakes (ECDHE, so no key encipherment)."""
    return x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign, crl_sign=cert_sign,
                         encipher_only=False, decipher_only=False)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


# ------------------------------------------------------------------ checking what is asked


def check_lifetime(days: int) -> None:
    if not isinstance(days, int) or days < 1:
        raise CertificateError(f"a certificate's lifetime is a positive number of days, not {days!r}")


def check_name(name: str, what: str) -> None:
    if not NAME_PATTERN.fullmatch(name):
        raise CertificateError(f"bad {what} {name!r}: use 1-64 letters, digits, '_', '.' or '-', not starting with "
                               "'.' or '-'")


def general_name_of(host: str) -> x509.GeneralName:
    """An IP address SAN for an IP literal, a DNS SAN for a host name (a leading '*.' allowed)."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    labels = host.removesuffix(".").split(".")
    if labels[0] == "*":
        labels = labels[1:]
    if not host.isascii() or len(host) > 253 or not labels or not all(DNS_LABEL.fullmatch(label) for label in labels):
        raise CertificateError(f"bad host {host!r}: give an IP address (127.0.0.1, ::1) or a DNS name "
                               "(localhost, node1.example.com), without a port")
    return x509.DNSName(host)


def unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def refuse_to_replace(paths: list[Path], overwrite: bool, why: str) -> None:
    existing = [path for path in paths if path.exists()]
    if existing and not overwrite:
        raise CertificateError(f"{existing[0]} already exists and {why}: give --overwrite to replace it")


def refuse_other_ca(path: Path, ca_pem: bytes, overwrite: bool) -> None:
    """An output directory's ca.crt must be the signing CA's: a node trusting another CA could not reach its peers."""
    if path.exists() and not overwrite and read_pem(path) != ca_pem:
        raise CertificateError(f"{path} is another CA's certificate: give --overwrite to replace it with this CA's")


def same_directory(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


# ------------------------------------------------------------------ files


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write `data` through a temporary file in the same directory: a reader never sees half a file or a wider mode."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(handle, mode)
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_pem(path: str | os.PathLike) -> bytes:
    """The bytes of a PEM file (certificate or key)."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise CertificateError(f"cannot read {path}: {error.strerror}") from None
    if b"-----BEGIN " not in data:
        raise CertificateError(f"{path} is not a PEM file (no -----BEGIN line)")
    return data


def parse_certificate(pem: bytes, source: object = "the certificate") -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as error:
        raise CertificateError(f"{source} is not a PEM certificate: {error}") from None


def load_private_key(pem: bytes, source: object) -> ec.EllipticCurvePrivateKey:
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as error:
        raise CertificateError(f"{source} is not an unencrypted PEM private key: {error}") from None


def same_public_key(cert: x509.Certificate, key) -> bool:
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return (cert.public_key().public_bytes(serialization.Encoding.DER, spki)
            == key.public_key().public_bytes(serialization.Encoding.DER, spki))


def is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


# ------------------------------------------------------------------ reading certificates


def peer_identity(auth_context: Mapping[str, list[bytes]]) -> Identity:
    """Who the peer of a gRPC call is, from `context.auth_context()` of a server requiring client certificates."""
    pem_certs = auth_context.get("x509_pem_cert")
    if not pem_certs:
        raise CertificateError("the peer presented no certificate: the call did not come over mutual TLS")
    return identity_of(pem_certs[0])


def identity_of(cert_pem: bytes) -> Identity:
    """Who a peer certificate (PEM, as gRPC's auth context gives it) names: a node and its id, or a client user.

    The certificate is trusted as it is: gRPC checked its chain to the cluster's CA during the handshake.
    """
    return identity_of_certificate(parse_certificate(cert_pem, "the peer certificate"))


def identity_of_certificate(cert: x509.Certificate) -> Identity:
    units = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)]
    if units == [NODE_UNIT]:
        return Identity("node", node_id_of(cert))
    if units == [CLIENT_UNIT]:
        user = single_attribute(cert, NameOID.COMMON_NAME, "common name")
        check_name(user, "user name")
        return Identity("client", user)
    raise CertificateError(f"certificate {cert.subject.rfc4514_string()} is neither a node nor a client certificate "
                           f"(its organizational units are {units}, not [{NODE_UNIT!r}] or [{CLIENT_UNIT!r}])")


def single_attribute(cert: x509.Certificate, oid: x509.ObjectIdentifier, what: str) -> str:
    values = [attribute.value for attribute in cert.subject.get_attributes_for_oid(oid)]
    if len(values) != 1:
        raise CertificateError(f"certificate {cert.subject.rfc4514_string()} has {len(values)} {what}s, "
                               "expected exactly one")
    return str(values[0])


def node_id_of(cert: x509.Certificate) -> str:
    """The id in a node certificate's one `vbc://node/ID` SAN URI."""
    ids = [uri.removeprefix(NODE_URI_PREFIX) for uri in alt_names_of(cert, x509.UniformResourceIdentifier)
           if uri.startswith(NODE_URI_PREFIX)]
    if len(ids) != 1:
        raise CertificateError(f"node certificate {cert.subject.rfc4514_string()} names {len(ids)} node ids "
                               f"({NODE_URI_PREFIX}ID subject alternative names), expected exactly one")
    check_name(ids[0], "node id")
    return ids[0]


def alt_names_of(cert: x509.Certificate, kind: type[x509.GeneralName]) -> list:
    try:
        alt_names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return alt_names.get_values_for_type(kind)


def hosts_of(cert: x509.Certificate) -> tuple[str, ...]:
    """The IP addresses and DNS names a certificate is valid for."""
    return tuple(str(ip) for ip in alt_names_of(cert, x509.IPAddress)) + tuple(alt_names_of(cert, x509.DNSName))


def describe(path: Path) -> CertificateInfo:
    """What a certificate file holds; a file that is not a certificate is described as invalid."""
    try:
        cert = parse_certificate(read_pem(path), path)
    except CertificateError as error:
        return CertificateInfo(path, "invalid", "", "", (), None, problem=str(error))
    kind, name = "other", ""
    if is_ca(cert):
        kind = "ca"
    else:
        try:
            identity = identity_of_certificate(cert)
            kind, name = identity.kind, identity.name
        except CertificateError:
            pass
    return CertificateInfo(path, kind, cert.subject.rfc4514_string(), name, hosts_of(cert), cert.not_valid_after_utc)


def list_certificates(directory: str | os.PathLike) -> list[CertificateInfo]:
    """Every certificate file (*.crt) of `directory`, by file name."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CertificateError(f"{directory} is not a directory")
    files = sorted(directory.glob("*.crt"))
    if not files:
        raise CertificateError(f"{directory} holds no certificate files (*.crt)")
    return [describe(path) for path in files]


# ------------------------------------------------------------------ TLS for gRPC


def tls_material(directory: str | os.PathLike, cert_file: str = NODE_CERT, key_file: str = NODE_KEY,
                 ca_file: str = CA_CERT) -> TlsMaterial:
    """The CA certificate, a certificate and its key from `directory`, checked to belong together and be current."""
    directory = Path(directory)
    ca_path, cert_path, key_path = directory / ca_file, directory / cert_file, directory / key_file
    root, chain, key = read_pem(ca_path), read_pem(cert_path), read_pem(key_path)
    ca_cert, cert = parse_certificate(root, ca_path), parse_certificate(chain, cert_path)
    if not same_public_key(cert, load_private_key(key, key_path)):
        raise CertificateError(f"{key_path} is not the key of {cert_path}")
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        raise CertificateError(f"{cert_path} was not signed by the CA of {ca_path}: make it again with that CA "
                               "(or copy the CA certificate that signed it)") from None
    if cert.not_valid_after_utc <= utc_now():
        raise CertificateError(f"{cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: make a new one")
    return TlsMaterial(root_certificates=root, certificate_chain=chain, private_key=key)


def node_tls_material(directory: str | os.PathLike) -> TlsMaterial:
    """ca.crt, node.crt and node.key of a node's certificate directory."""
    return tls_material(directory, NODE_CERT, NODE_KEY)


def client_tls_material(directory: str | os.PathLike, user: str) -> TlsMaterial:
    """ca.crt, client.USER.crt and client.USER.key of a certificate directory."""
    check_name(user, "user name")
    return tls_material(directory, client_cert_file(user), client_key_file(user))
