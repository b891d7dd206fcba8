#!/bin/bash
# cold_nan.sh WAIT_S: watch a job for WAIT_S s at 100 lines/s, then a NaN: latency and sentinel's major faults
W=/tmp/cold-$1-$$; rm -rf $W; mkdir -p $W
python3 "$(dirname "$0")"/cold_nan_job.py $W/train.log $1 $W/times.txt & JP=$!
python -m sentinel watch --state-dir $W/state --pid $JP --log $W/train.log > $W/out.txt 2>&1 & SP=$!
while ! grep -q nan_soon $W/times.txt 2>/dev/null; do sleep 0.1; done
before=$(awk '{print $12}' /proc/$SP/stat)
while ! grep -q term $W/times.txt 2>/dev/null; do sleep 0.05; done
after=$(awk '{print $12}' /proc/$SP/stat)
python3 -c "
d={l.split()[0]:float(l.split()[1]) for l in open('$W/times.txt') if len(l.split())==2}
print(f'wait $1 s: latency {1e3*(d[\"term\"]-d[\"nan\"]):.1f} ms, sentinel major faults during the NaN: $((after-before))')"
sleep 2; kill $SP 2>/dev/null; wait $SP 2>/dev/null; rm -rf $W
