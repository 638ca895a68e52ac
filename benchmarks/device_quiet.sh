#!/usr/bin/env bash
# Timing benchmarks on a quiet machine (the lent GPU machine's 16-core CPU, nothing else
# running): the development machine has 2 cores shared by several jobs. Not part of CI.
# Run from the repository root with the simpy wheel carried in .whl/ (the image lacks it):
#   OUT=/some/folder [SKIP_SIM=1] bash benchmarks/device_quiet.sh
# Writes its results under $OUT.
set -uo pipefail
python3 -m pip install -q --no-deps .whl/simpy-*.whl 2>&1 | tail -1
{ nproc; uptime; python3 -c "import torch; print('torch', torch.__version__)"; } > "$OUT/machine.txt"
# 1. simulator speed, 1 M-token standard run: fixed k (the engine) and the goodput dspark
if [ "${SKIP_SIM:-0}" != 1 ]; then
  for c in fixed dspark; do
    python3 benchmarks/sim_speed.py --sizes 1 --controller "$c" > "$OUT/sim_speed_$c.txt" 2>&1
  done
fi
# 2. real engine at batch 1 on a mix of code and prose prompts, conv drafter, 1 thread
python3 -m dspark real bench --workload mixed --prompts 8 --new-tokens 128 --repeats 2 --no-hf \
  --drafter conv --threads 1 --out /tmp/rb_mixed > "$OUT/real_bench_mixed.txt" 2>&1
cp /tmp/rb_mixed/results.csv "$OUT/real_bench_mixed_results.csv" 2>/dev/null
# 3. batched real engine: plain vs speculative at batch 1..16, 2 threads
python3 benchmarks/real_batch.py --repeats 2 --new-tokens 64 --threads 2 > "$OUT/real_batch.txt" 2>&1
uptime >> "$OUT/machine.txt"
