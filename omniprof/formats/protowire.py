"""The protobuf wire format, written by hand: what the Perfetto and pprof writers encode with.

Each function returns the bytes of one field (tag and value). Integers are written as protobuf
writes ``uint64``/``int64``: a negative value is its 64-bit two's complement (ten bytes). Proto3
leaves fields at their default (0, empty) out; skipping them is the caller's choice.

>>> f_uint(1, 150).hex()
'089601'
>>> f_str(2, "testing").hex()
'120774657374696e67'
>>> varint(-1).hex()
'ffffffffffffffffff01'
>>> f_packed(4, [3, 270]).hex()
'2203038e02'
"""

from __future__ import annotations

import struct

__all__ = ["U64", "varint", "tag", "f_uint", "f_bytes", "f_str", "f_double", "f_fixed64", "f_packed"]

U64 = (1 << 64) - 1
VARINT, FIXED64, LEN = 0, 1, 2


def varint(value: int) -> bytes:
    """``value`` as a base-128 varint (negative values as their 64-bit two's complement).

    A value no 64-bit field can hold raises :class:`ValueError` (never wrapped silently).
    """
    if not -(1 << 63) <= value < 1 << 64:
        raise ValueError(f"{value} does not fit a 64-bit protobuf field")
    value &= U64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    """The key of field number ``field`` with ``wire_type`` (0 varint, 1 fixed64, 2 length-delimited)."""
    return varint(field << 3 | wire_type)


def f_uint(field: int, value: int) -> bytes:
    """A varint field (uint32/64, int32/64, bool, enum)."""
    return tag(field, VARINT) + varint(value)


def f_bytes(field: int, payload: bytes | bytearray) -> bytes:
    """A length-delimited field: bytes, or an embedded message already encoded."""
    return tag(field, LEN) + varint(len(payload)) + bytes(payload)


def f_str(field: int, text: str) -> bytes:
    """A string field (UTF-8; a lone surrogate becomes ``?``)."""
    return f_bytes(field, text.encode("utf-8", "replace"))


def f_double(field: int, value: float) -> bytes:
    return tag(field, FIXED64) + struct.pack("<d", value)


def f_fixed64(field: int, value: int) -> bytes:
    return tag(field, FIXED64) + struct.pack("<Q", value & U64)


def f_packed(field: int, values: list[int]) -> bytes:
    """A packed repeated varint field; nothing at all for no values."""
    if not values:
        return b""
    return f_bytes(field, b"".join(varint(n) for n in values))
