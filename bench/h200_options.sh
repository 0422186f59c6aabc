#!/usr/bin/env bash
# The typed run options on a GPU: `-o attention=...` (each SDPA kernel, and a list) on CUDA, where
# a string used to be iterated letter by letter (KeyError 'm'); the speed-path options fuse /
# graphs against their environment defaults; `-o kernel_quant=false` giving the default dump
# tensor for tensor (and `true` not); bad values exiting 2. Results: OUTDIR/options.json and one
# log per run. Nothing installed: the adapters are found through a metadata folder under OUTDIR.
#
#   bash bench/h200_options.sh OUTDIR            # DEVICE=cpu for a dry run on a machine without a GPU
set -u -o pipefail
out="${1:?usage: bench/h200_options.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py="${PYTHON:-python3}"
dev="${DEVICE:-$("$py" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}"
# the entry points `tensordiff.models` without installing the package
meta="$out/.meta/tensordiff-0.1.0.dist-info"
mkdir -p "$meta"
printf 'Metadata-Version: 2.1\nName: tensordiff\nVersion: 0.1.0\n' >"$meta/METADATA"
printf '[tensordiff.models]\ndeepseek-v4.1-flash = tensordiff.models.deepseek_v41_flash.adapter:ADAPTER\nqwen3-vl = tensordiff.models.qwen3_vl.adapter:ADAPTER\n' \
  >"$meta/entry_points.txt"
export PYTHONPATH="$PWD:$out/.meta" PYTHONUNBUFFERED=1 TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-$out/cache}"
unset TENSORDIFF_FUSE TENSORDIFF_GRAPHS
results="$out/results.tsv"
: >"$results"
P="Describe <image> in one line."

# name, expected exit status, then the tensordiff arguments
td() {
  local name="$1" want="$2"; shift 2
  timeout 300 "$py" -m tensordiff.commands.cli "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$want" "$rc" "$(head -1 "$out/$name.txt" | tr '\t' ' ')" | tee -a "$results"
}

td attention-math 0 check deepseek-v4.1-flash --device "$dev" -o attention=math
td attention-flash 0 check deepseek-v4.1-flash --device "$dev" -o attention=flash
td attention-efficient 0 check deepseek-v4.1-flash --device "$dev" -o attention=efficient
td attention-cudnn 0 check deepseek-v4.1-flash --device "$dev" -o attention=cudnn
td attention-list 0 check deepseek-v4.1-flash --device "$dev" -o attention=flash,math
td attention-bf16 0 check deepseek-v4.1-flash --device "$dev" --dtype bfloat16 -o attention=efficient,math
td speed-off 0 check deepseek-v4.1-flash --device "$dev" -o fuse=off -o graphs=off --out "$out/speed-off"
td speed-on 0 check deepseek-v4.1-flash --device "$dev" -o fuse=on -o graphs=on --out "$out/speed-on"
TENSORDIFF_FUSE=0 TENSORDIFF_GRAPHS=0 td speed-env-off 0 check deepseek-v4.1-flash --device "$dev" --out "$out/speed-env"
td attention-nonsense 2 check deepseek-v4.1-flash --device "$dev" -o attention=nonsense
td qwen-attention-eager 0 check qwen3-vl --device "$dev" -o attention=eager
td qwen-attn-nonsense 2 check qwen3-vl --device "$dev" -o attn=nonsense
td fault-without-prompt 2 check deepseek-v4.1-flash --device "$dev" --fault router-text-bias-for-images
for q in default false true; do
  extra=(); [ "$q" != default ] && extra=(-o "kernel_quant=$q")
  for side in engine oracle; do
    td "quant-$q-$side" 0 dump deepseek-v4.1-flash --side "$side" --device "$dev" --prompt "$P" \
      --out "$out/quant-$q-$side" "${extra[@]}"
  done
done

"$py" - "$out" "$dev" <<'EOF'
import json, sys
from pathlib import Path

out, dev = Path(sys.argv[1]), sys.argv[2]
rows = [l.split("\t") for l in (out / "results.tsv").read_text().splitlines() if l]
runs = {n: {"want": int(w), "exit": int(rc), "first_line": first} for n, w, rc, first in rows}

def digests(d):
    m = json.loads((out / d / "manifest.json").read_text())
    return {t["name"]: t.get("sha256") for t in m["tensors"]} if "tensors" in m else m

def manifest_run(d):
    return json.loads((out / d / "manifest.json").read_text())["run"]

quant = {}
for side in ("engine", "oracle"):
    try:
        dd, df, dt = (digests(f"quant-{q}-{side}") for q in ("default", "false", "true"))
        quant[side] = {"false_equals_default": dd == df, "true_differs": dd != dt,
                       "options_recorded": manifest_run(f"quant-false-{side}").get("options")}
    except (OSError, ValueError, KeyError) as e:
        quant[side] = {"error": repr(e)}
speed = {}
for d in ("speed-off", "speed-on", "speed-env"):
    try:
        speed[d] = manifest_run(f"{d}/engine").get("options")
    except (OSError, ValueError, KeyError) as e:
        speed[d] = {"error": repr(e)}
ok = all(r["exit"] == r["want"] for r in runs.values()) and all(
    q.get("false_equals_default") and q.get("true_differs") for q in quant.values())
summary = {"device": dev, "ok": ok, "runs": runs, "kernel_quant": quant, "speed_options_in_manifest": speed}
(out / "options.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps({"ok": ok, "failed": [n for n, r in runs.items() if r["exit"] != r["want"]], "kernel_quant": quant},
                 indent=1))
EOF
