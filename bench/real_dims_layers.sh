#!/usr/bin/env bash
# The DeepSeek language backbone at its real dimensions (dim 5120, 384 experts, top-512 indexer),
# a layer subset on one GPU: writes the checkpoint (synthetic:full vision + the chosen layers),
# runs oracle and engine with --layers, compares, plants a fault. Results in OUT/real_dims_layers.json.
#
#   bash bench/real_dims_layers.sh OUT [LAYERS]        # LAYERS default 2 (one MoE layer is ~27 GB bf16)
set -u -o pipefail
out="${1:?usage: bench/real_dims_layers.sh OUT [LAYERS]}"
layers="${2:-2}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
timeout 470 "$py" bench/real_dims_layers.py --out "$out" --config full --layers "$layers" \
  --device cuda --dtype bfloat16 2>&1 | tee "$out/real_dims_layers.log"
