"""Make a real, healthy Hugging Face Trainer run that logs the loss at every step.

The output (``<out>/trainer_state.json`` plus ``<out>/SOURCE.md``) is a benchmark
input for the training-log watchdog: a long run with no fault in it, whose batch
loss wobbles the way a real fine-tune's does.  Nothing is faked or post-processed:
``trainer_state.json`` is written by ``trainer.state.save_to_json``.

Model: a tiny GPT-2 built from a config (random init, ``transformers.set_seed``).
Data: synthetic token sequences from a seeded sparse Markov chain (each token has a
few likely successors), with a per-example share of uniformly random tokens and a
minority of fully random sequences, so batches differ in difficulty.

    python bench/runs/make_every_step_run.py                    # 10,000 steps
    python bench/runs/make_every_step_run.py --steps 200 --out /tmp/es-try
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "hf-every-step"

# Data / model / optimiser settings (recorded in SOURCE.md).
CFG = dict(
    vocab_size=256,
    seq_len=64,
    n_layer=2,
    n_head=2,
    n_embd=64,
    successors=4,  # non-zero entries per row of the Markov transition matrix
    dirichlet_alpha=0.5,  # concentration of those successors' probabilities
    p_fully_random=0.05,  # share of examples that are uniform random tokens
    noise_beta=(0.4, 6.0),  # Beta(a, b): per-example share of random tokens otherwise
    batch_size=8,
    lr=5e-4,
    schedule="cosine",
    warmup_steps=100,
    weight_decay=0.01,
    max_grad_norm=1.0,
    eval_steps=500,
    eval_examples=256,
    eval_batch_size=64,
    data_seed=1234,
    model_seed=0,
)


def make_sequences(n: int, rng: np.random.Generator, trans: np.ndarray) -> np.ndarray:
    """``n`` sequences of ``seq_len`` tokens: Markov chain + per-example noise."""
    v, t = CFG["vocab_size"], CFG["seq_len"]
    cum = np.cumsum(trans, axis=1)
    cum[:, -1] = 1.0
    out = np.empty((n, t), dtype=np.int64)
    out[:, 0] = rng.integers(0, v, size=n)
    a, b = CFG["noise_beta"]
    p_noise = rng.beta(a, b, size=n)
    p_noise[rng.random(n) < CFG["p_fully_random"]] = 1.0
    for i in range(1, t):
        prev = out[:, i - 1]
        u = rng.random(n)
        nxt = (cum[prev] < u[:, None]).sum(axis=1)
        noisy = rng.random(n) < p_noise
        nxt[noisy] = rng.integers(0, v, size=int(noisy.sum()))
        out[:, i] = np.minimum(nxt, v - 1)
    return out


class Seqs(torch.utils.data.Dataset):
    def __init__(self, arr: np.ndarray):
        self.x = torch.from_numpy(arr)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        ids = self.x[i]
        return {"input_ids": ids, "labels": ids.clone()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10_000, help="optimizer steps (default 10000)")
    ap.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    t_start = time.time()

    # --- data -------------------------------------------------------------
    rng = np.random.default_rng(CFG["data_seed"])
    v, k = CFG["vocab_size"], CFG["successors"]
    trans = np.zeros((v, v))
    for r in range(v):
        cols = rng.choice(v, size=k, replace=False)
        trans[r, cols] = rng.dirichlet([CFG["dirichlet_alpha"]] * k)
    n_train = args.steps * CFG["batch_size"]  # one pass: no example seen twice
    train = make_sequences(n_train, rng, trans)
    evals = make_sequences(CFG["eval_examples"], rng, trans)
    # Entropy rate of the clean chain: the floor for the clean examples' loss.
    ent = -np.sum(
        np.where(trans > 0, trans * np.log(np.where(trans > 0, trans, 1)), 0), axis=1
    ).mean()

    # --- model ------------------------------------------------------------
    transformers.set_seed(CFG["model_seed"])
    mcfg = GPT2Config(
        n_layer=CFG["n_layer"],
        n_head=CFG["n_head"],
        n_embd=CFG["n_embd"],
        vocab_size=v,
        n_positions=CFG["seq_len"],
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(mcfg)
    n_params = sum(p.numel() for p in model.parameters())

    tmp = tempfile.mkdtemp(prefix="es-trainer-")
    targs = TrainingArguments(
        output_dir=tmp,
        max_steps=args.steps,
        per_device_train_batch_size=CFG["batch_size"],
        per_device_eval_batch_size=CFG["eval_batch_size"],
        learning_rate=CFG["lr"],
        lr_scheduler_type=CFG["schedule"],
        warmup_steps=CFG["warmup_steps"],
        weight_decay=CFG["weight_decay"],
        max_grad_norm=CFG["max_grad_norm"],
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=CFG["eval_steps"],
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=CFG["model_seed"],
        data_seed=CFG["data_seed"],
    )
    trainer = Trainer(model=model, args=targs, train_dataset=Seqs(train), eval_dataset=Seqs(evals))
    t_train = time.time()
    trainer.train()
    train_s = time.time() - t_train

    # --- output -----------------------------------------------------------
    args.out.mkdir(parents=True, exist_ok=True)
    state_path = args.out / "trainer_state.json"
    trainer.state.save_to_json(str(state_path))
    shutil.rmtree(tmp, ignore_errors=True)
    total_s = time.time() - t_start

    hist = json.loads(state_path.read_text())["log_history"]
    losses = [h["loss"] for h in hist if "loss" in h]
    evl = [(h["step"], h["eval_loss"]) for h in hist if "eval_loss" in h]
    cmd = "python " + " ".join([_rel(sys.argv[0]), *sys.argv[1:]])
    a, b = CFG["noise_beta"]
    src = f"""# hf-every-step: a real, healthy HF Trainer run, loss logged at every step

Generated by `bench/runs/make_every_step_run.py`:

    {cmd}

(run from the repository root, `torch.set_num_threads({args.threads})`, CPU only).

- Date (UTC): {time.strftime("%Y-%m-%d %H:%M", time.gmtime(t_start))}
- Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, {platform.machine()} Linux
- Wall time: {total_s:.0f} s in all ({train_s:.0f} s in `trainer.train()`, {train_s / args.steps * 1000:.1f} ms/step)

## Model

`GPT2LMHeadModel(GPT2Config(n_layer={CFG["n_layer"]}, n_head={CFG["n_head"]}, n_embd={CFG["n_embd"]}, vocab_size={v}, n_positions={CFG["seq_len"]}))`,
random init after `transformers.set_seed({CFG["model_seed"]})`; {n_params:,} parameters.

## Data (synthetic, made in the script; numpy seed {CFG["data_seed"]})

- {n_train:,} training sequences (exactly one pass, no repeats) and {CFG["eval_examples"]} eval sequences, {CFG["seq_len"]} tokens each, vocab {v}.
- A sparse Markov chain: each token has {k} successors with Dirichlet({CFG["dirichlet_alpha"]}) probabilities (mean entropy rate {ent:.3f} nats/token).
- Per example, each next token is replaced by a uniform random one with probability p ~ Beta({a}, {b});
  {CFG["p_fully_random"]:.0%} of examples are fully random (p = 1, loss floor ln {v} = {math.log(v):.3f}).
  So batches differ in difficulty and the batch loss wobbles; a batch with several random sequences
  is 2-3x the median.
- Labels = input ids (the model shifts them); no padding.

## Training arguments

`max_steps={args.steps}`, `per_device_train_batch_size={CFG["batch_size"]}`, `learning_rate={CFG["lr"]}`,
`lr_scheduler_type="{CFG["schedule"]}"`, `warmup_steps={CFG["warmup_steps"]}`, `weight_decay={CFG["weight_decay"]}`,
`max_grad_norm={CFG["max_grad_norm"]}`, AdamW (Trainer default), fp32, `logging_steps=1`,
`eval_strategy="steps"`, `eval_steps={CFG["eval_steps"]}` (batch {CFG["eval_batch_size"]}), `save_strategy="no"`,
`report_to=[]`, `use_cpu=True`, `disable_tqdm=True`, `dataloader_num_workers=0`, `seed={CFG["model_seed"]}`.

## What is in `trainer_state.json`

Written by `trainer.state.save_to_json` at the end of training and not edited: the numbers are
exactly as the Trainer logged them. `log_history` holds {len(losses):,} training entries
(`loss`, `grad_norm`, `learning_rate`, `epoch`, `step`), {len(evl)} eval entries (`eval_loss`, ...)
and the final summary (`train_runtime`, `train_loss`, ...).

- First logged loss {losses[0]:.3f}, median of the last 1,000 {float(np.median(losses[-1000:])):.3f}.
- eval_loss: {", ".join(f"{s}: {e:.3f}" for s, e in evl)}.
"""
    (args.out / "SOURCE.md").write_text(src)
    print(
        f"wrote {state_path} and {args.out / 'SOURCE.md'}: {len(losses)} losses, "
        f"{train_s:.0f} s training ({train_s / args.steps * 1000:.1f} ms/step), {total_s:.0f} s in all"
    )
    return 0


def _rel(p: str) -> str:
    try:
        return str(Path(p).resolve().relative_to(HERE.parent.parent))
    except ValueError:
        return p


if __name__ == "__main__":
    sys.exit(main())
