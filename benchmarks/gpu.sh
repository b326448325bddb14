#!/usr/bin/env bash
# The GPU figures of padless in one short run (under 10 minutes on one H100/H200-class GPU):
#   1. `padless verify` of the pretrained SmolLM2-135M in bf16 on CUDA (packed == alone, grads == padded),
#   2. `padless bench --preset gpt2`   (124M GPT-2 architecture, 32 x 1024 tokens per step),
#   3. `padless bench --preset smollm2` (pretrained SmolLM2-135M, 32 x 2048 tokens per step),
# each strategy in its own process, fp32 master weights under bf16 autocast, MFU against a timed GEMM
# of the model's shapes on the same GPU. Steps are cut from the presets' 200 to fit the time.
# Usage: bash benchmarks/gpu.sh [OUT_DIR]   (default runs/gpu; PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-runs/gpu}
mkdir -p "$OUT"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
"$PY" -m padless verify --model smollm2-135m --dtype bfloat16 --device cuda | tee "$OUT/verify.txt"
"$PY" -m padless bench --preset gpt2 --steps 60 --no-progress --out "$OUT/gpt2"
"$PY" -m padless bench --preset smollm2 --steps 40 --no-progress --out "$OUT/smollm2"
echo "reports: $OUT/gpt2/report.html $OUT/smollm2/report.html"
