"""A job that keeps only its newest checkpoint, driven line by line, for the keeper's tests.

    python rotating_job.py

Lines on its stdin, each answered with the same line once done: ``use DIR LAYOUT`` starts
a run saving in DIR, keeping its newest checkpoint only; ``save N`` saves the checkpoint of
step N (a real ``torch.save`` of a tiny model's state and its ``step``), then deletes the
one it saved before, as Lightning's ``save_top_k=1`` and HF's ``save_total_limit=1`` do;
``keep K`` makes it keep its newest K from then on (0: all). One process serves many runs,
so torch is imported once. LAYOUT is how it names them:

- ``files``: ``model_step<N>.pt``
- ``folders``: ``checkpoint-<N>/`` holding ``model.pt`` and ``optimizer.pt`` (HF-like names)
- ``lightning``: ``epoch=0-step=<N>.ckpt`` (Lightning's keys), and ``last.ckpt``, a copy of it
- ``lightning-link``: the same, ``last.ckpt`` a symbolic link to it (``save_last="link"``)
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import torch


def checkpoint_path(layout: str, directory: Path, step: int) -> Path:
    """Where the job saves the checkpoint of ``step``."""
    if layout == "files":
        return directory / f"model_step{step}.pt"
    if layout == "folders":
        return directory / f"checkpoint-{step}"
    return directory / f"epoch=0-step={step}.ckpt"


def save(layout: str, directory: Path, step: int) -> Path:
    torch.manual_seed(step)
    model = torch.nn.Linear(4, 1)
    path = checkpoint_path(layout, directory, step)
    if layout == "files":
        torch.save({"model": model.state_dict(), "step": step}, path)
    elif layout == "folders":
        path.mkdir()
        torch.save({"model": model.state_dict(), "step": step}, path / "model.pt")
        torch.save({"lr": 0.01, "step": step}, path / "optimizer.pt")
    else:
        state = {
            "pytorch-lightning_version": "2.4.0",
            "state_dict": model.state_dict(),
            "global_step": step,
            "epoch": 0,
        }
        torch.save(state, path)
        last = directory / "last.ckpt"
        if layout == "lightning-link":
            temp = directory / ".last.ckpt.link"
            os.symlink(path.name, temp)
            os.replace(temp, last)
        else:
            torch.save(state, last)
    return path


def delete(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def main() -> None:
    directory, layout, keep = Path(), "", 1
    saved: list[Path] = []
    for line in sys.stdin:
        command, *values = line.split()
        if command == "use":
            directory, layout, keep, saved = Path(values[0]), values[1], 1, []
        elif command == "keep":
            keep = int(values[0])
        else:
            saved.append(save(layout, directory, int(values[0])))
            while keep and len(saved) > keep:
                delete(saved.pop(0))
        print(line.strip(), flush=True)


if __name__ == "__main__":
    main()
