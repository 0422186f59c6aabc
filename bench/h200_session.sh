#!/usr/bin/env bash
# One batched GPU session for the model-level figures: the DeepSeek vision benchmark
# (synthetic:full, bf16, 90x99 grid), the gate's wall-time breakdown on synthetic:full weights,
# and the Qwen3-VL path on CUDA with both image processors. Logs and JSON go to OUTDIR.
#
#   bench/h200_session.sh OUTDIR
set -u -o pipefail
out="${1:?usage: bench/h200_session.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
log="$out/session.log"
stage() { echo "=== $1 ($(date +%T))" | tee -a "$log"; }

stage "install"
"$py" -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2 | tee -a "$log"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee -a "$log"

stage "deepseek vision bench"
timeout 300 "$py" bench/deepseek_vision.py "$out/deepseek-vision.json" --backend "${BACKEND:-auto}" 2>&1 | tee -a "$log" | tail -30

stage "gate on synthetic:full (bf16 engine, fp32 oracle)"
timeout 200 tensordiff gate gates/deepseek-v4.1-flash.toml --device cuda --weights synthetic:full \
  --dtype bfloat16 --oracle-dtype float32 --json "$out/gate-full.json" 2>&1 | tee -a "$log" | tail -25
timeout 120 tensordiff gate gates/deepseek-v4.1-flash.toml --device cuda --weights synthetic:full \
  --dtype bfloat16 --oracle-dtype float32 --no-local-error --json "$out/gate-full-nolocal.json" 2>&1 | tee -a "$log" | tail -12

stage "qwen3-vl on cuda"
for p in pil torchvision; do
  timeout 120 tensordiff check qwen3-vl --device cuda --processor "$p" --json "$out/qwen-$p.json" 2>&1 | tee -a "$log" | head -3
  echo "qwen3-vl cuda processor=$p: exit ${PIPESTATUS[0]}" | tee -a "$log"
done
timeout 150 "$py" -m pytest -q -rs tests/engine/qwen3_vl tests/oracle/qwen3_vl tests/models/test_qwen3vl_differential.py \
  -k "torchvision or fast" 2>&1 | tee -a "$log" | tail -8
stage "done"
