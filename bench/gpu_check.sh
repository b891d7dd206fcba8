#!/usr/bin/env bash
# The checks of issue 23 section 3 on a machine with a real NVIDIA GPU, in one go (< 6 min).
#
#   OUT=/tmp/out bash bench/gpu_check.sh      # from the repo root; everything lands in $OUT
#
# sentinel's dependencies must be importable (PYTHONPATH or an installed venv); torch with
# CUDA is the job's. Writes at most 8 flat files in $OUT:
#   smi.txt      nvidia-smi -q (header, driver, GPU) and nvidia-smi's one-line view
#   probe.json   bench/gpu_probe.py: every NVML call on the real library beside FakeNvml,
#                and GpuMonitor's readings through sentinel's own code
#   pytest.txt   the tests marked gpu
#   nan.txt      a real CUDA job under `sentinel run`, NaN at step 150: NaN -> SIGTERM, exit code
#   idle.txt     a CUDA job that goes idle holding the GPU: gpu_idle and stall on real readings
#   overhead.txt bench/overhead.py --real-nvml (and the fake GPUs beside it), then a short
#                bench/latency.py
#   runs.tar.gz  the two runs' state dirs: alerts.jsonl, reports (+ charts), job logs
#   check.log    this script's own trace
set -u
OUT=${OUT:?set OUT to an empty folder}
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
exec > >(tee -a "$OUT/check.log") 2>&1
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

stamp "1. nvidia-smi"
{ nvidia-smi; nvidia-smi -q | head -80; nvidia-smi -q -d ECC,PERFORMANCE,POWER | head -120; uname -a; } \
  > "$OUT/smi.txt" 2>&1
head -30 "$OUT/smi.txt" | grep -E "Driver|CUDA|Product Name|NVIDIA" | head -5

stamp "2. NVML probe (real vs FakeNvml, and GpuMonitor)"
timeout 120 "$PY" bench/gpu_probe.py "$OUT/probe.json"; echo "probe rc=$?"

stamp "3. pytest -m gpu"
mapfile -t files < <(grep -rl "mark.gpu" tests --include='*.py')
timeout 120 "$PY" -m pytest -p no:cacheprovider -m gpu -q -rA "${files[@]}" > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?"; tail -5 "$OUT/pytest.txt"

run_job() {  # name, config text, job args...
  local name=$1 config=$2; shift 2
  local dir=$WORK/$name
  mkdir -p "$dir"
  printf '%s\n' "$config" > "$dir/sentinel.toml"
  local t0 rc
  t0=$(date +%s.%N)
  (cd "$dir" && timeout 150 "$PY" -m sentinel run --config sentinel.toml --state-dir state \
     -- "$PY" "$OLDPWD/bench/gpu_job.py" "$@" --out "$dir/marks" > stdout.txt 2> stderr.txt)
  rc=$?
  {
    echo "sentinel run exit code: $rc; wall $("$PY" -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$t0") s"
    if [ -f "$dir/marks/nan" ] && [ -f "$dir/marks/term" ]; then
      "$PY" -c "import sys; n, t = (float(open(p).read()) for p in sys.argv[1:]); print(f'NaN line -> SIGTERM: {(t - n) * 1000:.1f} ms')" "$dir/marks/nan" "$dir/marks/term"
    fi
    echo "--- sentinel's log"; cat "$dir/stderr.txt"
    echo "--- job output (last 8 lines)"; tail -8 "$dir/stdout.txt"
    echo "--- alerts.jsonl"; cat "$dir/state/alerts.jsonl" 2>/dev/null
    echo "--- verdict.json"; cat "$dir/state/verdict.json" 2>/dev/null
    echo "--- report"; cat "$dir"/state/reports/*.md 2>/dev/null | head -150
    echo "--- evidence"; cat "$dir"/state/reports/*/evidence.txt 2>/dev/null | head -120
  } > "$OUT/$name.txt"
  head -3 "$OUT/$name.txt"
}

stamp "4a. NaN job under sentinel run"
run_job nan '[gpu]
interval_s = 1.0' nan --nan-step 150 --steps 400

stamp "4b. idle job under sentinel run"
run_job idle '[gpu]
interval_s = 1.0
[process]
interval_s = 1.0
[rules.gpu_idle]
sustain_s = 8.0
[rules.stall]
adaptive = false
soft_timeout_s = 12.0
hard_timeout_s = 25.0
min_timeout_s = 5.0
evidence_max_age_s = 5.0' idle --steps 50 --idle-s 60

(cd "$WORK" && tar czf "$OUT/runs.tar.gz" --exclude='*.db' --exclude=lock nan idle)

stamp "5. overhead, real GPU then fake GPUs"
{
  timeout 100 "$PY" bench/overhead.py --real-nvml --seconds 20
  timeout 100 "$PY" bench/overhead.py --seconds 20
} > "$OUT/overhead.txt" 2>&1
echo "overhead rc=$?"; grep -iE "sentinel|cpu" "$OUT/overhead.txt" | head -12

stamp "6. NaN -> SIGTERM latency on a quiet machine (bench/latency.py, short)"
timeout 200 "$PY" bench/latency.py --trials 4 --rates 100,1000 --overhead-s 10 >> "$OUT/overhead.txt" 2>&1
echo "latency rc=$?"; tail -8 "$OUT/overhead.txt"
stamp "done"
