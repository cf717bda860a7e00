"""Conversion between Python values and the protobuf `Value` message."""
from __future__ import annotations

from vbcpb import vbc_pb2 as pb


def to_proto(value: object) -> pb.Value:
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


def from_proto(message: pb.Value) -> object:
    kind = message.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    return getattr(message, kind)


def row_to_proto(values) -> pb.Row:
    return pb.Row(values=[to_proto(v) for v in values])


def row_from_proto(row: pb.Row) -> list:
    return [from_proto(v) for v in row.values]
