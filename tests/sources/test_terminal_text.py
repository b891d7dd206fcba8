"""A terminal's lines as text to parse: escapes out, a redraw that says nothing new once."""

from __future__ import annotations

import pytest

from sentinel.follow.terminal_text import TerminalLines, strip_escapes


@pytest.mark.parametrize(
    ("written", "text"),
    [
        pytest.param("\x1b[31mloss: nan\x1b[0m", "loss: nan", id="colour"),
        pytest.param("\x1b[2K\x1b[1A\x1b[2Kstep 5 loss 2.1", "step 5 loss 2.1", id="erase-and-up"),
        pytest.param("\x1b]0;training\x07epoch 1", "epoch 1", id="osc-title-bel"),
        pytest.param(
            "\x1b]8;;https://x.io\x1b\\link\x1b]8;;\x1b\\ loss 1", "link loss 1", id="osc-link-st"
        ),
        pytest.param("\x1b[?25lEpoch 0:  40%\x1b[?25h", "Epoch 0:  40%", id="cursor-hide"),
        pytest.param("\x1b(Bplain", "plain", id="charset"),
        pytest.param("\x9b1mbold", "bold", id="8-bit-csi"),
        pytest.param("no escapes [rank0] 1", "no escapes [rank0] 1", id="untouched"),
    ],
)
def test_escapes_are_stripped(written: str, text: str) -> None:
    assert strip_escapes(written) == text
    assert TerminalLines().clean([written]) == [text]


def test_a_redraw_with_nothing_new_is_one_line() -> None:
    """rich refreshes ten times a second: the same bar drawn again is not a new line."""
    cleaner = TerminalLines()
    bar = "\x1b[2KEpoch 0/9 ━━━━ 12/250 0:00:03 train_loss: 2.31"
    assert cleaner.clean([bar, bar, "\x1b[2K", bar]) == [bar.removeprefix("\x1b[2K")]
    # ... also across batches; a changed bar is new, and so is the old one after it.
    assert cleaner.clean([bar]) == []
    moved = bar.replace("12/250", "13/250").removeprefix("\x1b[2K")
    assert cleaner.clean([moved, bar]) == [moved, bar.removeprefix("\x1b[2K")]


def test_streams_are_cleaned_apart() -> None:
    stdout, stderr = TerminalLines(), TerminalLines()
    assert stdout.clean(["loss 1"]) == ["loss 1"]
    assert stderr.clean(["loss 1"]) == ["loss 1"]
