#!/usr/bin/env bash
# Qwen3-VL language path on one GPU (issue 14): synthetic:full-2b in bfloat16 with a prompt, a
# chunked prefill (16) and 3 decode steps; the gate's semantic pass and numeric three-way verdict
# on four photographs (the clean engine must pass all), every language fault on the first (each
# must fail at its boundary), and the wall time of one full-2b check. Writes
# OUTDIR/qwen_language.json, OUTDIR/qwen_language.md and OUTDIR/qwen_language.log. Under 8
# minutes on one H200 (a time budget skips remaining fault runs, and says so).
#
#   bash bench/qwen_language.sh OUTDIR                                    # H200: full-2b, cuda
#   WEIGHTS=synthetic:tiny DEVICE=cpu bash bench/qwen_language.sh OUTDIR  # CPU smoke run
set -u -o pipefail
out="${1:?usage: bench/qwen_language.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
timeout 470 "$py" bench/qwen_language.py --out "$out" --weights "${WEIGHTS:-synthetic:full-2b}" \
  --device "${DEVICE:-cuda}" --budget "${BUDGET:-380}" 2>&1 | tee "$out/qwen_language.log"
rc=${PIPESTATUS[0]}
echo "exit $rc" | tee -a "$out/qwen_language.log"
exit $rc
