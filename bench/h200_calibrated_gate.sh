#!/usr/bin/env bash
# The calibrated bf16 gate on one GPU (issue: a verdict you can trust in bf16): calibrate the
# oracle's floor and the clean engine's own profile on four photographs, then run the gate with
# that calibration, clean and with every numeric / approximation fault. Figures and the gate's
# JSON go to OUTDIR.
#
#   bash bench/h200_calibrated_gate.sh OUTDIR [MODEL]      # MODEL: deepseek-v4.1-flash (default) or qwen3-vl
set -u -o pipefail
out="${1:?usage: bench/h200_calibrated_gate.sh OUTDIR [MODEL]}"
model="${2:-deepseek-v4.1-flash}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
work="$(mktemp -d)"
"$py" - "$work/pics" <<'PY'
import sys
from pathlib import Path
from PIL import Image
from skimage import data
out = Path(sys.argv[1]); out.mkdir(parents=True)
for i, name in enumerate(("chelsea", "rocket", "astronaut", "coffee")):
    Image.fromarray(getattr(data, name)()).convert("RGB").save(out / f"{name}.{'jpg' if i % 2 else 'png'}")
PY
cat >"$work/gate.toml" <<TOML
[gate]
name = "calibrated bf16 gate ($model, synthetic:full)"
images = ["$work/pics"]
tolerances = "$out/calibration.toml"
[[model]]
name = "$model"
weights = "${WEIGHTS:-synthetic:full}"
dtype = "bfloat16"
device = "${DEVICE:-cuda}"
local_error = false
TOML
log="$out/calibrated_gate.log"
td() { timeout "$1" "$py" -m tensordiff.commands.cli "${@:2}"; }
echo "=== calibrate ($(date +%T))" | tee "$log"
sed 's/^tolerances = .*//' "$work/gate.toml" >"$work/cal-gate.toml"
td 200 calibrate "$work/cal-gate.toml" --out "$out/calibration.toml" 2>&1 | tail -30 | tee -a "$log"
echo "=== clean gate ($(date +%T))" | tee -a "$log"
td 120 gate "$work/gate.toml" --json "$out/gate-clean.json" 2>&1 | tail -8 | tee -a "$log"
echo "clean exit ${PIPESTATUS[0]}" | tee -a "$log"
if [ "$model" = qwen3-vl ]; then faults="vision-gelu-erf merger-gelu-tanh"; else faults="residual-scale tail-row-scale norm-eps splitk-bf16 gelu-tanh"; fi
for f in $faults; do
  echo "=== fault $f ($(date +%T))" | tee -a "$log"
  td 90 gate "$work/gate.toml" --fault "$f" --json "$out/gate-$f.json" 2>&1 | grep -E "^(PASS|FAIL|ERROR)" | cut -c1-300 | tee -a "$log"
  echo "$f exit ${PIPESTATUS[0]}" | tee -a "$log"
done
echo "=== done ($(date +%T))" | tee -a "$log"
