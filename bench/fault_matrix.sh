#!/usr/bin/env bash
# Every named fault of both models through the gate's bf16 route on one GPU (issue 11): vision
# faults on synthetic:full, language faults on synthetic:tiny (quantised ones on tiny-fp8), the
# clean blocks beside them; several gates at once. Under 8 minutes on one H200 (a time budget
# stops starting gates and lists what it skipped).
#
#   bash bench/fault_matrix.sh OUTDIR
#   DEVICE=cpu VISION_WEIGHTS=synthetic:tiny ONLY=rope-interleaved bash bench/fault_matrix.sh OUTDIR  # CPU smoke
set -u -o pipefail
out="${1:?usage: bench/fault_matrix.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
timeout 480 "$py" bench/fault_matrix.py "$out" --device "${DEVICE:-cuda}" --vision-weights "${VISION_WEIGHTS:-synthetic:full}" \
  --workers "${WORKERS:-6}" --budget-s "${BUDGET_S:-400}" ${ONLY:+--only "$ONLY"} 2>&1 | tee "$out/fault_matrix.log"
rc=${PIPESTATUS[0]}
echo "exit $rc" | tee -a "$out/fault_matrix.log"
exit $rc
