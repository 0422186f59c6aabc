#!/usr/bin/env bash
# On a GPU machine, in one go: build the kernels through torch's extension loader, hold every
# kernel to the torch reference (tests/hip), benchmark them (bench/kernels.py), and check the
# DeepSeek vision path end to end with --backend hip against the oracle.
#
#   hip/gpu_check.sh [OUTDIR]      (default: ./out/gpu-check)
#
# Writes OUTDIR/gpu.log, junit-hip.xml, bench-kernels.json, check-*.json. Exit status: the
# first stage that failed (build 10, tests 11, bench 12, check 13, fault not named at block0 14,
# Qwen3-VL check 15), else 0.
set -u -o pipefail
out="${1:-${OUT:-out/gpu-check}}"
mkdir -p "$out"
log="$out/gpu.log"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"
status=0
stage() { echo "=== $1 ($(date +%T))" | tee -a "$log"; }

stage "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", torch.version.hip)'
  command -v nvcc && nvcc --version | tail -1; } 2>&1 | tee -a "$log"

stage "install (editable, for the CLI and the model entry points)"
"$py" -m pip install -q -e . --no-deps --no-build-isolation 2>&1 | tail -3 | tee -a "$log"

stage "build"
SECONDS=0
timeout 420 "$py" -c 'from engine.backend.hip_ops import load_kernels; load_kernels(verbose=True)' >>"$log" 2>&1 \
  || { echo "build FAILED" | tee -a "$log"; tail -40 "$log"; exit 10; }
echo "built in ${SECONDS}s" | tee -a "$log"

stage "tests/hip"
timeout 300 "$py" -m pytest tests/hip -q -rs --junitxml="$out/junit-hip.xml" 2>&1 | tee -a "$log" | tail -25
rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || [ "$status" != 0 ] || status=11

stage "bench"
timeout 240 "$py" bench/kernels.py --out "$out/bench-kernels.json" 2>&1 | tee -a "$log" | tail -15
rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || [ "$status" != 0 ] || status=12

stage "tensordiff check --backend hip"
td=(tensordiff)
command -v tensordiff >/dev/null || td=("$py" -m tensordiff.commands.cli)
for dt in float32 bfloat16; do
  timeout 240 "${td[@]}" check deepseek-v4.1-flash --weights synthetic:tiny --backend hip --device cuda \
    --dtype "$dt" --json "$out/check-$dt.json" 2>&1 | tee -a "$log" | tail -15
  rc=${PIPESTATUS[0]}
  echo "check $dt: exit $rc" | tee -a "$log"
  [ "$rc" = 0 ] || [ "$status" != 0 ] || status=13
done

# A fault must still be named under the hip backend: the 592-wide padding carrying non-zeros
# reaches the tiled patch kernel, and the comparator must root it at block0 (exit 1).
stage "tensordiff check --backend hip --fault patch-pad-nonzero (must diverge at block0)"
timeout 240 "${td[@]}" check deepseek-v4.1-flash --weights synthetic:tiny --backend hip --device cuda \
  --fault patch-pad-nonzero --json "$out/check-fault.json" 2>&1 | tee -a "$log" | head -4
rc=${PIPESTATUS[0]}
earliest=$("$py" -c 'import json,sys; print(",".join(json.load(open(sys.argv[1])).get("earliest", [])))' \
  "$out/check-fault.json" 2>/dev/null)
echo "fault check: exit $rc, earliest [$earliest]" | tee -a "$log"
{ [ "$rc" = 1 ] && [ "$earliest" = block0 ]; } || [ "$status" != 0 ] || status=14

stage "tensordiff check qwen3-vl --backend hip"
timeout 240 "${td[@]}" check qwen3-vl --weights synthetic:tiny --backend hip --device cuda 2>&1 \
  | tee -a "$log" | head -3
rc=${PIPESTATUS[0]}
echo "qwen3-vl check: exit $rc" | tee -a "$log"
[ "$rc" = 0 ] || [ "$status" != 0 ] || status=15
stage "done: status $status"
exit "$status"
