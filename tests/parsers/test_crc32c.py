"""CRC-32C against published check values, and TFRecord's mask against real event files."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from sentinel.parsing.crc32c import crc32c, masked_crc32c

EVENT_FILE = next((Path(__file__).resolve().parents[1] / "fixtures" / "tb").rglob("*tfevents*"))


@pytest.mark.parametrize(
    ("data", "crc"),
    [
        pytest.param(b"", 0, id="empty"),
        pytest.param(b"123456789", 0xE3069283, id="check-value"),
        # RFC 3720 (iSCSI), appendix B.4.
        pytest.param(bytes(32), 0x8A9136AA, id="32-zeros"),
        pytest.param(b"\xff" * 32, 0x62A8AB43, id="32-ones"),
        pytest.param(bytes(range(32)), 0x46DD794E, id="incrementing"),
        pytest.param(bytes(range(31, -1, -1)), 0x113FDB5C, id="decrementing"),
    ],
)
def test_published_values(data: bytes, crc: int) -> None:
    assert crc32c(data) == crc
    assert crc32c(bytearray(data)) == crc
    assert crc32c(memoryview(b"xyz" + data)[3:]) == crc  # a view that starts mid-buffer


def test_every_length_agrees_with_a_byte_at_a_time() -> None:
    """The 8-byte rounds and the tail: each length up to three rounds, against the CRC
    computed bit by bit from its definition."""
    data = bytes((index * 37 + 11) % 256 for index in range(25))
    for length in range(len(data) + 1):
        assert crc32c(data[:length]) == bitwise_crc32c(data[:length]), length


def bitwise_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def test_the_masked_crcs_of_a_real_event_file_hold() -> None:
    """Each record's two stored checksums, as tensorboard's writer made them."""
    data = EVENT_FILE.read_bytes()
    position = records = 0
    while position < len(data):
        length, length_crc = struct.unpack_from("<QI", data, position)
        assert masked_crc32c(data[position : position + 8]) == length_crc
        record = data[position + 12 : position + 12 + length]
        (data_crc,) = struct.unpack_from("<I", data, position + 12 + length)
        assert masked_crc32c(record) == data_crc
        position += 16 + length
        records += 1
    assert records > 600
