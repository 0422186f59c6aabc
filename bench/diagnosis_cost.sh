#!/usr/bin/env bash
# Diagnosis cost against compare cost (bench/diagnosis_cost.py) on one GPU at the models' real
# dimensions: both models on synthetic:full, the default picture, the clean engine, the layout
# faults and a few numeric ones. Writes OUTDIR/diagnosis_cost.json, OUTDIR/diagnosis_cost.txt and
# OUTDIR/diagnosis_cost.log. Under 8 minutes on one H200 (a time budget skips the remaining cases,
# and says so, rather than running over).
#
#   bash bench/diagnosis_cost.sh OUTDIR                                     # H200: synthetic:full, cuda
#   WEIGHTS=synthetic:tiny DEVICE=cpu bash bench/diagnosis_cost.sh OUTDIR   # CPU smoke run
set -u -o pipefail
out="${1:?usage: bench/diagnosis_cost.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
timeout 470 "$py" bench/diagnosis_cost.py "$out" --weights "${WEIGHTS:-synthetic:full}" --device "${DEVICE:-cuda}" \
  --repeat "${REPEAT:-3}" --budget "${BUDGET:-360}" ${EXTRA:-} 2>&1 | tee "$out/diagnosis_cost.log"
rc=${PIPESTATUS[0]}
echo "exit $rc" | tee -a "$out/diagnosis_cost.log"
exit $rc
