"""A log written in whole blocks: the job's output is block-buffered, and says so once.

``python train.py > train.log`` (no ``-u``), a job under ``watch``, Slurm or systemd writing to
a file: its output is buffered in blocks, not lines, so a NaN printed now reaches the file
(and sentinel) only when the block fills, thousands of lines later or at the job's end. The
file then grows by whole blocks:

- C stdio (and Perl, awk...): exactly 4 or 8 KiB at a time (a multiple of 4096 bytes),
  ending mid-line;
- Python's text layer: its 8 KiB chunk less what the next line would not fit (8170 to 8192
  bytes for lines of 20-40), ending at a line's end.

``BLOCKS_IN_A_ROW`` such growths one after another (the first look at a file, its backlog,
does not count) make one warning that names the fix. A line-buffered job that writes fast
grows by sizes that vary, and any other growth starts the count again.
"""

from __future__ import annotations

#: Growths in whole blocks, one after another, that make the warning.
BLOCKS_IN_A_ROW = 3
_PAGE = 4096
_PYTHON_CHUNK = 8192
#: A Python chunk holds up to 8192 bytes, short of it by less than the next line.
_LINE_SLACK = 2048


class BlockWrites:
    """Watches one file's growth for block-buffered writes (see the module's docstring)."""

    def __init__(self) -> None:
        self._looks = 0
        self._in_a_row = 0
        self._said = False

    def grew(self, size: int, *, mid_line: bool) -> str:
        """The file grew by ``size`` bytes since the last look, its last line complete or
        not; the warning's text once the growths show block buffering, else ""."""
        self._looks += 1
        if self._said or self._looks == 1:
            return ""
        stdio = mid_line and size % _PAGE == 0
        python = not mid_line and _PYTHON_CHUNK - _LINE_SLACK < size <= _PYTHON_CHUNK
        self._in_a_row = self._in_a_row + 1 if stdio or python else 0
        if self._in_a_row < BLOCKS_IN_A_ROW:
            return ""
        self._said = True
        block = f"{size} bytes" if stdio else "8 KiB"
        return (
            f"grows in whole blocks of {block} at a time: the job's output is block-buffered,"
            " so sentinel reads a NaN only once the next block is written (thousands of lines"
            " later, or at the job's end). Unbuffer the job: python -u, PYTHONUNBUFFERED=1, or"
            " stdbuf -oL for other programs"
        )
