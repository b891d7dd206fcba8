"""The built-in line formats by name: one line each, in the order they are tried.

Adding a line format is one module in this package (its ``ParseFn``: a line in, samples
out, None for a line in another format) and one line here.
"""

from __future__ import annotations

from sentinel.parsing import (
    composer,
    deepspeed,
    hf_trainer,
    jsonl,
    keyvalue,
    megatron,
    mmengine,
    rich_bar,
    tqdm,
)
from sentinel.parsing.values import ParseFn

#: The format families, in the order auto-detection tries them (``[parsers] enabled``).
PARSERS: dict[str, ParseFn] = {
    "jsonl": jsonl.parse_jsonl,
    "hf_trainer": hf_trainer.parse_hf_dict,
    "rich_bar": rich_bar.parse_rich_bar,
    "tqdm": tqdm.parse_tqdm,
    "keyvalue": keyvalue.parse_keyvalue,
}

#: Training frameworks' own console lines, each read at the step it names: tried in this
#: order on a human-written line before the generic ``keyvalue`` reader (``formats``).
FRAMEWORK_LINES: dict[str, ParseFn] = {
    "megatron": megatron.parse_megatron,
    "mmengine": mmengine.parse_mmengine,
    "deepspeed": deepspeed.parse_deepspeed,
    "composer": composer.parse_composer_metric,
}
