"""The stand-in training script the deploy tests run where the real trainer would be.

Resumes from the newest ``step_<N>`` under ``--output-dir``, saves one every 10 steps (and
``step_25`` right before its NaN), goes NaN at step 25 on its first attempt only and hangs
there, as a real job would go on; each attempt notes its pid and start step in the working
directory (``attempt-<n>``). It prints JSON metric lines.
"""

from __future__ import annotations

import textwrap

TRAIN_PY = textwrap.dedent(
    """
    import argparse, json, os, time
    from pathlib import Path
    parser = argparse.ArgumentParser(); parser.add_argument("--output-dir", required=True)
    ckpt = Path(parser.parse_args().output_dir); ckpt.mkdir(parents=True, exist_ok=True)
    saved = sorted(int(p.name[5:]) for p in ckpt.glob("step_*"))
    start = saved[-1] if saved else 0
    attempt = len(list(Path.cwd().glob("attempt-*"))) + 1
    Path(f"attempt-{attempt}").write_text(json.dumps({"pid": os.getpid(), "start": start}))
    for step in range(start + 1, 41):
        if step % 10 == 0 or step == 25:
            (ckpt / f"step_{step}").mkdir(exist_ok=True)
            (ckpt / f"step_{step}" / "state.json").write_text(json.dumps({"step": step}))
        bad = step == 25 and attempt == 1
        print(json.dumps({"step": step, "loss": float("nan") if bad else 2.0 - step / 100}),
              flush=True)
        time.sleep(60 if bad else 0.05)
    """
)
