#!/usr/bin/env bash
# The bf16 verdict table of issue 11 on one GPU: both models on synthetic:full in bfloat16, ten
# pictures (eight scikit-image photographs as PNG and JPEG, a very wide and a very tall crop), the
# clean engine on all of them and every numeric / approximation fault on the first three.
# Writes OUTDIR/bf16_verdict.json, OUTDIR/bf16_verdict.md (per boundary: floor, clean ratios
# min/median/max, each fault's ratios) and OUTDIR/bf16_verdict.log. Under 8 minutes on one H200
# (a time budget skips remaining fault runs, and says so, rather than running over).
#
#   bash bench/bf16_verdict.sh OUTDIR                 # H200: synthetic:full, cuda
#   WEIGHTS=synthetic:tiny DEVICE=cpu bash bench/bf16_verdict.sh OUTDIR   # CPU smoke run
set -u -o pipefail
out="${1:?usage: bench/bf16_verdict.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
timeout 470 "$py" bench/bf16_verdict.py --out "$out" --weights "${WEIGHTS:-synthetic:full}" \
  --device "${DEVICE:-cuda}" --budget "${BUDGET:-330}" ${EXTRA:-} 2>&1 | tee "$out/bf16_verdict.log"
rc=${PIPESTATUS[0]}
echo "exit $rc" | tee -a "$out/bf16_verdict.log"
exit $rc
