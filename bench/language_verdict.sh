#!/usr/bin/env bash
# The DeepSeek language verdict in bf16 through `check`'s default two-pass route (semantic fp32 in
# the exact numerics + numeric three-way against the oracle's own bf16 floor), on synthetic:tiny:
# clean checks on scikit-image's astronaut, camera, chelsea, coffee, rocket, hubble_deep_field,
# immunohistochemistry, retina (JPEG and PNG alternately) and a very wide and a very tall crop,
# at chunk 64, none, 5 and 1, all with --decode 4; the faults router-text-bias-for-images,
# router-biased-weights and decode-engram-window-reset, each against its named boundary. The cases
# run WORKERS at a time (default 8), each in its own process sharing the GPU; the oracle dumps are
# cached under TENSORDIFF_CACHE. Writes OUTDIR/summary.json and summary.md after every case (exit
# codes, per-case seconds, each pass's verdict, local origin, the clean per-boundary floor / ratio
# table, the faults), OUTDIR/cases/*.json and OUTDIR/log.txt.
#
#   bash bench/language_verdict.sh OUTDIR                           # on the H200 (cuda), < 8 minutes
#   DEVICE=cpu CASES=smoke WORKERS=2 bash bench/language_verdict.sh OUTDIR   # a smoke run on a CPU
#   CASES=quick ...                                                  # two pictures, two chunk sizes
#   REAL_DIMS=1 bash bench/language_verdict.sh OUTDIR2              # optional, its own call: --layers 2
#
# REAL_DIMS=1 runs only the released-dimensions case: it writes the checkpoint with
# bench/real_dims_layers.py (~32 GB, about 2 minutes, under $WORK, default
# /tmp/language-verdict-ckpt, kept for a second run; that script also compares layer 2 itself) and
# runs `check --layers 2 --passes direct --oracle-dtype float32` on it, clean and with
# router-biased-weights (local error judges what a near-tie flip feeds).
set -u -o pipefail
out="${1:?usage: bench/language_verdict.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"
device="${DEVICE:-cuda}"
args=(--device "$device" --cases "${CASES:-all}" --workers "${WORKERS:-8}")
[ "${QUICK:-0}" = 1 ] && args+=(--quick)
budget="${BUDGET_S:-420}"
if [ "${REAL_DIMS:-0}" = 1 ]; then
  work="${WORK:-/tmp/language-verdict-ckpt}"
  # writes $work/ckpt (once) and runs its own oracle/engine comparison of layer 2, about 2 minutes
  timeout 330 "$py" bench/real_dims_layers.py --out "$out/real_dims" --config full --layers "${LAYERS:-2}" \
    --device "$device" --dtype bfloat16 --work "$work" >"$out/real_dims.log" 2>&1
  echo "real_dims_layers.py: exit $?" | tee -a "$out/log.txt"
  [ -d "$work/ckpt" ] || { echo "no checkpoint at $work/ckpt: see $out/real_dims.log" | tee -a "$out/log.txt"; exit 1; }
  args+=(--ckpt "$work/ckpt" --layers "${LAYERS:-2}" --only-ckpt)
fi
timeout 470 "$py" bench/language_verdict.py "$out" "${args[@]}" --budget-s "$budget" 2>&1 | tee -a "$out/log.txt"
echo "language_verdict.py: exit ${PIPESTATUS[0]}" | tee -a "$out/log.txt"
