"""LineSplitter: terminators, decoding, NULs, overlong lines, pending bytes."""

from __future__ import annotations

import pytest

from sentinel.parsing.lines import LineSplitter


def split_all(chunks: list[bytes], max_line_bytes: int = 1 << 20) -> tuple[list[str], int]:
    splitter = LineSplitter(max_line_bytes)
    lines: list[str] = []
    for chunk in chunks:
        lines += splitter.feed(chunk)
    return lines, splitter.pending_bytes


CASES = [
    pytest.param([b"a\nb\n"], ["a", "b"], 0, id="lf"),
    pytest.param([b"a\r\nb\r\n"], ["a", "b"], 0, id="crlf"),
    pytest.param([b"a\r", b"\nb\r\n"], ["a", "b"], 0, id="crlf-split-across-chunks"),
    pytest.param([b"a\r"], ["a"], 1, id="trailing-cr-emitted-and-held"),
    pytest.param([b"a\r", b"b\n"], ["a", "b"], 0, id="cr-then-text-is-bare-cr"),
    pytest.param([b" 10%|#\r 20%|##\r 30%|###\n"], [" 10%|#", " 20%|##", " 30%|###"], 0, id="tqdm"),
    pytest.param([b"par", b"tial", b" line\n"], ["partial line"], 0, id="partial-joined"),
    pytest.param([b"done\npart"], ["done"], 4, id="partial-held"),
    pytest.param([b"\n\n\r\n\r\r\nx\n"], ["x"], 0, id="empty-lines-dropped"),
    pytest.param([b"caf\xc3\xa9 \xff\xfe ok\n"], ["café \ufffd\ufffd ok"], 0, id="invalid-utf8"),
    pytest.param([b"\xc3", b"\xa9\n"], ["é"], 0, id="utf8-split-across-chunks"),
    pytest.param([b"\x00\x00\x00loss=1\n\x00\x00\n"], ["loss=1"], 0, id="leading-nuls"),
    pytest.param([b"\x00" * 10, b"\x00" * 5, b"x=1\n"], ["x=1"], 0, id="nuls-across-chunks"),
    pytest.param([b"a\x00b\n"], ["a\x00b"], 0, id="inner-nul-kept"),
]


@pytest.mark.parametrize(("chunks", "expected", "pending"), CASES)
def test_split(chunks: list[bytes], expected: list[str], pending: int) -> None:
    assert split_all(chunks) == (expected, pending)


@pytest.mark.parametrize(("chunks", "expected", "pending"), CASES)
def test_split_byte_by_byte_gives_the_same_lines(
    chunks: list[bytes], expected: list[str], pending: int
) -> None:
    data = b"".join(chunks)
    assert split_all([data[i : i + 1] for i in range(len(data))]) == (expected, pending)


def test_pending_bytes_counts_the_unfinished_line_with_its_nuls() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"one\n\x00\x00tw") == ["one"]
    assert splitter.pending_bytes == 4
    assert splitter.feed(b"o\n") == ["two"]
    assert splitter.pending_bytes == 0


def test_flush_emits_the_partial_line() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"a\nb") == ["a"]
    assert splitter.flush() == ["b"]
    assert splitter.pending_bytes == 0
    assert splitter.flush() == []


def test_flush_drops_a_held_cr() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"a\r") == ["a"]
    assert splitter.flush() == []
    assert splitter.pending_bytes == 0


@pytest.mark.parametrize("chunk_size", [7, 4096, 1 << 20], ids=["tiny", "4k", "whole"])
def test_overlong_line_is_truncated_and_the_next_lines_kept(chunk_size: int) -> None:
    data = b"before\n" + b"x" * 100_000 + b"\nafter\n" + b"y" * 50 + b"\nlast\n"
    splitter = LineSplitter(max_line_bytes=1000)
    lines: list[str] = []
    for start in range(0, len(data), chunk_size):
        lines += splitter.feed(data[start : start + chunk_size])
        assert len(splitter._partial) <= 1000  # bounded while the line is unfinished
    assert lines == [
        "before",
        "x" * 1000 + " …[truncated 99000 bytes]",
        "after",
        "y" * 50,
        "last",
    ]


def test_overlong_partial_counts_every_byte_as_pending() -> None:
    splitter = LineSplitter(max_line_bytes=10)
    assert splitter.feed(b"a" * 25) == []
    assert splitter.pending_bytes == 25
    assert splitter.feed(b"\n") == ["a" * 10 + " …[truncated 15 bytes]"]


def test_many_lines_in_one_chunk() -> None:
    data = b"".join(b"step=%d loss=0.5\n" % i for i in range(10_000))
    lines, pending = split_all([data])
    assert lines == [f"step={i} loss=0.5" for i in range(10_000)]
    assert pending == 0


def test_max_line_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_line_bytes"):
        LineSplitter(0)
