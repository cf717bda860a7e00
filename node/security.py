"""Transport security of a node: TLS with the cluster's certificates, and which peers may call which service.

A secure node serves gRPC over mutual TLS only: every caller presents a certificate signed by the cluster's CA.
The node-to-node services (`Internode`, `Worker`) answer node certificates only; a client certificate calling them
is refused with PERMISSION_DENIED naming the method. The node calls its peers with its own node certificate.
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path

import grpc

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

NODE_ONLY_SERVICES = frozenset({"vbc.v1.Internode", "vbc.v1.Worker"})


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


class PeerAuthorization(grpc.ServerInterceptor):
    """Refuses a call to a node-to-node service from anything but a node certificate, before its handler runs."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.split("/")[1] not in NODE_ONLY_SERVICES:
            return handler
        return _checked(handler, method)


def _refusal(context: grpc.ServicerContext, method: str) -> tuple[grpc.StatusCode, str] | None:
    identity = caller(context)
    if identity is None:
        return grpc.StatusCode.UNAUTHENTICATED, f"{method} needs a node certificate of this cluster"
    if identity.kind != "node":
        return (grpc.StatusCode.PERMISSION_DENIED,
                f"{method} is for the cluster's nodes only; the {identity.kind} certificate of {identity.name!r} "
                "may not call it")
    return None


def _checked(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """`handler` with the node check in front of its behaviour, whatever its streaming shape."""
    for kind, make in (("unary_unary", grpc.unary_unary_rpc_method_handler),
                       ("unary_stream", grpc.unary_stream_rpc_method_handler),
                       ("stream_unary", grpc.stream_unary_rpc_method_handler),
                       ("stream_stream", grpc.stream_stream_rpc_method_handler)):
        behaviour = getattr(handler, kind)
        if behaviour is not None:
            return make(_guarded(behaviour, method), request_deserializer=handler.request_deserializer,
                        response_serializer=handler.response_serializer)
    return handler


def _guarded(behaviour, method: str):
    def guarded(request_or_iterator, context):
        refusal = _refusal(context, method)
        if refusal is not None:
            log.warning("refused %s from %s: %s", method, context.peer(), refusal[1])
            context.abort(*refusal)
        return behaviour(request_or_iterator, context)
    return guarded
