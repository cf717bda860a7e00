"""Cell values and client rows to and from protobuf (`Value`, `Row`): the part of `common.codec` a client needs,
kept free of Arrow and the storage layer so the CLI starts fast."""
from __future__ import annotations

from vbcpb import vbc_pb2 as pb


def value_to_proto(value: object) -> pb.Value:
    if value is None:
        return pb.Value(null=True)
    if isinstance(value, bool):
        return pb.Value(boolean=value)
    if isinstance(value, int):
        return pb.Value(int=value)
    if isinstance(value, float):
        return pb.Value(double=value)
    if isinstance(value, str):
        return pb.Value(text=value)
    raise TypeError(f"cannot encode {value!r} ({type(value).__name__}) as a Value")


def value_from_proto(message: pb.Value) -> object:
    kind = message.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    return getattr(message, kind)


def values_to_proto(values) -> pb.Row:
    return pb.Row(values=[value_to_proto(v) for v in values])


def values_from_proto(message: pb.Row) -> list:
    return [value_from_proto(v) for v in message.values]
