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

Decoding needs the ``tensorboard`` package (the ``tensorboard`` extra); the
framing and the reader do not.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Callable
from functools import cache
from pathlib import Path, PurePath
from typing import Any

from sentinel.model.records import Sample
from sentinel.parsing.file_format import FileFormat
from sentinel.parsing.values import Garbled, normalise_name

logger = logging.getLogger(__name__)

INSTALL_HINT = "reading TensorBoard event files needs: pip install 'sentinel-watchdog[tensorboard]'"
#: What a file name contains to be read as an event file.
NAME_MARK = "tfevents"

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_HEADER_BYTES = _HEADER.size
_FOOTER_BYTES = _CRC.size
#: Records up to this size always have their data CRC checked; longer ones only
#: when they carry scalars (the pure-Python CRC costs about 0.25 s per MiB).
_ALWAYS_CHECKED_BYTES = 64 * 1024


class MissingExtra(RuntimeError):
    """An optional dependency a file format needs is not installed."""


class _Codec:
    """What decoding needs from tensorboard, imported on first use."""

    def __init__(self) -> None:
        try:
            from tensorboard.compat.proto import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
                event_pb2,
                types_pb2,
            )
            from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
                masked_crc32c,
            )
        except ImportError as error:
            raise MissingExtra(INSTALL_HINT) from error
        self.parse_event: Callable[[bytes], Any] = event_pb2.Event.FromString
        self.masked_crc: Callable[[bytes], int] = masked_crc32c
        # dtype -> (repeated field of the value, struct format of tensor_content, decode)
        self.dtypes: dict[int, tuple[str, str, Callable[[Any], float]]] = {
            types_pb2.DT_FLOAT: ("float_val", "<f", float),
            types_pb2.DT_DOUBLE: ("double_val", "<d", float),
            types_pb2.DT_HALF: ("half_val", "<H", _half_bits),
            types_pb2.DT_BFLOAT16: ("half_val", "<H", _bfloat16_bits),
            types_pb2.DT_INT8: ("int_val", "<b", float),
            types_pb2.DT_UINT8: ("int_val", "<B", float),
            types_pb2.DT_INT16: ("int_val", "<h", float),
            types_pb2.DT_UINT16: ("int_val", "<H", float),
            types_pb2.DT_INT32: ("int_val", "<i", float),
            types_pb2.DT_INT64: ("int64_val", "<q", float),
            types_pb2.DT_UINT32: ("uint32_val", "<I", float),
            types_pb2.DT_UINT64: ("uint64_val", "<Q", float),
        }


def _half_bits(bits: int) -> float:
    return float(struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0])


def _bfloat16_bits(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0])


@cache
def codec() -> _Codec:
    """tensorboard's protobufs and CRC; ``MissingExtra`` when it is not installed."""
    return _Codec()


def available() -> bool:
    """Whether event files can be decoded here (the ``tensorboard`` extra is installed)."""
    try:
        codec()
    except MissingExtra:
        return False
    return True


class RecordSplitter:
    """Turns an event file's bytes into JSON lines, one per record with scalars.

    Same interface as ``LineSplitter``. A half-written last record stays
    pending (in ``pending_bytes``), so a follower's offset stays at a record
    boundary, and is read once the rest arrives. Memory is bounded: a record
    too long to decode is counted and skipped as it streams past.
    """

    def __init__(self, max_line_bytes: int = 1 << 20) -> None:
        self._codec = codec()
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
                if self._codec.masked_crc(bytes(view[position : position + 8])) != length_crc:
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
        if checked and self._codec.masked_crc(record) != data_crc:
            return self._broken("record data fails its CRC")
        try:
            event = self._codec.parse_event(record)
        except Exception:  # protobuf's DecodeError, or worse on garbage
            return self._broken("record is not an Event")
        scalars = self._scalars(event)
        if not scalars:
            return None
        if not checked and self._codec.masked_crc(record) != data_crc:
            return self._broken("record data fails its CRC")
        return json.dumps(
            {"step": int(event.step), "wall_time": float(event.wall_time), "scalars": scalars},
            separators=(",", ":"),
        )

    def _scalars(self, event: Any) -> dict[str, float]:
        scalars: dict[str, float] = {}
        if not event.HasField("summary"):
            return scalars
        for value in event.summary.value:
            kind = value.WhichOneof("value")
            tag = value.tag or value.node_name
            if kind == "simple_value":
                scalars[tag] = float(value.simple_value)
            elif kind == "tensor" and value.metadata.plugin_data.plugin_name in ("", "scalars"):
                number = self._tensor_scalar(value.tensor)
                if number is not None:
                    scalars[tag] = number
        return scalars

    def _tensor_scalar(self, tensor: Any) -> float | None:
        """The value of a rank-0 numeric tensor; None for anything else."""
        if tensor.tensor_shape.dim:
            return None
        kind = self._codec.dtypes.get(tensor.dtype)
        if kind is None:
            return None
        field, content_format, decode = kind
        values = getattr(tensor, field)
        if values:
            return decode(values[0])
        content = tensor.tensor_content
        if len(content) != struct.calcsize(content_format):
            return None
        # Like half_val, tensor_content holds a half or bfloat16 as its bits.
        (raw,) = struct.unpack(content_format, content)
        return decode(raw)

    def _broken(self, reason: str) -> str:
        self.garbled += 1
        return json.dumps({"garbled": f"TensorBoard {reason}"})


class HeldSplitter:
    """Stands in for ``RecordSplitter`` when tensorboard is missing: reads nothing.

    Every byte stays pending, so a follower's committed offset stays at 0 and
    the file is read in full once the extra is installed and sentinel restarted.
    """

    def __init__(self) -> None:
        self._held = 0

    @property
    def pending_bytes(self) -> int:
        return self._held

    def feed(self, data: bytes) -> list[str]:
        self._held += len(data)
        return []

    def flush(self) -> list[str]:
        self._held = 0
        return []


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


@cache
def _report_unreadable(path: str, reason: str) -> None:
    logger.error("%s is not read: %s", path, reason)


class TensorBoardFiles(FileFormat):
    """A file whose name contains ``tfevents``; read only with the ``tensorboard`` extra."""

    def match(self, path: PurePath) -> str | None:
        return "" if NAME_MARK in path.name else None

    def new_reader(self, key: str) -> TensorBoardReader:
        return TensorBoardReader()

    def new_splitter(self, path: Path, max_line_bytes: int) -> RecordSplitter | HeldSplitter:
        """Records as JSON lines; while tensorboard is missing, a splitter that holds the
        bytes unread, the missing extra logged once per path (``files.require_extras``
        is the check that fails at start)."""
        try:
            return RecordSplitter(max_line_bytes)
        except MissingExtra as error:
            _report_unreadable(str(path), str(error))
            return HeldSplitter()

    def unreadable(self) -> str | None:
        return None if available() else INSTALL_HINT


FORMAT = TensorBoardFiles()
