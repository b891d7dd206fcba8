"""The built-in line formats by name, in the order auto-detection tries them."""

from __future__ import annotations

from sentinel.parsing import hf_trainer, jsonl, keyvalue, rich_bar, tqdm
from sentinel.parsing.values import ParseFn

#: Built-in parsers by name, in the order auto-detection tries them.
PARSERS: dict[str, ParseFn] = {
    "jsonl": jsonl.parse_jsonl,
    "hf_trainer": hf_trainer.parse_hf_dict,
    "rich_bar": rich_bar.parse_rich_bar,
    "tqdm": tqdm.parse_tqdm,
    "keyvalue": keyvalue.parse_keyvalue,
}
