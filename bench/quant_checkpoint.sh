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
td() { local name="$1"; shift; timeout 240 "$py" -m tensordiff.cli "$@" --json "$out/$name.json" >"$out/$name.txt" 2>&1
       local rc=$?; echo "$name: exit $rc $(head -1 "$out/$name.txt")" | tee -a "$log"; }

stage "FP8 / FP4 GEMM: engine vs the official block order, released shapes"
timeout 240 "$py" bench/quant_checkpoint.py --device "$dev" ${SMALL:+--small} --json "$out/quant_gemm.json" 2>&1 | tee -a "$log"

P="Describe <image> in one line."
stage "whole model, synthetic:tiny-fp8, official numerics (bf16 + kernel quantisation)"
td official check deepseek-v4.1-flash --weights synthetic:tiny-fp8 --device "$dev" --dtype bfloat16 --prompt "$P" --chunk 16 --decode 2
stage "whole model, synthetic:tiny-fp8, semantic numerics (fp32, exact dequantised weights)"
td semantic check deepseek-v4.1-flash --weights synthetic:tiny-fp8 --device "$dev" --prompt "$P" --chunk 16 --decode 2 -o language_numerics=semantic

stage "checkpoint-reading faults (each must exit 1 at its boundary)"
for f in fp8-scale-ignored fp8-scale-transposed fp4-nibbles-swapped engram-scale-ignored; do
  td "fault-$f" check deepseek-v4.1-flash --weights synthetic:tiny-fp8 --device "$dev" --dtype bfloat16 --prompt "$P" --chunk 16 --fault "$f"
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
    print(f"{p.stem}: verdict {r.get('verdict')} earliest {r.get('earliest')}")
PY
stage "done"
