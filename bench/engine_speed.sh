#!/usr/bin/env bash
# The engines on one GPU (issue 15), in under 8 minutes on an H200: the Qwen3-VL tower against
# transformers, every attention kernel at DeepSeek's tower shape, the DeepSeek tower + aligner
# (torch and hip, default kernel order and the measured best first), the HIP router kernel's
# correctness (tests/hip, the moe_route cases) and its share of the copy roofline.
#
#   bench/engine_speed.sh OUTDIR
#
# Writes OUTDIR/engine_speed.json (bench/engine_speed.py), OUTDIR/kernels_router.json
# (bench/kernels.py --only moe_route), OUTDIR/router_tests.txt and OUTDIR/engine_speed.log.
# Needs: a CUDA torch, transformers, Triton (for the compiled blocks), nvcc (the hip backend).
# ENGINE_SPEED_ARGS is passed to engine_speed.py: "--device cpu --small --iters 1" is the CPU
# smoke run of the whole script (tiny weights; the GPU-only stages then say so and go on).
set -u -o pipefail
out="${1:?usage: bench/engine_speed.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
log="$out/engine_speed.log"
stage() { echo "=== $1 ($(date +%T))" | tee -a "$log"; }
status=0
start=$SECONDS

args="${ENGINE_SPEED_ARGS:-}"
if [[ "$args" != *--small* ]]; then
  stage "synthetic:full weights (both models; cached after the first run)"
  timeout 120 "$py" -c "
from tensordiff.models.deepseek_v41_flash.synthetic import resolve
from tensordiff.models.qwen3_vl.synthetic import ensure
print(resolve('synthetic:full'), ensure('full'))" 2>&1 | tail -2 | tee -a "$log"
fi

stage "hip backend build + router correctness on the GPU"
timeout 200 "$py" -m pytest -q -p no:cacheprovider tests/hip/test_hip_kernels.py -k "moe_route or router" \
  >"$out/router_tests.txt" 2>&1
rc=$?; echo "router tests: exit $rc, $(tail -1 "$out/router_tests.txt")" | tee -a "$log"; [ $rc -eq 0 ] || status=1

stage "router kernel vs copy roofline"
timeout 60 "$py" bench/kernels.py --only moe_route --out "$out/kernels_router.json" 2>&1 | tail -8 | tee -a "$log"

stage "engines (bench/engine_speed.py)"
# what is left of 8 minutes (at least 240 s); engine_speed.json is written after every section
left=$(( 470 - (SECONDS - start) )); [ $left -lt 240 ] && left=240
timeout $left "$py" bench/engine_speed.py "$out" $args 2>&1 | tee -a "$log"
rc=$?; echo "engine_speed.py: exit $rc" | tee -a "$log"; [ $rc -eq 0 ] || status=1
stage "done (exit $status)"
exit $status
