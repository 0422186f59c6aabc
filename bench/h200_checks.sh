#!/usr/bin/env bash
# Correctness on a GPU, in one go: both models' clean checks and faults on CUDA (torch and hip
# backends), the whole DeepSeek model with a prompt, the gate on synthetic:full in bf16, and a
# calibration of the bf16 noise floor on the GPU. Logs and JSON go to OUTDIR.
#
#   bench/h200_checks.sh OUTDIR
set -u -o pipefail
out="${1:?usage: bench/h200_checks.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
log="$out/checks.log"
stage() { echo "=== $1 ($(date +%T))" | tee -a "$log"; }
td() { local name="$1"; shift; timeout 240 tensordiff "$@" --json "$out/$name.json" >"$out/$name.txt" 2>&1
       local rc=$?; echo "$name: exit $rc $(head -1 "$out/$name.txt")" | tee -a "$log"; }

stage "install"
"$py" -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2 | tee -a "$log"

stage "qwen3-vl on cuda"
td qwen-pil check qwen3-vl --device cuda --processor pil
td qwen-tv check qwen3-vl --device cuda --processor torchvision
td qwen-tv-bf16 check qwen3-vl --device cuda --processor torchvision --dtype bfloat16
td qwen-fault check qwen3-vl --device cuda --fault deepstack-drop
timeout 150 "$py" -m pytest -q -rs tests/engine/qwen3_vl tests/oracle/qwen3_vl tests/models/test_qwen3vl_differential.py \
  -k "torchvision or fast" 2>&1 | tail -4 | tee -a "$log"

stage "deepseek whole model on cuda"
P="Describe <image> in one line."
td ds-whole check deepseek-v4.1-flash --device cuda --prompt "$P" --chunk 64 --decode 3 -o language_numerics=semantic
td ds-whole-hip check deepseek-v4.1-flash --device cuda --backend hip --prompt "$P" --chunk 64 --decode 3 -o language_numerics=semantic
td ds-whole-fault check deepseek-v4.1-flash --device cuda --backend hip --prompt "$P" --chunk 64 --fault router-text-bias-for-images
td ds-bf16-hip check deepseek-v4.1-flash --device cuda --backend hip --dtype bfloat16 --prompt "$P" --chunk 64

stage "gate on synthetic:full, bf16 engine vs fp32 oracle"
td gate-full gate gates/deepseek-v4.1-flash.toml --device cuda --weights synthetic:full --dtype bfloat16 --oracle-dtype float32
td gate-full-fault gate gates/deepseek-v4.1-flash.toml --device cuda --weights synthetic:full --dtype bfloat16 --oracle-dtype float32 --fault rope-interleaved --no-local-error

stage "calibrate on the GPU (fp32 vs bf16 oracle, synthetic:full)"
timeout 200 tensordiff calibrate gates/deepseek-v4.1-flash.toml --device cuda --out "$out/calibration.toml" 2>&1 | tail -15 | tee -a "$log"
stage "done"
