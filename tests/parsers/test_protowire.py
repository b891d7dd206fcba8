"""The protobuf wire format as ``protowire`` reads it, on bytes written by hand from the
encoding's specification (https://protobuf.dev/programming-guides/encoding/)."""

from __future__ import annotations

import struct

import pytest

from sentinel.parsing.protowire import (
    I32,
    I64,
    LEN,
    VARINT,
    Field,
    WireError,
    double,
    elements,
    fields,
    int32,
    int64,
    single,
    text,
    uint32,
)


def test_each_wire_type_in_order() -> None:
    message = (
        b"\x08\x96\x01"  # 1: varint 150
        + b"\x11"
        + struct.pack("<d", 2.5)  # 2: I64
        + b"\x1a\x03abc"  # 3: LEN
        + b"\x25"
        + struct.pack("<f", 0.5)  # 4: I32
    )
    assert list(fields(message)) == [
        (1, VARINT, 150, b""),
        (2, I64, 0, struct.pack("<d", 2.5)),
        (3, LEN, 0, b"abc"),
        (4, I32, 0, struct.pack("<f", 0.5)),
    ]


def test_groups_are_passed_over_whole() -> None:
    # 1: varint 1, then group 2 holding a varint and group 3, then 4: varint 5.
    message = b"\x08\x01" + b"\x13" + b"\x08\x07" + b"\x1b\x08\x01\x1c" + b"\x14" + b"\x20\x05"
    assert [(number, integer) for number, _, integer, _ in fields(message)] == [(1, 1), (4, 5)]


@pytest.mark.parametrize(
    ("integer", "as_int32", "as_int64", "as_uint32"),
    [
        pytest.param(5, 5, 5, 5, id="small"),
        pytest.param(2**64 - 1, -1, -1, 2**32 - 1, id="minus-one"),
        pytest.param(2**63, 0, -(2**63), 0, id="int64-min"),
        pytest.param(2**33 - 1, -1, 2**33 - 1, 2**32 - 1, id="beyond-32-bits"),
    ],
)
def test_a_varint_as_each_integer_type(
    integer: int, as_int32: int, as_int64: int, as_uint32: int
) -> None:
    assert (int32(integer), int64(integer), uint32(integer)) == (as_int32, as_int64, as_uint32)


def test_a_ten_byte_varint_is_its_low_64_bits() -> None:
    ((_, _, integer, _),) = fields(b"\x08" + b"\xff" * 9 + b"\x01")
    assert integer == 2**64 - 1
    assert int64(integer) == -1


def test_fixed_and_string_values() -> None:
    assert double(struct.pack("<d", -1e300)) == -1e300
    assert single(struct.pack("<f", 0.1)) == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert text("λ".encode()) == "λ"
    with pytest.raises(WireError, match="UTF-8"):
        text(b"\xff")


ONE, TWO = struct.pack("<f", 1.0), struct.pack("<f", 2.0)


@pytest.mark.parametrize(
    ("field", "element_wire", "values"),
    [
        pytest.param((5, I32, 0, ONE), I32, [(5, I32, 0, ONE)], id="one-unpacked"),
        pytest.param(
            (5, LEN, 0, ONE + TWO), I32, [(5, I32, 0, ONE), (5, I32, 0, TWO)], id="packed-floats"
        ),
        pytest.param(
            (7, LEN, 0, b"\x01\x96\x01"),
            VARINT,
            [(7, VARINT, 1, b""), (7, VARINT, 150, b"")],
            id="packed-varints",
        ),
        pytest.param((7, LEN, 0, b""), VARINT, [], id="packed-empty"),
        pytest.param((5, VARINT, 3, b""), I32, [], id="another-wire-type-is-unknown"),
    ],
)
def test_repeated_values_packed_or_not(
    field: Field, element_wire: int, values: list[Field]
) -> None:
    assert elements(field, element_wire) == values


@pytest.mark.parametrize(
    ("message", "error"),
    [
        pytest.param(b"\x0a\x05ab", "runs past the end", id="field-past-its-end"),
        pytest.param(b"\x08\x80", "ends inside a varint", id="varint-cut"),
        pytest.param(
            b"\x08" + b"\xff" * 10 + b"\x01", "longer than 10 bytes", id="varint-too-long"
        ),
        pytest.param(b"\x00\x01", "field number 0", id="field-zero"),
        pytest.param(b"\x0e", "wire type 6", id="wire-type-6"),
        pytest.param(b"\x0c", "not begun", id="group-end-alone"),
        pytest.param(b"\x0b\x08\x01", "not ended", id="group-not-ended"),
        pytest.param(b"\x0b\x14", "ended as group 2", id="group-ended-as-another"),
        pytest.param(b"\x11\x00\x00", "runs past the end", id="fixed64-cut"),
    ],
)
def test_bytes_that_are_no_message(message: bytes, error: str) -> None:
    with pytest.raises(WireError, match=error):
        list(fields(message))


def test_a_packed_fixed_field_of_a_wrong_length() -> None:
    with pytest.raises(WireError, match="not a multiple of 4"):
        elements((5, LEN, 0, b"abc"), I32)
