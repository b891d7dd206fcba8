"""One weights file: does it parse, has its write finished, and what step does it hold.

Only headers, zip central directories and the small ``data.pkl`` inside a torch
archive are read, never a whole weights file: checkpoints are gigabytes and the
scan runs while the job writes.

A write has finished when the format's own end is in place, so one look is
enough and no timing is involved. ``torch.save`` writes a zip whose
end-of-central-directory record comes last, after every member: an archive that
opens, with every member inside the file, was written to the end. A safetensors
file is complete when it is exactly as long as its header says. A legacy
(pre-1.6) pickle stream has no such end and is taken as it is.
"""

from __future__ import annotations

import json
import pickletools
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sentinel.checkpoints.names import HDF5_SUFFIXES, SAFETENSORS_SUFFIX, checkpoint_suffix
from sentinel.checkpoints.torch_pickle import (
    EPOCH_KEYS,
    STEP_KEYS,
    PickleWalkError,
    int_under,
    top_level,
    torch_object,
)

# safetensors itself refuses headers above 100 MB; anything larger is garbage.
MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024
LIGHTNING_VERSION_KEY = "pytorch-lightning_version"

_PICKLE_PROTOCOL_PREFIXES = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


@dataclass(frozen=True)
class Content:
    """What a weights file says about itself, read without executing it."""

    step: int | None = None
    epoch: int | None = None
    where: str = ""  # e.g. "global_step in data.pkl"
    keys: frozenset[str] = frozenset()  # the top-level keys of a torch file's object


def check_weights(path: Path) -> str:
    """Return what is wrong with one weights file, or "" when it parses.

    ``OSError`` (permission, I/O) propagates: the caller cannot tell, which is not corrupt.
    """
    size = path.stat().st_size
    if size == 0:
        return "empty file"
    suffix = checkpoint_suffix(path.name)
    if suffix == SAFETENSORS_SUFFIX:
        return _check_safetensors(path, size)
    if suffix in HDF5_SUFFIXES:
        return _check_hdf5(path, size)
    if suffix:
        return _check_torch(path, size)
    return ""


#: HDF5's signature, at the start of a file without a user block.
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _check_hdf5(path: Path, size: int) -> str:
    """An HDF5 file (Keras's ``.weights.h5``): its signature, and its superblock's end-of-file
    address within the file (a write cut short ends before it). Only the superblock is read."""
    with path.open("rb") as handle:
        head = handle.read(96)
    if not head.startswith(HDF5_SIGNATURE):
        return "not an HDF5 file (no signature at its start)"
    if len(head) < 16:
        return "HDF5 superblock cut short"
    version = head[8]
    if version in (0, 1):
        offsets, base_at = head[13], 24 if version == 0 else 28
    elif version in (2, 3):
        offsets, base_at = head[9], 12
    else:
        return ""  # a superblock sentinel does not know: nothing to check
    if offsets not in (2, 4, 8):
        return f"HDF5 superblock with {offsets}-byte offsets"
    eof_at = base_at + 2 * offsets  # base address, then one more address, then end of file
    if len(head) < eof_at + offsets:
        return "HDF5 superblock cut short"
    base = int.from_bytes(head[base_at : base_at + offsets], "little")
    end = int.from_bytes(head[eof_at : eof_at + offsets], "little")
    if base + end > size:
        return f"HDF5 file cut short: {size} bytes of {base + end}"
    return ""


#: How much of a file of no format sentinel knows is read to tell what it holds.
TEXT_SNIFF_BYTES = 4096
#: A text pickle (protocol 0) up to this size is walked to its STOP opcode to tell it.
PICKLE_WALK_BYTES = 16 << 20
#: A line of numbers, as ``numpy.savetxt`` writes weights (and ``#`` comment lines).
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?))"
_NUMBERS_LINE = re.compile(rf"\s*(?:#.*|{_NUMBER}(?:[\s,;]+{_NUMBER})*[\s,;]*)?")


def text_problem(path: Path) -> str:
    """What is wrong with a checkpoint file of no format sentinel knows that is text (its
    first 4 KiB UTF-8 with no NUL, UTF-16 with its mark, or Latin-1: ``_as_text``): "" for no
    text, or a text state (JSON, a protocol-0
    pickle, a table of numbers as ``numpy.savetxt`` writes); else "a text file, not
    weights" (a note named ``checkpoint-800``, a link to ``/etc/passwd``). Binary formats
    (torch's zip and pickle, safetensors, HDF5, msgpack) hold NULs or bytes UTF-8 never
    has; a pickle is walked, never loaded."""
    with path.open("rb") as handle:
        head = handle.read(TEXT_SNIFF_BYTES)
    text = _as_text(head)
    if text is None:
        return ""
    if text.lstrip()[:1] in ("{", "["):
        return ""  # a JSON state
    if _a_text_pickle(path, head):
        return ""
    lines = text.splitlines()
    if len(head) == TEXT_SNIFF_BYTES and lines:
        lines = lines[:-1]  # cut by the sniff
    if lines and all(_NUMBERS_LINE.fullmatch(line) for line in lines):
        return ""  # a table of numbers
    return "a text file, not weights"


#: Bytes text holds: printable ASCII, tab and line ends, and (in Latin-1) 0xa0-0xff. Binary
#: formats hold NULs or other control bytes (msgpack's, a zip's, gzip's, a pickle's).
_TEXT_BYTES = frozenset(b"\t\n\r") | frozenset(range(0x20, 0x7F)) | frozenset(range(0xA0, 0x100))
#: UTF-16's byte-order marks, little- and big-endian.
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _as_text(head: bytes) -> str | None:
    """``head`` (a file's first bytes) as text: UTF-8; UTF-16 with its byte-order mark (a
    note Windows' Notepad saved); Latin-1 where every byte is one text holds; None for no
    text (empty, or binary)."""
    if not head:
        return None
    if head.startswith(_UTF16_BOMS):
        even = head[: len(head) // 2 * 2]
        try:
            text = even.decode("utf-16")
        except UnicodeDecodeError:
            return None
        return text if text and all(c.isprintable() or c in "\t\n\r" for c in text) else None
    if b"\x00" in head:
        return None
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start >= len(head) - 3 and len(head) == TEXT_SNIFF_BYTES:
            return head[: error.start].decode("utf-8")  # a character cut by the sniff
    if _TEXT_BYTES.issuperset(head):
        return head.decode("latin-1")
    return None  # bytes no text holds: binary


def _a_text_pickle(path: Path, head: bytes) -> bool:
    """Whether the file is a whole protocol-0 pickle: its opcodes walk to STOP. ``head``: its
    first bytes, read already (the whole of a file no longer: read once)."""
    size = path.stat().st_size
    if size > PICKLE_WALK_BYTES:
        return False
    if size <= len(head):
        data = head
    else:
        with path.open("rb") as handle:
            data = handle.read(PICKLE_WALK_BYTES)
    try:
        return any(opcode.name == "STOP" for opcode, _arg, _pos in pickletools.genops(data))
    except Exception:  # any malformed opcode: not a pickle
        return False


def says_whole(path: Path) -> bool:
    """Whether a weights file's own format says it is whole: a torch zip whose end record
    is at its end, a safetensors file exactly as long as its header says. A legacy pickle
    or a format sentinel does not know cannot say (False), nor can a file it cannot read."""
    try:
        if check_weights(path):
            return False
        if checkpoint_suffix(path.name) == SAFETENSORS_SUFFIX:
            return True
        with path.open("rb") as handle:
            return handle.read(2) == b"PK"
    except OSError:
        return False


def read_content(path: Path) -> Content:
    """Return the step, epoch and top-level keys a weights file holds, as far as readable."""
    if checkpoint_suffix(path.name) == SAFETENSORS_SUFFIX:
        return _safetensors_content(path)
    try:
        mapping = top_level(torch_object(path))
    except PickleWalkError:
        return Content()
    step = int_under(mapping, STEP_KEYS)
    epoch = int_under(mapping, EPOCH_KEYS)
    found = step or epoch
    return Content(
        step=step[1] if step else None,
        epoch=epoch[1] if epoch else None,
        where=f"{found[0]} in its pickle" if found else "",
        keys=frozenset(mapping),
    )


def lightning_problem(content: Content) -> str:
    """Return what a Lightning checkpoint lacks, or "" (also for any other file)."""
    if LIGHTNING_VERSION_KEY not in content.keys:
        return ""
    missing = [key for key in ("state_dict", "global_step", "epoch") if key not in content.keys]
    return f"Lightning checkpoint without {', '.join(missing)}" if missing else ""


def _safetensors_content(path: Path) -> Content:
    metadata = _safetensors_header(path).get("__metadata__")
    if not isinstance(metadata, dict):
        return Content()
    step = _int_text(metadata, STEP_KEYS)
    epoch = _int_text(metadata, EPOCH_KEYS)
    found = step or epoch
    return Content(
        step=step[1] if step else None,
        epoch=epoch[1] if epoch else None,
        where=f"{found[0]} in its __metadata__" if found else "",
    )


def _int_text(metadata: dict[str, object], keys: tuple[str, ...]) -> tuple[str, int] | None:
    for key in keys:
        value = metadata.get(key)
        if isinstance(value, str) and value.strip().isdigit():
            return key, int(value)
    return None


def _safetensors_header(path: Path) -> dict[str, object]:
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            return {}
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > MAX_SAFETENSORS_HEADER_BYTES:
            return {}
        raw = handle.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return {}
    return header if isinstance(header, dict) else {}


def _check_safetensors(path: Path, size: int) -> str:
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            return f"file of {size} bytes is shorter than the 8-byte header length"
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len == 0 or header_len > MAX_SAFETENSORS_HEADER_BYTES:
            return f"header length {header_len} is not sane"
        if 8 + header_len > size:
            return f"header length {header_len} exceeds file size {size}"
        raw = handle.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return "header is not JSON"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    data_size = size - 8 - header_len
    max_end = 0
    for tensor_name, info in header.items():
        if tensor_name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            return f"tensor {tensor_name!r} has invalid data_offsets {offsets!r}"
        if offsets[1] > data_size:
            return (
                f"tensor {tensor_name!r} ends at {offsets[1]} beyond the "
                f"{data_size} data bytes (truncated)"
            )
        max_end = max(max_end, offsets[1])
    if max_end != data_size:
        return f"tensors end at {max_end} but the file holds {data_size} data bytes"
    return ""


#: A zip's end-of-central-directory record: its signature, and its length without a comment.
_END_RECORD = b"PK\x05\x06"
_END_RECORD_SIZE = 22


def _ends_with_its_directory(path: Path, size: int) -> bool:
    """Whether the zip's last end record (and its comment) ends the file, as a whole
    archive's does."""
    with path.open("rb") as handle:
        handle.seek(max(0, size - (_END_RECORD_SIZE + 0xFFFF)))
        tail = handle.read()
    at = tail.rfind(_END_RECORD)
    while at >= 0:
        comment = int.from_bytes(tail[at + 20 : at + 22], "little")
        if at + _END_RECORD_SIZE + comment == len(tail):
            return True
        at = tail.rfind(_END_RECORD, 0, at)
    return False


def _check_torch(path: Path, size: int) -> str:
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic[:2] in _PICKLE_PROTOCOL_PREFIXES:
        return ""  # legacy (pre-1.6) torch.save: a bare pickle stream, no index to verify
    if not magic.startswith(b"PK"):
        return "neither a torch zip archive nor a legacy pickle"
    try:
        # ZipFile reads the end record and the central directory only.
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"zip member {info.filename!r} extends past the end of the file"
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError) as exc:
        return f"torch zip archive unreadable: {exc}"
    if not _ends_with_its_directory(path, size):
        # A zip cut short may still open: a zip stored inside it (SB3 stores torch's
        # ``policy.pth`` zips in its own) has an end record of its own that zipfile finds.
        return "zip archive cut short: its end record is not at its end"
    return ""
