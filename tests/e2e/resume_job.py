"""A job that logs ``step N | loss X`` every 10 steps, saves a checkpoint every 25 and
resumes from it when started again, as a requeued job appending to its log does.

Usage: ``python resume_job.py CHECKPOINT LAST_STEP [HANG_AT [NAN_AT]]``: after logging
step ``HANG_AT`` it hangs until it is killed (resumed from 100, it logs 110 and maybe 120
again); at step ``NAN_AT`` it logs ``nan``. The loss falls from 4 to 2 with a little noise.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path


def main() -> None:
    checkpoint, last = Path(sys.argv[1]), int(sys.argv[2])
    hang_at, nan_at = (int(arg) for arg in [*sys.argv[3:], "0", "0"][:2])
    start = int(checkpoint.read_text()) if checkpoint.exists() else 0
    print(f"starting at step {start}", flush=True)
    for step in range(start + 1, last + 1):
        if step % 10 == 0:
            noise = random.Random(step * 7 + start).uniform(0.97, 1.03)
            loss = "nan" if step == nan_at else f"{(1.0 + 300.0 / (step + 100)) * noise:.4f}"
            print(f"step {step} | loss {loss}", flush=True)
            while step == hang_at:
                time.sleep(1.0)
        if step % 25 == 0:
            checkpoint.write_text(str(step))
    print("done", flush=True)


if __name__ == "__main__":
    main()
