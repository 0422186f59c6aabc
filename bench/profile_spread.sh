#!/usr/bin/env bash
# The clean engine's profile across images, repeated runs, the compiled path and a weight seed,
# then a calibrated gate on the compiled engine (issue 11, "The engine's own profile"). DeepSeek
# V4.1 Flash, synthetic:full vision, bf16, 4 photographs, eager (fuse/graphs off) and compiled
# (fuse/graphs on), 3 runs per image. Writes OUTDIR/profile_spread.json (+ the calibrations and a
# log). Hard cap: 5 minutes (a step that would not fit its budget is skipped and listed).
#
#   bash bench/profile_spread.sh OUTDIR                       # H200: synthetic:full, cuda
#   SMOKE=1 bash bench/profile_spread.sh OUTDIR               # CPU: synthetic:tiny, 2 small pictures
set -u -o pipefail
out="${1:?usage: bench/profile_spread.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
timeout 295 "$py" bench/profile_spread.py "$out" --budget "${BUDGET:-250}" ${SMOKE:+--smoke} ${EXTRA:-} 2>&1 \
  | tee "$out/profile_spread.log"
rc=${PIPESTATUS[0]}
echo "exit $rc" | tee -a "$out/profile_spread.log"
exit $rc
