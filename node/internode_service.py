"""The Internode gRPC service: replica writes, view updates, scans and local status between nodes."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common.status import streaming, unary
from replica.local import LocalData
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc


@dataclass(frozen=True)
class InternodeDeps:
    """What the Internode service needs of its node."""

    replica: LocalData
    observe_timestamp: Callable[[int], None]
    local_status: Callable[[], pb.LocalStatusResponse]
    wait_schema_applied: Callable[[int, float], None]


class InternodeService(rpc.InternodeServicer):
    def __init__(self, deps: InternodeDeps):
        self._deps = deps

    @unary
    def ReplicaWrite(self, request, context):
        self._deps.observe_timestamp(request.timestamp)
        return pb.Ack(applied=self._deps.replica.apply_base_write(request))

    @unary
    def ViewUpdate(self, request, context):
        return pb.Ack(applied=self._deps.replica.apply_view_update(request))

    @streaming
    def Scan(self, request, context):
        yield from self._deps.replica.scan(request)

    @unary
    def LocalStatus(self, request, context):
        return self._deps.local_status()

    @unary
    def SchemaBarrier(self, request, context):
        self._deps.wait_schema_applied(request.schema_version, request.timeout or 30.0)
        return self._deps.local_status()
