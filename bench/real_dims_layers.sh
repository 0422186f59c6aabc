#!/usr/bin/env bash
# The DeepSeek language backbone at its released dimensions (dim 5120, 64 heads x 512, 384 routed
# experts, top-512 indexer), a layer subset on one GPU. Writes the checkpoint once (synthetic:full
# vision symlinked + the chosen layers' tensors, bf16, ~32 GB for one layer), then per dtype runs
# the oracle (CPU) and the engine (GPU) with --layers on the same aligner rows, compares, and runs
# the engine again with a planted router fault. OUT/<dtype>/real_dims_layers.json holds time, peak
# GPU memory, peak RSS, verdict, per-boundary status and whether the fault was caught.
#
#   bash bench/real_dims_layers.sh OUT [LAYERS]      # LAYERS default 2 (the first KV/index source)
set -u -o pipefail
out="${1:?usage: bench/real_dims_layers.sh OUT [LAYERS]}"
layers="${2:-2}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
work="$(mktemp -d /tmp/real-dims-XXXXXX)"
trap 'rm -rf "$work"' EXIT
run() {  # dtype seconds [-o NAME=VALUE ...]
  local dt="$1" secs="$2"
  shift 2
  mkdir -p "$out/$dt"
  timeout "$secs" "$py" bench/real_dims_layers.py --out "$out/$dt" --config full --layers "$layers" \
    --device cuda --dtype "$dt" --work "$work" "$@" 2>&1 | tee "$out/$dt/log.txt"
  echo "$dt: exit ${PIPESTATUS[0]}" | tee -a "$out/summary.txt"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
run bfloat16 330   # includes writing the checkpoint; the official numerics (bf16 + kernel rounding)
# same checkpoint; the fp32 semantic numerics, with no bf16 / FP8 rounding flips
run float32 140 -o language_numerics=semantic
