"""gRPC channels, stubs and pools of open calls to other nodes, cached per address, each channel kept busy while
it is connected."""
from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.core.errors import Unavailable
from common.stream_pool import StreamPool, StreamPools
from vbcpb import vbc_pb2_grpc as rpc

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 10_000),  # the node's server accepts a ping every 5 s (node.wiring.SERVER_OPTIONS)
    ("grpc.http2.max_pings_without_data", 0),  # keep pinging over a standing call that has nothing to send
    ("grpc.enable_retries", 0),
    # A call to a peer that is down fails at once while its channel waits to reconnect; gRPC's default wait grows
    # to 120 s, so a restarted peer stayed unreachable for seconds after it was back (a migration's stream from it
    # failed and rolled back). Not "grpc.min_reconnect_backoff_ms": gRPC also takes it as one attempt's deadline.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class StandingCall:
    """Keeps one call open on a channel while the channel is connected: a health `Watch` of the peer.

    gRPC Python starts a thread for a channel's asynchronous calls (`.future()`) whenever none is in flight,
    and ends it with the last one, so without a standing call every replica write paid for a thread start
    (docs/architecture.md, choices made for speed: what it saved). The call is opened when the
    channel becomes READY and never re-opened on its own: a peer that is down is not dialled by it, so the
    channel's reconnect backoff is driven by real calls alone, as without it. A thread reads the call's
    responses (the call cannot end while a response is unread) and ends with it; it ends the call itself when
    the peer turns from SERVING to NOT_SERVING, which a node does first when it stops.
    """

    def __init__(self, channel: grpc.Channel, name: str):
        self._channel = channel
        self._name = name
        self._watch = health_pb2_grpc.HealthStub(channel).Watch
        self._call = None
        self._open = False
        self._closed = False
        self._lock = threading.Lock()
        channel.subscribe(self._on_connectivity, try_to_connect=False)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            call = self._call
        self._channel.unsubscribe(self._on_connectivity)
        if call is not None:
            call.cancel()

    def _on_connectivity(self, state: grpc.ChannelConnectivity) -> None:
        if state is not grpc.ChannelConnectivity.READY:
            return
        with self._lock:
            if self._closed or self._open:
                return
            self._open = True
        threading.Thread(target=self._hold, name=f"standing-call-{self._name}", daemon=True).start()

    def _hold(self) -> None:
        try:
            with self._lock:
                if self._closed:
                    return
                self._call = self._watch(health_pb2.HealthCheckRequest(service=""))
            serving = False
            for response in self._call:
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    serving = True
                elif serving:
                    break  # the peer is stopping; its server would wait for this call until its grace period ends
        except (grpc.RpcError, ValueError):
            pass  # the peer went away, or the channel was closed
        finally:
            with self._lock:
                call, self._open, self._call = self._call, False, None
            if call is not None:
                call.cancel()


class Peers:
    """Resolves node ids to addresses (through `resolve`) and hands out cached stubs and pools of open calls."""

    def __init__(self, resolve: Callable[[str], str | None], credentials: grpc.ChannelCredentials | None = None):
        self._resolve = resolve
        self._credentials = credentials  # the node's own certificate, for mutual TLS (None: plaintext)
        self._channels: dict[str, grpc.Channel] = {}
        self._standing: dict[str, StandingCall] = {}
        self._stubs: dict[str, rpc.InternodeStub] = {}
        self._pools = StreamPools()  # by (address, method)
        self._lock = threading.Lock()
        self._closed = False

    def channel(self, node_id: str) -> grpc.Channel:
        """The node's channel (the worker client's calls make their stubs on it); refused once closed, like the
        stubs, so that a call still starting while the node stops opens no new channel."""
        address = self._address(node_id)
        with self._lock:
            if self._closed:
                raise Unavailable("this node is stopping: no new calls to other nodes")
            return self._channel_at(address)

    def internode(self, node_id: str) -> rpc.InternodeStub:
        """The node's Internode stub (cached: making one registers every method with the channel, ~25 µs)."""
        address = self._address(node_id)
        with self._lock:
            if self._closed:
                raise Unavailable("this node is stopping: no new calls to other nodes")
            return self._stub_at(address)

    def streams(self, node_id: str, method: str) -> StreamPool:
        """The pool of open calls of a stream-stream Internode `method` (ReplicaWrites, ViewUpdates) to the node
        (common.stream_pool)."""
        address = self._address(node_id)
        with self._lock:
            if self._closed:
                raise Unavailable("this node is stopping: no new calls to other nodes")
            return self._pools.get((address, method), lambda: getattr(self._stub_at(address), method))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            standing, channels = list(self._standing.values()), list(self._channels.values())
            self._standing.clear()
            self._channels.clear()
            self._stubs.clear()
        self._pools.close(stop_watch=True)
        for call in standing:
            call.close()
        for channel in channels:
            channel.close()

    def _address(self, node_id: str) -> str:
        address = self._resolve(node_id)
        if address is None:
            raise Unavailable(f"node {node_id!r} is not a member of the cluster")
        return address

    def _stub_at(self, address: str) -> rpc.InternodeStub:
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = rpc.InternodeStub(self._channel_at(address))
        return stub

    def _channel_at(self, address: str) -> grpc.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = (
                grpc.insecure_channel(address, options=CHANNEL_OPTIONS) if self._credentials is None
                else grpc.secure_channel(address, self._credentials, options=CHANNEL_OPTIONS))
            self._standing[address] = StandingCall(channel, address)
        return channel

