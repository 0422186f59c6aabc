#!/usr/bin/env bash
# Diagnosis cost on one H200 at the models' real dimensions (synthetic:full weights), the
# default picture; results under $1 (diagnosis_cost.json / .txt). About 3-6 minutes.
set -euo pipefail
OUT=${1:?usage: bench/diagnosis_cost.sh OUT_DIR}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD TENSORDIFF_CACHE=${TENSORDIFF_CACHE:-$OUT/cache}
timeout 470 python bench/diagnosis_cost.py "$OUT" --weights synthetic:full --device cuda --repeat 3 "${@:2}"
