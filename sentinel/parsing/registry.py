"""The built-in formats by name: one line each, in the order they are tried.

Adding a line format is one module in this package (its ``ParseFn``: a line in, samples
out, None for a line in another format; or, for a format that needs an earlier line, its
``LineFormat``) and one line here. Adding a format read as a whole file is one module
with its ``FileFormat`` and one line in ``FILE_FORMATS``.
"""

from __future__ import annotations

from sentinel.parsing import (
    boosting,
    composer,
    coqui,
    deepspeed,
    detectron2,
    dreamer,
    epoch_batch,
    espnet,
    header_csv,
    hf_trainer,
    jsonl,
    keras,
    keyvalue,
    lightning_csv,
    llmc,
    marian,
    megatron,
    mlflow,
    mmengine,
    rich_bar,
    rsl_rl,
    sb3,
    tensorboard,
    tfod,
    tqdm,
    ultralytics,
    verl,
    wenet,
    yolact,
    yolo_results,
)
from sentinel.parsing.file_format import FileFormat
from sentinel.parsing.values import LineFormat, ParseFn

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
    "verl": verl.parse_verl,
    "marian": marian.parse_marian,
    "coqui": coqui.parse_coqui,
    "tfod": tfod.parse_tfod,
    "detectron2": detectron2.parse_detectron2,
    "yolo_results": yolo_results.parse_yolo_results,
    "yolact": yolact.parse_yolact,
    "boosting": boosting.parse_boosting,
    "dreamer": dreamer.parse_dreamer,
    "llmc": llmc.parse_llmc,
}

#: Formats whose step or names an earlier line gave (a header, an epoch line): each a
#: ``LineFormat`` class, one instance per parser, tried in this order after
#: ``FRAMEWORK_LINES``.
LINE_FORMATS: dict[str, type[LineFormat]] = {
    "ultralytics": ultralytics.UltralyticsConsole,
    "header_csv": header_csv.HeaderCsv,
    "keras": keras.KerasProgress,
    "composer": composer.ComposerConsole,
    "sb3": sb3.Sb3Table,
    "rsl_rl": rsl_rl.RslRlBlock,
    "espnet": espnet.EspnetLog,
    "epoch_batch": epoch_batch.EpochBatch,
    "wenet": wenet.WenetLog,
}

#: Metrics formats read as a whole file, by name, in the order a path is tried against
#: them (``files.classify``); a path none of them matches is a plain log.
FILE_FORMATS: dict[str, FileFormat] = {
    "mlflow": mlflow.FORMAT,
    "tensorboard": tensorboard.FORMAT,
    "lightning_csv": lightning_csv.FORMAT,
}
