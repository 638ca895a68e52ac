#!/usr/bin/env bash
# Issue 6 on an NVIDIA GPU in bf16: profile the engine, trace one controller, then the whole
# `dspark validate` loop (calibrate, predict, measure, error table) — one run, < 8 minutes.
# Results go under $OUT (default runs/gpu_validate). NOT part of CI (needs a CUDA device and the
# shipped checkpoints in real/checkpoints).
#
#   OUT=/tmp/gpu benchmarks/gpu_validate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu_validate}"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="${PYTHON:-python3}"; fi
mkdir -p "$OUT"
start=$(date +%s)

"$PY" - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_validate: no CUDA device visible to torch")
print(f"gpu_validate: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
PY
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.sm \
  --format=csv > "$OUT/nvidia-smi.csv" || true

# 1. latency table of the engine in bf16 on the GPU (same grid as the validate config)
"$PY" -m dspark real profile --config configs/validate_gpu.toml --threads 1 \
  --device cuda --target-dtype bfloat16 --out "$OUT/profile" 2>&1 | tee "$OUT/profile.log"

# 2. one round + position trace (dspark controller, code test prompts)
"$PY" -m dspark real trace --config configs/validate_gpu.toml --threads 1 --device cuda \
  --target-dtype bfloat16 --controller dspark --workload code --split test --n-prompts 8 \
  --max-new-tokens 128 --out "$OUT/trace" 2>&1 | tee "$OUT/trace.log"

# 3. the validation loop (its own profile and traces, so the run folder is self-contained)
"$PY" -m dspark validate configs/validate_gpu.toml --out "$OUT/validate" 2>&1 \
  | tee "$OUT/validate.log"

echo "gpu_validate: $(( $(date +%s) - start )) s in all; results under $OUT"
tail -n 1 "$OUT/validate.log"
