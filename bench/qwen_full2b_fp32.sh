#!/usr/bin/env bash
# fp32 re-check of the Qwen3-VL logits false alarm (issue 14) on one GPU: synthetic:full-2b,
# float32 with TF32 off, chelsea + astronaut at prefill chunks 1/16/64, 2 decode steps; each
# check's verdict and its logits metrics (RMS, effective atol, headroom) in
# OUTDIR/qwen_full2b_fp32.json, the log in OUTDIR/qwen_full2b_fp32.log. Under 4 minutes on one
# H200 (a budget skips the checks left, and says so). Exit 0 only when every check matches.
#
#   bash bench/qwen_full2b_fp32.sh OUTDIR                                    # H200: full-2b, cuda
#   WEIGHTS=synthetic:tiny DEVICE=cpu bash bench/qwen_full2b_fp32.sh OUTDIR  # CPU smoke run
#   FAULTS=1 BUDGET=380 LIMIT=470 bash bench/qwen_full2b_fp32.sh OUTDIR # also decode-no-delta and logits-no-final-norm (then up to ~7 minutes)
set -u -o pipefail
out="${1:?usage: bench/qwen_full2b_fp32.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export NVIDIA_TF32_OVERRIDE=0 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
  TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
timeout "${LIMIT:-235}" "$py" bench/qwen_full2b_fp32.py --out "$out" --weights "${WEIGHTS:-synthetic:full-2b}" \
  --device "${DEVICE:-cuda}" --budget "${BUDGET:-200}" ${FAULTS:+--faults} 2>&1 | tee "$out/qwen_full2b_fp32.log"
rc=${PIPESTATUS[0]}
echo "exit $rc" | tee -a "$out/qwen_full2b_fp32.log"
exit $rc
