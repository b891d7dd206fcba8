"""TensorBoard event files: real files from tensorboard's own writer, read record by record.

The files are written with ``EventFileWriter``, the writer under
``torch.utils.tensorboard.SummaryWriter``; scalars take the forms writers use:
``simple_value`` (TF1, torch), a ``float_val`` tensor (torch ``new_style``),
``tensor_content`` bytes (TF2) and a ``double_val`` tensor. sentinel reads them without
tensorboard; tensorboard's own decoder (``LegacyEventFileLoader``, ``make_ndarray``) is
the reference its lines are checked against, for every committed event file too.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "tensorboard", reason="writes and decodes with tensorboard's own code: pip install '.[test]'"
)

from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from sentinel.engine.core import Engine
from sentinel.model.records import Alert, Line, Sample
from sentinel.parsing import Garbled, LineParser
from sentinel.parsing import tensorboard as tb
from sentinel.parsing.files import iter_replay
from sentinel.rules import BaseDetector, RuleConfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EVENT_FIXTURES = sorted(FIXTURES.rglob("*tfevents*"))
T0 = 1_700_000_000.5
Span = tuple[int, int]
Summary = summary_pb2.Summary
SCALARS_PLUGIN = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
)


class Recorder(BaseDetector):
    """A rule that records every sample the engine hands it."""

    rule = "recorder"

    def __init__(self) -> None:
        super().__init__(RuleConfig())
        self.samples: list[Sample] = []

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        self.samples.append(sample)
        return []


def comparable(samples: list[Sample]) -> list[tuple[str, object, int | None, float | None]]:
    return [(s.name, "nan" if math.isnan(s.value) else s.value, s.step, s.time) for s in samples]


def simple(tag: str, value: float) -> Summary:
    return Summary(value=[Summary.Value(tag=tag, simple_value=value)])


def float_tensor(tag: str, value: float) -> Summary:
    """``torch.utils.tensorboard.summary.scalar(..., new_style=True)``."""
    tensor = tensor_pb2.TensorProto(dtype="DT_FLOAT", float_val=[value])
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=SCALARS_PLUGIN)])


def content_tensor(tag: str, value: float) -> Summary:
    """What TF2's ``tf.summary.scalar`` writes after a tag's first event: bytes, no plugin."""
    tensor = tensor_pb2.TensorProto(
        dtype="DT_FLOAT",
        tensor_shape=tensor_shape_pb2.TensorShapeProto(),
        tensor_content=struct.pack("<f", value),
    )
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor)])


def double_tensor(tag: str, value: float) -> Summary:
    tensor = tensor_pb2.TensorProto(dtype="DT_DOUBLE", double_val=[value])
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=SCALARS_PLUGIN)])


def other_plugin_tensor(tag: str, value: float) -> Summary:
    """A rank-0 float another plugin owns: not a scalar to watch."""
    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="hparams")
    )
    tensor = tensor_pb2.TensorProto(dtype="DT_FLOAT", float_val=[value])
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=metadata)])


def histogram(tag: str) -> Summary:
    histo = summary_pb2.HistogramProto(min=0, max=1, num=2, sum=1, bucket_limit=[1], bucket=[2])
    return Summary(value=[Summary.Value(tag=tag, histo=histo)])


def vector(tag: str) -> Summary:
    """A rank-1 tensor: not a scalar, whatever its plugin says."""
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=2)])
    tensor = tensor_pb2.TensorProto(dtype="DT_FLOAT", float_val=[1.0, 2.0], tensor_shape=shape)
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=SCALARS_PLUGIN)])


def text(tag: str) -> Summary:
    tensor = tensor_pb2.TensorProto(dtype="DT_STRING", string_val=[b"hello"])
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor)])


def write_events(folder: Path, events: list[tuple[int, Summary | None]]) -> Path:
    """An event file as ``SummaryWriter`` writes it: version record first, then the events."""
    writer = EventFileWriter(str(folder))
    for index, (step, summary) in enumerate(events):
        event = event_pb2.Event(wall_time=T0 + index, step=step)
        if summary is not None:
            event.summary.CopyFrom(summary)
        writer.add_event(event)
    writer.close()
    (path,) = folder.glob("*tfevents*")
    return path


def replay_samples(*paths: Path) -> tuple[list[Sample], LineParser]:
    parser = LineParser()
    recorder = Recorder()
    engine = Engine([recorder], parser)
    for source, line in iter_replay(list(paths)):
        engine.feed_line(Line(source, line, 0.0))
    return recorder.samples, parser


MIXED_RUN: list[tuple[int, Summary | None]] = [
    (1, simple("train/loss", 2.5)),
    (1, float_tensor("train/grad_norm", 0.75)),
    (2, content_tensor("train/learning_rate", 0.125)),
    (2, histogram("weights")),
    (3, simple("train/loss", math.nan)),
    (3, double_tensor("eval/loss", 1.5)),
    (4, vector("train/loss")),
    (4, text("notes")),
    (4, other_plugin_tensor("_hparams_/session_start_info", 0.0)),
    (5, simple("Loss/train", math.inf)),
    (6, None),
]


def test_event_file_through_the_engine_gives_exact_samples(tmp_path: Path) -> None:
    path = write_events(tmp_path, MIXED_RUN)
    samples, parser = replay_samples(path)
    assert comparable(samples) == [
        ("loss", 2.5, 1, T0),
        ("grad_norm", 0.75, 1, T0 + 1),
        ("lr", 0.125, 2, T0 + 2),
        ("loss", "nan", 3, T0 + 4),
        ("eval_loss", 1.5, 3, T0 + 5),
        ("loss", math.inf, 5, T0 + 9),
    ]
    assert (parser.stats.lines, parser.stats.garbled) == (6, 0)


def test_a_folder_replays_its_event_files(tmp_path: Path) -> None:
    write_events(tmp_path / "run", [(7, simple("loss", 1.0))])
    (tmp_path / "run" / "notes.txt").write_text("not a metric file\n")
    samples, _ = replay_samples(tmp_path)
    assert comparable(samples) == [("loss", 1.0, 7, T0)]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            '{"step":3,"wall_time":1.5,"scalars":{"train/loss":NaN,"val/loss":2}}',
            [("loss", "nan", 3, 1.5), ("eval_loss", 2.0, 3, 1.5)],
            id="nan-and-int",
        ),
        pytest.param('{"step":3,"wall_time":1.5}', None, id="no-scalars"),
        pytest.param("not json", None, id="not-json"),
    ],
)
def test_reader_lines(line: str, expected: list[object] | None) -> None:
    found = tb.TensorBoardReader().parse(line)
    assert (found if found is None else comparable(found)) == expected


def test_reader_raises_garbled_for_a_broken_record_line() -> None:
    with pytest.raises(Garbled, match="CRC"):
        tb.TensorBoardReader().parse(
            json.dumps({"garbled": "TensorBoard record data fails its CRC"})
        )


# -- against tensorboard's own decoder -------------------------------------------------------


def tensor_of(tag: str, dtype: str, **fields: Any) -> Summary:
    """A rank-0 tensor of ``dtype``, its value in the ``fields`` given, no plugin named."""
    tensor = tensor_pb2.TensorProto(dtype=dtype, **fields)
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor)])


#: Scalar tensors of every numeric dtype tensorboard's ``make_ndarray`` decodes, in their
#: repeated fields and as ``tensor_content``, with values at the edges of their types.
EVERY_DTYPE: list[tuple[int, Summary | None]] = [
    (1, tensor_of("f", "DT_FLOAT", float_val=[-0.0])),
    (2, tensor_of("d", "DT_DOUBLE", double_val=[1e300])),
    (3, tensor_of("h", "DT_HALF", half_val=[0x7BFF])),  # 65504, the largest half
    (4, tensor_of("h_bytes", "DT_HALF", tensor_content=struct.pack("<e", -2.5))),
    (5, tensor_of("i8", "DT_INT8", int_val=[-128])),
    (6, tensor_of("u8", "DT_UINT8", tensor_content=b"\xff")),
    (7, tensor_of("i16", "DT_INT16", int_val=[-32768])),
    (8, tensor_of("u16", "DT_UINT16", int_val=[65535])),
    (9, tensor_of("i32", "DT_INT32", int_val=[-(2**31)])),
    (10, tensor_of("i32_bytes", "DT_INT32", tensor_content=struct.pack("<i", -7))),
    (11, tensor_of("i64", "DT_INT64", int64_val=[-(2**63)])),
    (12, tensor_of("u32_bytes", "DT_UINT32", tensor_content=struct.pack("<I", 2**32 - 1))),
    (13, tensor_of("u64_bytes", "DT_UINT64", tensor_content=struct.pack("<Q", 2**63 + 1))),
    (14, tensor_of("d_bytes", "DT_DOUBLE", tensor_content=struct.pack("<d", math.pi))),
]


def tensorboard_lines(path: Path) -> list[str]:
    """What ``RecordSplitter`` must make of ``path``, byte for byte, from tensorboard's own
    decoding: each record's simple values and rank-0 numeric tensors no other plugin owns."""
    lines = []
    for event in LegacyEventFileLoader(str(path)).Load():
        scalars: dict[str, float] = {}
        for value in event.summary.value:
            tag = value.tag or value.node_name
            kind = value.WhichOneof("value")
            if kind == "simple_value":
                scalars[tag] = float(value.simple_value)
            elif kind == "tensor" and value.metadata.plugin_data.plugin_name in ("", "scalars"):
                array = tensor_util.make_ndarray(value.tensor)
                if array.ndim == 0 and array.dtype.kind in "fiu":
                    scalars[tag] = float(array)
        if scalars:
            record = {"step": event.step, "wall_time": event.wall_time, "scalars": scalars}
            lines.append(json.dumps(record, separators=(",", ":")))
    return lines


def framed(data: bytes) -> bytes:
    """``data`` as one TFRecord, its checksums made by tensorboard's own CRC."""
    header = struct.pack("<Q", len(data))
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


def sentinel_lines(path: Path) -> list[str]:
    splitter = tb.RecordSplitter()
    lines = splitter.feed(path.read_bytes()) + splitter.flush()
    assert splitter.garbled == 0
    return lines


@pytest.mark.parametrize(
    "path", EVENT_FIXTURES, ids=[str(p.relative_to(FIXTURES)) for p in EVENT_FIXTURES]
)
def test_every_committed_event_file_reads_as_tensorboard_decodes_it(path: Path) -> None:
    expected = tensorboard_lines(path)
    assert len(expected) >= 390  # every scalar of the run, not an empty agreement
    assert sentinel_lines(path) == expected


def test_the_event_fixtures_are_all_found() -> None:
    assert {str(p.relative_to(FIXTURES).parent) for p in EVENT_FIXTURES} == {
        "lightning/defaults",
        "run_files",
        "tb/diverge",
        "torch/spikes/tb",
    }


@pytest.mark.parametrize(
    ("events", "scalar_records"),
    [
        # All but the histogram, the vector, the text and the hparams tensor.
        pytest.param(MIXED_RUN, 6, id="the-forms-writers-use"),
        pytest.param(EVERY_DTYPE, 14, id="every-numeric-dtype"),
    ],
)
def test_every_form_of_scalar_reads_as_tensorboard_decodes_it(
    tmp_path: Path, events: list[tuple[int, Summary | None]], scalar_records: int
) -> None:
    path = write_events(tmp_path, events)
    expected = tensorboard_lines(path)
    assert len(expected) == scalar_records
    assert sentinel_lines(path) == expected


@pytest.mark.parametrize(
    ("summary", "value"),
    [
        pytest.param(tensor_of("x", "DT_BFLOAT16", half_val=[0x3FC0]), 1.5, id="bfloat16"),
        pytest.param(
            tensor_of("x", "DT_BFLOAT16", tensor_content=struct.pack("<H", 0xC100)),
            -8.0,
            id="bfloat16-bytes",
        ),
        pytest.param(tensor_of("x", "DT_UINT32", uint32_val=[2**32 - 1]), 2**32 - 1, id="uint32"),
        pytest.param(tensor_of("x", "DT_UINT64", uint64_val=[2**64 - 1]), 2**64 - 1, id="uint64"),
        pytest.param(tensor_of("x", "DT_FLOAT", float_val=[0.5, 7.0]), 0.5, id="two-values"),
    ],
)
def test_forms_tensorboard_cannot_decode_are_read_by_hand(summary: Summary, value: float) -> None:
    """numpy has no bfloat16, and ``make_ndarray`` reads no uint32_val, uint64_val, nor a
    rank-0 tensor given two values (protobuf's first is taken): their values by hand."""
    data = event_pb2.Event(wall_time=T0, step=1, summary=summary).SerializeToString()
    (line,) = tb.RecordSplitter().feed(framed(data))
    assert json.loads(line)["scalars"] == {"x": float(value)}


# -- the record splitter: real bytes fed as a tailer would feed them -------------------------


def records_of(data: bytes) -> list[Span]:
    """(start, end) of each record in ``data``, by its length field."""
    spans, position = [], 0
    while position < len(data):
        (length,) = struct.unpack_from("<Q", data, position)
        end = position + 12 + length + 4
        spans.append((position, end))
        position = end
    return spans


@pytest.fixture
def event_bytes(tmp_path: Path) -> bytes:
    """Version record, then loss at steps 1, 2, 3."""
    path = write_events(tmp_path, [(step, simple("loss", float(step))) for step in (1, 2, 3)])
    return path.read_bytes()


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda span: span[0] + 5, id="in-the-length"),
        pytest.param(lambda span: span[0] + 12, id="after-the-header"),
        pytest.param(lambda span: span[0] + 20, id="in-the-data"),
        pytest.param(lambda span: span[1] - 2, id="in-the-data-crc"),
        pytest.param(lambda span: span[1], id="at-the-boundary"),
    ],
)
def test_a_half_written_record_is_held_then_read_once(
    event_bytes: bytes, cut: Callable[[Span], int]
) -> None:
    spans = records_of(event_bytes)
    second_scalar = spans[2]
    at = cut(second_scalar)
    splitter = tb.RecordSplitter()
    first = splitter.feed(event_bytes[:at])
    boundary = at if at == second_scalar[1] else second_scalar[0]
    assert at - splitter.pending_bytes == boundary
    rest = splitter.feed(event_bytes[at:])
    steps = [json.loads(line)["step"] for line in first + rest]
    assert steps == [1, 2, 3]
    assert splitter.pending_bytes == 0
    assert splitter.flush() == []


def test_byte_by_byte_feeding_reads_every_record_once(event_bytes: bytes) -> None:
    boundaries = {0, *(end for _, end in records_of(event_bytes))}
    splitter = tb.RecordSplitter()
    lines = []
    for index in range(len(event_bytes)):
        lines += splitter.feed(event_bytes[index : index + 1])
        assert index + 1 - splitter.pending_bytes in boundaries
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    assert splitter.records == 4


def corrupt(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        pytest.param(lambda span: span[0] + 14, "data fails its CRC", id="data-byte"),
        pytest.param(lambda span: span[1] - 1, "data fails its CRC", id="data-crc-byte"),
        pytest.param(lambda span: span[0] + 9, "length fails its CRC", id="length-crc-byte"),
        pytest.param(lambda span: span[0] + 1, "length fails its CRC", id="length-byte"),
    ],
)
def test_a_corrupt_record_is_skipped_and_counted(
    tmp_path: Path, event_bytes: bytes, where: Callable[[Span], int], reason: str
) -> None:
    spans = records_of(event_bytes)
    path = tmp_path / "bad" / "events.out.tfevents.1.host"
    path.parent.mkdir()
    path.write_bytes(corrupt(event_bytes, where(spans[2])))
    splitter = tb.RecordSplitter()
    lines = splitter.feed(path.read_bytes()) + splitter.flush()
    assert splitter.garbled == 1
    assert [json.loads(line).get("garbled", "ok") for line in lines] == [
        "ok",
        f"TensorBoard record {reason}",
        "ok",
    ]
    samples, parser = replay_samples(path)
    assert comparable(samples) == [("loss", 1.0, 1, T0), ("loss", 3.0, 3, T0 + 2)]
    assert parser.stats.garbled == 1


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x2a\x05\x0a\x03", id="a-field-past-its-end"),
        pytest.param(b"\x2a\x02\x0a\x80", id="a-varint-cut"),
        pytest.param(b"\x0f", id="wire-type-7"),
        pytest.param(b"\x2a\x05\x0a\x03\x0a\x01\xff", id="a-tag-not-utf8"),
    ],
)
def test_a_record_whose_checksum_holds_but_is_no_event_is_garbled(
    event_bytes: bytes, data: bytes
) -> None:
    spans = records_of(event_bytes)
    fed = event_bytes[: spans[2][0]] + framed(data) + event_bytes[spans[2][0] :]
    splitter = tb.RecordSplitter()
    lines = splitter.feed(fed) + splitter.flush()
    assert [json.loads(line).get("garbled", "ok") for line in lines] == [
        "ok",
        "TensorBoard record is not an Event",
        "ok",
        "ok",
    ]


def test_a_torn_last_record_is_garbled_when_the_file_is_finished(event_bytes: bytes) -> None:
    splitter = tb.RecordSplitter()
    lines = splitter.feed(event_bytes[:-3])
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert splitter.flush() == ['{"garbled": "TensorBoard torn record at the end of the file"}']
    assert splitter.pending_bytes == 0


def test_an_oversized_record_streams_past_without_being_held(tmp_path: Path) -> None:
    image = summary_pb2.Summary.Image(height=1, width=1, encoded_image_string=b"x" * 300_000)
    big = Summary(value=[Summary.Value(tag="picture", image=image)])
    path = write_events(tmp_path, [(1, big), (2, simple("loss", 0.5))])
    data = path.read_bytes()
    boundaries = {0, *(end for _, end in records_of(data))}
    splitter = tb.RecordSplitter(max_line_bytes=1024)  # decodes records up to 64 KiB
    lines: list[str] = []
    for start in range(0, len(data), 4096):
        lines += splitter.feed(data[start : start + 4096])
        assert len(splitter._buffer) <= 64 * 1024 + 4096
        fed = min(start + 4096, len(data))
        assert fed - splitter.pending_bytes in boundaries
    assert [json.loads(line)["scalars"] for line in lines] == [{"loss": 0.5}]
    assert (splitter.oversized, splitter.pending_bytes) == (1, 0)
