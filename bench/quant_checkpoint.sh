#!/usr/bin/env bash
# Quantised DeepSeek V4.1 Flash checkpoints on one GPU (bf16, the official numerics), in one go:
# the dequantising matmul against the official block-scaled FP8 GEMM at the released projection
# shapes, the whole model on synthetic:tiny-fp8 (FP8 dense + scales, FP4 experts, FP8 Engram) in
# the official and the semantic numerics, and the four checkpoint-reading faults. Logs and JSON
# go to OUTDIR; no installs, no network (the repository is put on PYTHONPATH).
#
#   bash bench/quant_checkpoint.sh OUTDIR
set -u -o pipefail
out="${1:?usage: bench/quant_checkpoint.sh OUTDIR}"
mkdir -p "$out"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
dev="${DEVICE:-cuda}"
log="$out/quant.log"
stage() { echo "=== $1 ($(date +%T))" | tee -a "$log"; }
td() { local name="$1"; shift; timeout 300 "$py" -m tensordiff.commands.cli "$@" --json "$out/$name.json" >"$out/$name.txt" 2>&1
       local rc=$?; echo "$name: exit $rc $(head -1 "$out/$name.txt")" | tee -a "$log"; }

stage "FP8 / FP4 GEMM: engine vs the official block order, released shapes"
timeout 240 "$py" bench/quant_checkpoint.py --device "$dev" ${SMALL:+--small} --json "$out/quant_gemm.json" 2>&1 | tee -a "$log"

P="Describe <image> in one line."
# a 600x386 picture (a 44-token span): short enough that the fp32 semantic run has no indexer near-tie
pic="$out/picture.png"
"$py" - "$pic" <<'PY'
import sys
import numpy as np
from PIL import Image
y, x = np.mgrid[0:386, 0:600]
Image.fromarray(np.stack([x * 255 // 600, y * 255 // 386, (x ^ y) & 255], -1).astype(np.uint8)).save(sys.argv[1])
PY
cat >"$out/gate.toml" <<TOML
[gate]
name = "DeepSeek V4.1 Flash, quantised checkpoint, official numerics"
images = ["$pic", "tensordiff:default"]
cache = false
[[model]]
name = "deepseek-v4.1-flash"
weights = "synthetic:tiny-fp8"
prompts = ["$P"]
chunk = 16
decode = 2
dtype = "bfloat16"
device = "$dev"
local_error = true
TOML

stage "gate: synthetic:tiny-fp8, official numerics (bf16 + kernel quantisation), end to end and local error"
td gate-official gate "$out/gate.toml"
stage "whole model, synthetic:tiny-fp8, semantic numerics (fp32, exact dequantised weights)"
td semantic check deepseek-v4.1-flash --weights synthetic:tiny-fp8 --image "$pic" --device "$dev" --prompt "$P" --chunk 16 --decode 2 -o language_numerics=semantic

stage "checkpoint-reading faults, semantic numerics (each must exit 1 at its boundary)"
for f in fp8-scale-ignored fp8-scale-transposed fp4-nibbles-swapped engram-scale-ignored; do
  td "fault-$f" check deepseek-v4.1-flash --weights synthetic:tiny-fp8 --image "$pic" --device "$dev" --prompt "$P" --chunk 16 --fault "$f" -o language_numerics=semantic
done

stage "summary"
"$py" - "$out" <<'PY' | tee -a "$log"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for p in sorted(out.glob("*.json")):
    if p.name == "quant_gemm.json":
        continue
    try:
        r = json.loads(p.read_text())
    except ValueError:
        print(f"{p.stem}: no report"); continue
    for c in r.get("cases", [r]):
        rep = c.get("report", c) or {}
        loc = c.get("local_error") or {}
        print(f"{p.stem} {c.get('label', '')}: verdict {rep.get('verdict')} earliest {rep.get('earliest')}"
              + (f" local origin {loc.get('origin')}" if loc else ""))
PY
stage "done"
