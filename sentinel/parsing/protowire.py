"""The protobuf wire format, read without generated code: enough for a reader that knows
the few field numbers it needs.

``fields`` yields a message's fields in order, each as ``(number, wire type, integer,
payload)``: a varint's value in ``integer`` (as unsigned 64 bits; ``int32``, ``int64``
and ``uint32`` give it the type the schema says), the bytes of any other field in
``payload`` (8 of them for ``I64``, 4 for ``I32``: ``double`` and ``single`` read them).
Groups, long deprecated, are passed over whole. ``elements`` reads a repeated scalar
field, packed or not.

A reader built on this does with a message what protobuf's parsers do, so that it reads
what they read: a field seen twice keeps its last value, a message field seen twice is
its pieces merged (which is parsing their bytes joined), a field whose wire type is not
its schema's is an unknown field and passed over. It checks only what it reads: bytes
that are not a message there raise ``WireError``; those of a field it passes over are
not looked into.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT, I64, LEN, SGROUP, EGROUP, I32 = range(6)

_DOUBLE = struct.Struct("<d")
_SINGLE = struct.Struct("<f")
_UINT64 = (1 << 64) - 1
#: A varint is at most 10 bytes (64 bits, 7 a byte): the last one's bits start at 63.
_MAX_VARINT_SHIFT = 63

#: One field: its number, wire type, integer (a varint's) and payload (any other's).
Field = tuple[int, int, int, bytes]


class WireError(ValueError):
    """Bytes that are not a protobuf message where one was read."""


def fields(message: bytes) -> Iterator[Field]:
    """Each field of ``message``, in order (see the module's docstring)."""
    end = len(message)
    position = 0
    while position < end:
        # Tags and lengths under 128, one byte each, are nearly all: read here, not called.
        tag = message[position]
        if tag < 0x80 and tag >= 8:
            number, wire, position = tag >> 3, tag & 7, position + 1
        else:
            number, wire, position = _tag(message, position)
        if wire == LEN and position < end and message[position] < 0x80:
            start = position + 1
            position = start + message[position]
            if position > end:
                raise WireError(f"field {number} runs past the end of its message")
            yield number, wire, 0, message[start:position]
        elif wire == VARINT:
            value, position = _varint(message, position)
            yield number, wire, value, b""
        elif wire == SGROUP:
            position = _after_group(message, position, number)
        else:
            start, position = _payload(message, position, number, wire)
            yield number, wire, 0, message[start:position]


def elements(field: Field, element_wire: int) -> list[Field]:
    """The values of one occurrence of a repeated scalar field whose values have wire type
    ``element_wire``: one, or those packed in its payload; none where the field has
    another wire type (an unknown field)."""
    number, wire, _, payload = field
    if wire == element_wire:
        return [field]
    if wire != LEN:
        return []
    if element_wire == VARINT:
        found, position = [], 0
        while position < len(payload):
            value, position = _varint(payload, position)
            found.append((number, VARINT, value, b""))
        return found
    size = 8 if element_wire == I64 else 4
    if len(payload) % size:
        raise WireError(f"packed field {number}: {len(payload)} bytes, not a multiple of {size}")
    return [
        (number, element_wire, 0, payload[start : start + size])
        for start in range(0, len(payload), size)
    ]


def int64(integer: int) -> int:
    """A varint as ``int64``."""
    return integer - (1 << 64) if integer >> 63 else integer


def int32(integer: int) -> int:
    """A varint as ``int32`` (and an enum): its low 32 bits, signed."""
    integer &= 0xFFFFFFFF
    return integer - (1 << 32) if integer >> 31 else integer


def uint32(integer: int) -> int:
    """A varint as ``uint32``: its low 32 bits."""
    return integer & 0xFFFFFFFF


def double(payload: bytes) -> float:
    """An ``I64`` field as a ``double``."""
    return float(_DOUBLE.unpack(payload)[0])


def single(payload: bytes) -> float:
    """An ``I32`` field as a ``float``."""
    return float(_SINGLE.unpack(payload)[0])


def text(payload: bytes) -> str:
    """A ``string`` field: UTF-8, as proto3 requires."""
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as error:
        raise WireError(f"a string that is not UTF-8: {error}") from None


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it."""
    end = len(data)
    if position < end and data[position] < 0x80:
        return data[position], position + 1
    value = shift = 0
    while shift <= _MAX_VARINT_SHIFT:
        if position >= end:
            raise WireError("message ends inside a varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _UINT64, position
        shift += 7
    raise WireError("varint longer than 10 bytes")


def _tag(message: bytes, position: int) -> tuple[int, int, int]:
    """The field number and wire type of the tag at ``position``, and the position after."""
    tag, position = _varint(message, position)
    if tag >> 3 == 0:
        raise WireError("field number 0")
    return tag >> 3, tag & 7, position


def _payload(message: bytes, position: int, number: int, wire: int) -> tuple[int, int]:
    """Where the payload of an ``I64``, ``LEN`` or ``I32`` field starts and ends."""
    if wire == LEN:
        length, position = _varint(message, position)
        stop = position + length
    elif wire == I64:
        stop = position + 8
    elif wire == I32:
        stop = position + 4
    elif wire == EGROUP:
        raise WireError(f"the end of group {number}, which was not begun")
    else:
        raise WireError(f"field {number} has wire type {wire}, which does not exist")
    if stop > len(message):
        raise WireError(f"field {number} runs past the end of its message")
    return position, stop


def _after_group(message: bytes, position: int, number: int) -> int:
    """The position after the group ``number`` whose fields start at ``position``."""
    while position < len(message):
        inner, wire, position = _tag(message, position)
        if wire == EGROUP:
            if inner != number:
                raise WireError(f"group {number} ended as group {inner}")
            return position
        if wire == VARINT:
            _, position = _varint(message, position)
        elif wire == SGROUP:
            position = _after_group(message, position, inner)
        else:
            _, position = _payload(message, position, inner, wire)
    raise WireError(f"group {number} is not ended")
