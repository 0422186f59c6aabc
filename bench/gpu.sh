#!/usr/bin/env bash
# The GPU benchmarks and checks, one entry point, named stages.
#
#   bash bench/gpu.sh OUTDIR [STAGE ...]    # default stages: hip kernels engines checks
#   bash bench/gpu.sh --list                # the stages, one line each
#
# Each stage writes under OUTDIR/<stage>/ and logs to OUTDIR/gpu.log; a stage that fails is logged
# and the next one still runs. Exit status: 0 every stage ran clean, 1 a stage failed, 2 usage.
# Needs one CUDA GPU, a CUDA torch, nvcc (the hip backend), Triton (compiled blocks, the attention
# sweep); `sharded` uses every GPU it sees (NPROC ranks, default 2). The repository is put on
# PYTHONPATH; the `tensordiff` command is installed (editable, no dependencies) when missing.
# Environment: PYTHON (default python3), TENSORDIFF_CACHE (default /tmp/tensordiff-cache),
# NPROC and LAYERS (sharded, real-dims, release), RELEASE_WEIGHTS (release: a downloaded checkpoint).
set -u -o pipefail

STAGES="hip kernels attention engines vision checks calibrated faults diagnosis language default-route quant release sharded taps real-dims"
DEFAULT="hip kernels engines checks"
describe() {
  case "$1" in
    hip)        echo "build the HIP kernels, tests/hip on the GPU, check --backend hip (clean, and patch-pad-nonzero at block0)" ;;
    kernels)    echo "bench/kernels.py: each kernel against torch and the copy roofline, then the router's row sweep" ;;
    attention)  echo "bench/attention_sweep.py: Triton configs beside cuDNN / flash / efficient at both towers' shapes" ;;
    engines)    echo "bench/engine_speed.py: Qwen3-VL tower vs transformers, attention kernels, DeepSeek tower routes and breakdown" ;;
    vision)     echo "bench/deepseek_vision.py: DeepSeek vision oracle vs engine wall time, taps, roofline" ;;
    checks)     echo "model-level exit statuses on CUDA: both models, torch and hip, options, bf16, gate on synthetic:full" ;;
    calibrated) echo "calibrate on synthetic:full bf16, then the calibrated gate: clean must pass, numeric faults must fail" ;;
    faults)     echo "bench/fault_matrix.py: every named fault through the gate's bf16 route" ;;
    diagnosis)  echo "bench/diagnosis_cost.py: diagnosis time against compare time, synthetic:full" ;;
    language)   echo "bench/language_verdict.py: DeepSeek language half in bf16, clean photographs and every language fault" ;;
    default-route) echo "bench/default_route.py: check with no --dtype, both models: clean photographs x chunks, every fault" ;;
    quant)      echo "bench/quant_checkpoint.py at released shapes, then synthetic:tiny-fp8 gate and checkpoint faults" ;;
    release)    echo "bench/release_checkpoint.py: the release's storage (synthetic:full-layers-2, ~11 GB) through inspect, check, gate" ;;
    sharded)    echo "bench/multi_gpu_sharded.py: torchrun ranks, merged and compared, clean and sharded faults" ;;
    taps)       echo "bench/tap_overhead.py: what taps cost a forward on the GPU" ;;
    real-dims)  echo "bench/real_dims_layers.py: DeepSeek language layers at released dimensions (~32 GB checkpoint written)" ;;
  esac
}

if [ "${1:-}" = "--list" ]; then
  for s in $STAGES; do printf '%-11s %s\n' "$s" "$(describe "$s")"; done
  printf 'default: %s\n' "$DEFAULT"
  exit 0
fi
if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
  echo "usage: bash bench/gpu.sh OUTDIR [STAGE ...] (bash bench/gpu.sh --list names the stages)" >&2
  exit 2
fi
out="$1"; shift
chosen="${*:-$DEFAULT}"
for s in $chosen; do
  [[ " $STAGES " == *" $s "* ]] || { echo "bench/gpu.sh: unknown stage '$s' (stages: $STAGES)" >&2; exit 2; }
done

mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
log="$out/gpu.log"
failed=()
P="Describe <image> in one line."

say() { echo "$*" | tee -a "$log"; }
# td NAME WANT ARGS...: one tensordiff command, its output in NAME.txt, its exit status held to WANT
td() {
  local name="$1" want="$2"; shift 2
  timeout "${TD_TIMEOUT:-300}" tensordiff "$@" >"$dir/$name.txt" 2>&1
  local rc=$?
  echo "$name	want $want	exit $rc	$(head -1 "$dir/$name.txt" | cut -c1-160)" | tee -a "$log" "$dir/results.tsv"
  [ "$rc" = "$want" ] || bad=1
}
# run_py SECONDS ARGS...: one python command of a stage, its exit status counted
run_py() {
  local secs="$1"; shift
  timeout "$secs" "$py" "$@" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || bad=1
}

stage_hip() {
  timeout 420 "$py" -c 'from engine.backend.hip_ops import load_kernels; load_kernels(verbose=True)' >"$dir/build.txt" 2>&1 \
    || { say "build failed: see $dir/build.txt"; bad=1; return; }
  timeout 300 "$py" -m pytest -q -rs -p no:cacheprovider -n 0 tests/hip --junitxml="$dir/junit-hip.xml" >"$dir/tests.txt" 2>&1 \
    || bad=1
  say "tests/hip: $(tail -1 "$dir/tests.txt")"
  td check-fp32 0 check deepseek-v4.1-flash --backend hip --device cuda --json "$dir/check-fp32.json"
  td check-bf16 0 check deepseek-v4.1-flash --backend hip --device cuda --dtype bfloat16 --json "$dir/check-bf16.json"
  td qwen 0 check qwen3-vl --backend hip --device cuda
  # the non-zero pad columns reach the tiled patch kernel: the root must still be block0
  td fault-patch-pad 1 check deepseek-v4.1-flash --backend hip --device cuda --fault patch-pad-nonzero \
    --json "$dir/fault.json"
  "$py" -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["earliest"] != ["block0"])' "$dir/fault.json" \
    || { say "patch-pad-nonzero not rooted at block0"; bad=1; }
}

stage_kernels() {
  run_py 240 bench/kernels.py --out "$dir/kernels.json"
  run_py 300 bench/kernels.py --only moe_route --router-sweep --out "$dir/router_sweep.json"
}

stage_attention() {
  run_py 200 bench/attention_sweep.py "$dir" --budget-s "${SWEEP_BUDGET_S:-80}"
}

stage_engines() {
  local sweep=()
  [ -f "$out/attention/attention_sweep.json" ] && sweep=(--attention-sweep "$out/attention/attention_sweep.json")
  timeout 120 "$py" -c "
from tensordiff.models.deepseek_v41_flash.synthetic import resolve
from tensordiff.models.qwen3_vl.synthetic import ensure
print(resolve('synthetic:full'), ensure('full'))" >>"$log" 2>&1
  run_py 470 bench/engine_speed.py "$dir" "${sweep[@]}"
}

stage_vision() {
  run_py 300 bench/deepseek_vision.py "$dir/deepseek_vision.json"
}

stage_checks() {
  td qwen-pil 0 check qwen3-vl --device cuda --processor pil
  td qwen-torchvision 0 check qwen3-vl --device cuda --processor torchvision
  td qwen-bf16 0 check qwen3-vl --device cuda --dtype bfloat16
  td qwen-fault 1 check qwen3-vl --device cuda --fault deepstack-drop
  td qwen-eager 0 check qwen3-vl --device cuda -o attention=eager
  td ds-prompt 0 check deepseek-v4.1-flash --device cuda --prompt "$P" --chunk 64 --decode 3 -o language_numerics=semantic
  td ds-prompt-hip 0 check deepseek-v4.1-flash --device cuda --backend hip --prompt "$P" --chunk 64 --decode 3 \
    -o language_numerics=semantic
  td ds-bf16-hip 0 check deepseek-v4.1-flash --device cuda --backend hip --dtype bfloat16 --prompt "$P" --chunk 64
  td ds-fault-hip 1 check deepseek-v4.1-flash --device cuda --backend hip --prompt "$P" --chunk 64 \
    --fault router-text-bias-for-images
  for k in math flash efficient cudnn flash,math; do
    td "attention-$k" 0 check deepseek-v4.1-flash --device cuda -o "attention=$k"
  done
  td attention-bf16 0 check deepseek-v4.1-flash --device cuda --dtype bfloat16 -o attention=efficient,math
  td attention-nonsense 2 check deepseek-v4.1-flash --device cuda -o attention=nonsense
  td speed-off 0 check deepseek-v4.1-flash --device cuda -o fuse=off -o graphs=off
  td speed-on 0 check deepseek-v4.1-flash --device cuda -o fuse=on -o graphs=on
  td gate-full 0 gate gates/deepseek-v4.1-flash.toml --device cuda --weights synthetic:full --dtype bfloat16 \
    --oracle-dtype float32 --json "$dir/gate-full.json"
  td gate-full-fault 1 gate gates/deepseek-v4.1-flash.toml --device cuda --weights synthetic:full --dtype bfloat16 \
    --oracle-dtype float32 --fault rope-interleaved --no-local-error
  timeout 200 "$py" -m pytest -q -rs -p no:cacheprovider -n 0 tests/engine/qwen3_vl tests/oracle/qwen3_vl \
    tests/models/test_qwen3vl_differential.py -k "torchvision or fast" >"$dir/qwen-tests.txt" 2>&1 || bad=1
  say "qwen GPU tests: $(tail -1 "$dir/qwen-tests.txt")"
}

stage_calibrated() {
  local model="${CALIBRATED_MODEL:-deepseek-v4.1-flash}" faults
  for with in calibrate gate; do
    {
      echo "[gate]"
      echo "name = \"calibrated bf16 gate ($model, synthetic:full)\""
      echo "images = [\"tensordiff:default\", \"$root/gates/images\"]"
      [ "$with" = gate ] && echo "tolerances = \"$dir/calibration.toml\""
      echo "[[model]]"
      echo "name = \"$model\""
      echo "weights = \"synthetic:full\""
      echo "dtype = \"bfloat16\""
      echo "device = \"cuda\""
      echo "local_error = false"
    } >"$dir/$with.toml"
  done
  td calibrate 0 calibrate "$dir/calibrate.toml" --out "$dir/calibration.toml"
  td clean 0 gate "$dir/gate.toml" --json "$dir/clean.json"
  if [ "$model" = qwen3-vl ]; then faults="vision-gelu-erf merger-gelu-tanh"
  else faults="residual-scale tail-row-scale norm-eps splitk-bf16 gelu-tanh"; fi
  for f in $faults; do td "fault-$f" 1 gate "$dir/gate.toml" --fault "$f" -q; done
}

stage_faults() {
  run_py 480 bench/fault_matrix.py "$dir" --device cuda --budget-s "${FAULTS_BUDGET_S:-400}"
}

stage_diagnosis() {
  run_py 470 bench/diagnosis_cost.py "$dir" --weights synthetic:full --device cuda --budget 360
}

stage_language() {
  run_py 470 bench/language_verdict.py "$dir" --device cuda --budget-s "${LANGUAGE_BUDGET_S:-420}"
}

stage_default_route() {
  run_py 420 bench/default_route.py --device cuda --workers "${WORKERS:-8}" --budget-s "${DEFAULT_ROUTE_BUDGET_S:-300}" \
    --work "$dir/work" --json "$dir/default_route.json"
}

stage_quant() {
  run_py 240 bench/quant_checkpoint.py --device cuda --json "$dir/quant_gemm.json"
  local pic="$dir/picture.png"  # 600x386: a 44-token span, no indexer near-tie in the fp32 semantic run
  "$py" -c "
import sys
import numpy as np
from PIL import Image
y, x = np.mgrid[0:386, 0:600]
Image.fromarray(np.stack([x * 255 // 600, y * 255 // 386, (x ^ y) & 255], -1).astype(np.uint8)).save(sys.argv[1])" "$pic"
  cat >"$dir/gate.toml" <<TOML
[gate]
name = "DeepSeek V4.1 Flash, quantised checkpoint, official numerics"
images = ["$pic", "tensordiff:default"]
cache = false
[[model]]
name = "deepseek-v4.1-flash"
weights = "synthetic:tiny-fp8"
prompts = ["$P"]
chunk = 16
decode = 2
dtype = "bfloat16"
device = "cuda"
local_error = true
TOML
  td gate-official 0 gate "$dir/gate.toml" --json "$dir/gate-official.json"
  td semantic 0 check deepseek-v4.1-flash --weights synthetic:tiny-fp8 --image "$pic" --device cuda --prompt "$P" \
    --chunk 16 --decode 2 -o language_numerics=semantic
  for f in fp8-scale-ignored fp8-scale-transposed fp4-nibbles-swapped engram-scale-ignored \
           wo-a-scale-dropped wo-a-block-128 fp4-int8-sign-extended; do
    td "fault-$f" 1 check deepseek-v4.1-flash --weights synthetic:tiny-fp8 --image "$pic" --device cuda --prompt "$P" \
      --chunk 16 --fault "$f" -o language_numerics=semantic
  done
}

stage_release() {
  run_py 470 bench/release_checkpoint.py --out "$dir" --weights "${RELEASE_WEIGHTS:-synthetic:full-layers-2}" \
    --layers "${LAYERS:-2}" --device cuda --dtype bfloat16
}

stage_sharded() {
  run_py 470 bench/multi_gpu_sharded.py --out "$dir" --nproc "${NPROC:-2}" ${LAYERS:+--config full --layers "$LAYERS"}
}

stage_taps() {
  run_py 300 bench/tap_overhead.py "$dir" --device cuda
}

stage_real_dims() {
  local work="${REAL_DIMS_WORK:-/tmp/real-dims-work}"
  mkdir -p "$dir/bfloat16" "$dir/float32"
  # the first run writes the checkpoint (~32 GB for one layer) under $work; the second reuses it
  run_py 330 bench/real_dims_layers.py --out "$dir/bfloat16" --layers "${LAYERS:-2}" --device cuda --dtype bfloat16 \
    --work "$work"
  run_py 200 bench/real_dims_layers.py --out "$dir/float32" --layers "${LAYERS:-2}" --device cuda --dtype float32 \
    --work "$work" -o language_numerics=semantic
}

: >"$log"
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", torch.version.hip)'
  git rev-parse --short HEAD; } 2>&1 | tee -a "$log"
command -v tensordiff >/dev/null || "$py" -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -2 | tee -a "$log"
for s in $chosen; do
  dir="$out/$s"
  mkdir -p "$dir"
  bad=0
  say "=== $s: $(describe "$s") ($(date +%T))"
  start=$SECONDS
  "stage_${s//-/_}"
  if [ "$bad" = 0 ]; then say "=== $s: ok in $((SECONDS - start)) s"
  else say "=== $s: FAILED in $((SECONDS - start)) s (see $dir)"; failed+=("$s"); fi
done
if [ ${#failed[@]} -gt 0 ]; then say "failed stages: ${failed[*]}"; exit 1; fi
say "every stage ran clean: $chosen"
