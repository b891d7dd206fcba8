"""TensorBoard event files: TFRecord-framed ``Event`` protobufs, scalars as JSON lines.

An event file (``events.out.tfevents.<time>.<host>...``) is a stream of records,
``uint64 length, uint32 masked_crc32c(length), data[length], uint32
masked_crc32c(data)``, little-endian, each ``data`` an ``Event``.
``RecordSplitter`` turns the bytes into one JSON text line per record that
carries scalars::

    {"step": 12, "wall_time": 1700000000.5, "scalars": {"train/loss": 2.3}}

and ``TensorBoardReader`` turns such a line into samples (the tag through
``normalise_name``, the time from ``wall_time``). Scalars are
``simple_value`` (TF1, ``torch.utils.tensorboard``) and rank-0 numeric
tensors (TF2 summaries, ``add_scalar(new_style=True)``) whose plugin is
``scalars`` or unnamed; NaN and infinities are kept (JSON ``NaN``,
``Infinity``). Other records (the file version, graphs, images, histograms)
give no line; their bytes are consumed.

A broken record gives a ``{"garbled": "..."}`` line, which the reader raises
as ``Garbled`` so the parser's counts show it, and no samples: a record whose
data CRC does not match, a record that does not decode, a length whose CRC
does not match (the splitter then looks for the next valid record header, one
line per broken stretch), and a torn record at the end of a finished file.
Records longer than ``max(max_line_bytes, 64 KiB)`` are skipped unread:
scalars are a few dozen bytes; the rest are images and the like.

Records are read here, without the ``tensorboard`` package: the framing and its
checksums (``crc32c``), and of each ``Event`` (tensorboard's ``event.proto``,
``summary.proto``, ``tensor.proto``) only the fields that carry scalars, from the wire
format (``protowire``), read as protobuf's own parser reads them. The CRC is pure
Python (about 0.1 s a MiB): a record's length is always checked, its data when the
record is at most 64 KiB or carries scalars, so an image or histogram over 64 KiB,
which no rule reads, is not checksummed.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

from sentinel.model.records import Sample
from sentinel.parsing.crc32c import masked_crc32c
from sentinel.parsing.file_format import FileFormat
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
from sentinel.parsing.values import Garbled, normalise_name

#: What a file name contains to be read as an event file.
NAME_MARK = "tfevents"

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_HEADER_BYTES = _HEADER.size
_FOOTER_BYTES = _CRC.size
#: Records up to this size always have their data CRC checked; longer ones only
#: when they carry scalars.
_ALWAYS_CHECKED_BYTES = 64 * 1024

# The field numbers read, from tensorboard/compat/proto/*.proto.
_EVENT_WALL_TIME, _EVENT_STEP, _EVENT_SUMMARY = 1, 2, 5
#: ``Event``'s oneof ``what``, all length-delimited: file_version ... meta_graph_def.
_EVENT_WHAT = frozenset(range(3, 10))
_SUMMARY_VALUE = 1
_VALUE_TAG, _VALUE_SIMPLE, _VALUE_NODE_NAME, _VALUE_TENSOR, _VALUE_METADATA = 1, 2, 7, 8, 9
#: ``Summary.Value``'s oneof ``value``, each member's wire type: simple_value,
#: obsolete_old_style_histogram, image, histo, audio, tensor.
_VALUE_KINDS = {2: I32, 3: LEN, 4: LEN, 5: LEN, 6: LEN, 8: LEN}
_METADATA_PLUGIN_DATA = 1
_PLUGIN_NAME = 1
_TENSOR_DTYPE, _TENSOR_SHAPE, _TENSOR_CONTENT = 1, 2, 4
_SHAPE_DIM = 2


def _half_bits(bits: int) -> float:
    return float(struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0])


def _bfloat16_bits(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0])


#: ``TensorProto``'s repeated fields read: its number -> the wire type of its values, and
#: a value as the field's type (float_val, double_val, int_val, int64_val, half_val,
#: uint32_val, uint64_val).
_REPEATED: dict[int, tuple[int, Callable[[Field], float]]] = {
    5: (I32, lambda field: single(field[3])),
    6: (I64, lambda field: double(field[3])),
    7: (VARINT, lambda field: int32(field[2])),
    10: (VARINT, lambda field: int64(field[2])),
    13: (VARINT, lambda field: int32(field[2])),
    16: (VARINT, lambda field: uint32(field[2])),
    17: (VARINT, lambda field: field[2]),
}
#: A dtype (``types.proto``) -> its repeated field, the struct format of its
#: tensor_content, and the number either holds.
_DTYPES: dict[int, tuple[int, str, Callable[[Any], float]]] = {
    1: (5, "<f", float),  # DT_FLOAT
    2: (6, "<d", float),  # DT_DOUBLE
    19: (13, "<H", _half_bits),  # DT_HALF, as its bits (in half_val, or tensor_content)
    14: (13, "<H", _bfloat16_bits),  # DT_BFLOAT16, the same
    6: (7, "<b", float),  # DT_INT8
    4: (7, "<B", float),  # DT_UINT8
    5: (7, "<h", float),  # DT_INT16
    17: (7, "<H", float),  # DT_UINT16
    3: (7, "<i", float),  # DT_INT32
    9: (10, "<q", float),  # DT_INT64
    22: (16, "<I", float),  # DT_UINT32
    23: (17, "<Q", float),  # DT_UINT64
}


class RecordSplitter:
    """Turns an event file's bytes into JSON lines, one per record with scalars.

    Same interface as ``LineSplitter``. A half-written last record stays
    pending (in ``pending_bytes``), so a follower's offset stays at a record
    boundary, and is read once the rest arrives. Memory is bounded: a record
    too long to decode is counted and skipped as it streams past.
    """

    def __init__(self, max_line_bytes: int = 1 << 20) -> None:
        self._max_record_bytes = max(max_line_bytes, _ALWAYS_CHECKED_BYTES)
        self._buffer = bytearray()
        # An oversized record being skipped: bytes still to skip, bytes skipped so far.
        self._skip_left = 0
        self._skipped = 0
        # Inside a stretch of bytes with no valid record header.
        self._lost = False
        #: Complete records seen, records broken (one per broken stretch), records skipped.
        self.records = 0
        self.garbled = 0
        self.oversized = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes of the unfinished last record (all of them, skipped ones included)."""
        return len(self._buffer) + self._skipped

    def feed(self, data: bytes) -> list[str]:
        """The JSON lines of the records completed by ``data``."""
        if self._skip_left:
            taken = min(self._skip_left, len(data))
            self._skip_left -= taken
            self._skipped += taken
            data = data[taken:]
            if self._skip_left:
                return []
            self._skipped = 0
        self._buffer += data
        lines: list[str] = []
        buffer = self._buffer
        view = memoryview(buffer)
        position = 0
        try:
            while len(buffer) - position >= _HEADER_BYTES:
                length, length_crc = _HEADER.unpack_from(buffer, position)
                if masked_crc32c(bytes(view[position : position + 8])) != length_crc:
                    if not self._lost:
                        self._lost = True
                        lines.append(self._broken("record length fails its CRC"))
                    position += 1
                    continue
                self._lost = False
                total = _HEADER_BYTES + length + _FOOTER_BYTES
                if length > self._max_record_bytes:
                    self.oversized += 1
                    available = len(buffer) - position
                    if available >= total:
                        position += total
                        continue
                    self._skip_left = total - available
                    self._skipped = available
                    position = len(buffer)
                    break
                if len(buffer) - position < total:
                    break
                start = position + _HEADER_BYTES
                record = bytes(view[start : start + length])
                (data_crc,) = _CRC.unpack_from(buffer, start + length)
                position += total
                self.records += 1
                line = self._line(record, data_crc)
                if line is not None:
                    lines.append(line)
        finally:
            view.release()
        del buffer[:position]
        return lines

    def flush(self) -> list[str]:
        """The stream ended: a torn last record is reported broken and dropped."""
        torn = bool(self._buffer.strip(b"\x00")) or self._skip_left > 0
        self._buffer.clear()
        self._skip_left = self._skipped = 0
        self._lost = False
        return [self._broken("torn record at the end of the file")] if torn else []

    def _line(self, record: bytes, data_crc: int) -> str | None:
        checked = len(record) <= _ALWAYS_CHECKED_BYTES
        if checked and masked_crc32c(record) != data_crc:
            return self._broken("record data fails its CRC")
        try:
            step, wall_time, summary = _event(record)
            scalars = {} if summary is None else _scalars(summary)
        except WireError:
            return self._broken("record is not an Event")
        if not scalars:
            return None
        if not checked and masked_crc32c(record) != data_crc:
            return self._broken("record data fails its CRC")
        return json.dumps(
            {"step": step, "wall_time": wall_time, "scalars": scalars},
            separators=(",", ":"),
        )

    def _broken(self, reason: str) -> str:
        self.garbled += 1
        return json.dumps({"garbled": f"TensorBoard {reason}"})


class TensorBoardReader:
    """Reads the JSON lines ``RecordSplitter`` makes of one event file."""

    def parse(self, text: str) -> list[Sample] | None:
        try:
            record = json.loads(text)
        except ValueError:
            return None
        if not isinstance(record, dict):
            return None
        if "garbled" in record:
            raise Garbled(str(record["garbled"]))
        scalars = record.get("scalars")
        if not isinstance(scalars, dict):
            return None
        step = record.get("step")
        wall_time = record.get("wall_time")
        time = float(wall_time) if isinstance(wall_time, int | float) else None
        if time is not None and not math.isfinite(time):
            time = None
        step = step if isinstance(step, int) else None
        return [
            Sample(normalise_name(tag), float(value), step, time)
            for tag, value in scalars.items()
            if isinstance(value, int | float)
        ]


class TensorBoardFiles(FileFormat):
    """A file whose name contains ``tfevents``."""

    def match(self, path: PurePath) -> str | None:
        return "" if NAME_MARK in path.name else None

    def new_reader(self, key: str) -> TensorBoardReader:
        return TensorBoardReader()

    def new_splitter(self, path: Path, max_line_bytes: int) -> RecordSplitter:
        """Records as JSON lines."""
        del path
        return RecordSplitter(max_line_bytes)


FORMAT = TensorBoardFiles()


def _event(record: bytes) -> tuple[int, float, bytes | None]:
    """An ``Event``'s step, wall time and summary (its pieces joined); None when the
    event holds something else (the file version, a graph, a log message).

    ``WireError`` where it is not an ``Event``."""
    wall_time, step = 0.0, 0
    what = 0  # the member of the oneof seen last
    summary: list[bytes] = []
    for field in fields(record):
        number, wire, integer, payload = field
        if number == _EVENT_WALL_TIME and wire == I64:
            wall_time = double(payload)
        elif number == _EVENT_STEP and wire == VARINT:
            step = int64(integer)
        elif number in _EVENT_WHAT and wire == LEN:
            if number != what:  # another member replaces the one set before
                what, summary = number, []
            if number == _EVENT_SUMMARY:
                summary.append(payload)
    return step, wall_time, b"".join(summary) if what == _EVENT_SUMMARY else None


def _scalars(summary: bytes) -> dict[str, float]:
    """The scalars of a ``Summary``, by tag (a tag given twice: its last value)."""
    scalars: dict[str, float] = {}
    for number, wire, _, payload in fields(summary):
        if number == _SUMMARY_VALUE and wire == LEN:
            scalar = _value_scalar(payload)
            if scalar is not None:
                scalars[scalar[0]] = scalar[1]
    return scalars


def _value_scalar(value: bytes) -> tuple[str, float] | None:
    """A ``Summary.Value``'s tag (else its node name) and scalar: its ``simple_value``, or
    its rank-0 numeric tensor when no plugin other than ``scalars`` owns it. None for
    anything else (images, histograms, text, vectors)."""
    tag = node_name = b""
    kind = 0  # the member of the oneof seen last
    simple = b""
    tensor: list[bytes] = []
    metadata: list[bytes] = []
    for number, wire, _, payload in fields(value):
        if number == _VALUE_TAG and wire == LEN:
            tag = payload
        elif number == _VALUE_NODE_NAME and wire == LEN:
            node_name = payload
        elif number == _VALUE_METADATA and wire == LEN:
            metadata.append(payload)
        elif _VALUE_KINDS.get(number) == wire:
            if number != kind:
                kind, tensor = number, []
            if number == _VALUE_SIMPLE:
                simple = payload
            elif number == _VALUE_TENSOR:
                tensor.append(payload)
    name = text(tag) or text(node_name)
    if kind == _VALUE_SIMPLE:
        return name, single(simple)
    if kind == _VALUE_TENSOR and _plugin_name(b"".join(metadata)) in ("", "scalars"):
        scalar = _tensor_scalar(b"".join(tensor))
        if scalar is not None:
            return name, scalar
    return None


def _plugin_name(metadata: bytes) -> str:
    """``SummaryMetadata.plugin_data.plugin_name``."""
    plugin_data = [
        payload
        for number, wire, _, payload in fields(metadata)
        if number == _METADATA_PLUGIN_DATA and wire == LEN
    ]
    name = b""
    for number, wire, _, payload in fields(b"".join(plugin_data)):
        if number == _PLUGIN_NAME and wire == LEN:
            name = payload
    return text(name)


def _tensor_scalar(tensor: bytes) -> float | None:
    """The value of a rank-0 numeric ``TensorProto``; None for anything else."""
    dtype, has_dims, content = 0, False, b""
    first: dict[int, Field] = {}  # a repeated field's first value
    for field in fields(tensor):
        number, wire, integer, payload = field
        if number == _TENSOR_DTYPE and wire == VARINT:
            dtype = int32(integer)
        elif number == _TENSOR_SHAPE and wire == LEN:
            has_dims = _has_dims(payload) or has_dims
        elif number == _TENSOR_CONTENT and wire == LEN:
            content = payload
        elif number in _REPEATED:
            values = elements(field, _REPEATED[number][0])
            if values and number not in first:
                first[number] = values[0]
    if has_dims:
        return None
    kind = _DTYPES.get(dtype)
    if kind is None:
        return None
    repeated, content_format, decode = kind
    if repeated in first:
        return decode(_REPEATED[repeated][1](first[repeated]))
    if len(content) != struct.calcsize(content_format):
        return None
    # Like half_val, tensor_content holds a half or bfloat16 as its bits.
    (raw,) = struct.unpack(content_format, content)
    return decode(raw)


def _has_dims(shape: bytes) -> bool:
    """Whether a ``TensorShapeProto`` has a dimension (a rank-0 tensor has none)."""
    dims = False
    for number, wire, _, _ in fields(shape):
        dims = dims or (number == _SHAPE_DIM and wire == LEN)
    return dims
