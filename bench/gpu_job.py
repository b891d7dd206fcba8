"""A small real training job for bench/gpu_check.sh: an MLP on random data, on CUDA if any.

    python bench/gpu_job.py nan  --out DIR   # ~10 steps/s; the weights go NaN at --nan-step
    python bench/gpu_job.py idle --out DIR   # trains --steps steps, then holds the GPU idle

Prints ``step N loss X grad_norm G lr L`` once a step. In ``nan`` mode it writes, in DIR,
``nan`` (CLOCK_MONOTONIC just before the NaN line is written) and, on SIGTERM, ``term``
(CLOCK_MONOTONIC in the handler): one clock for every process, so the difference is
sentinel's NaN-to-SIGTERM latency. It then dies of the signal, as a job does.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["nan", "idle"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--nan-step", type=int, default=150)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--idle-s", type=float, default=120.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    def on_term(signum: int, frame: object) -> None:
        (args.out / "term").write_text(repr(time.clock_gettime(time.CLOCK_MONOTONIC)))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    width = 2048 if device == "cuda" else 128
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    ).to(device)
    lr = 1e-3
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    inputs = torch.randn(512, width, device=device)
    targets = torch.randn(512, 1, device=device)
    print(
        f"training on {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'})",
        flush=True,
    )
    for step in range(1, args.steps + 1):
        started = time.monotonic()
        if args.mode == "nan" and step == args.nan_step:
            with torch.no_grad():
                model[0].weight[0, 0] = float("nan")
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        optimizer.step()
        line = f"step {step} loss {loss.item():.5f} grad_norm {grad_norm.item():.4f} lr {lr:g}"
        if args.mode == "nan" and step == args.nan_step:
            (args.out / "nan").write_text(repr(time.clock_gettime(time.CLOCK_MONOTONIC)))
        print(line, flush=True)
        time.sleep(max(args.step_s - (time.monotonic() - started), 0.0))
    if args.mode == "idle":
        print(f"waiting, GPU idle, for {args.idle_s:g} s", flush=True)
        time.sleep(args.idle_s)


if __name__ == "__main__":
    main()
