#!/usr/bin/env bash
# Tie-aware language verdicts on a GPU: the clean DeepSeek engine with a prompt, bf16, over
# several photographs and chunk sizes, against an fp32 and a bf16 oracle, must exit 0 (router /
# indexer flips only on near-ties, each reported with its margin and floor); the language faults
# must still be caught at their choice boundary. Writes every check's JSON and text, then
# summary.json and summary.md (one row per check: exit, verdict, roots, benign flips with the
# largest margin / floor, cascade boundaries) to OUTDIR.
#
#   bash bench/language_ties.sh OUTDIR                      # on the H200 (cuda, bf16), < 8 minutes
#   DEVICE=cpu QUICK=1 bash bench/language_ties.sh OUTDIR   # a smoke run on a CPU
#
# Weights: synthetic:full has no language backbone (the released one is ~280B parameters); when
# `check` offers --layers (a layer subset at the real dimensions) and FULL_LANGUAGE=1 is set (a checkpoint with language layers: bench/real_dims_layers.sh writes one) the script runs synthetic:full
# with LAYERS (default 0-2), else synthetic:tiny (the whole tiny model). Photographs: scikit-image's
# set when it is installed (JPEG and PNG), else the bundled picture; plus a very wide and a very
# tall crop, and the README's prompt example on a JPEG of the bundled picture.
set -u -o pipefail
out="${1:?usage: bench/language_ties.sh OUTDIR}"
mkdir -p "$out/images"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"
device="${DEVICE:-cuda}"
quick="${QUICK:-0}"
budget="${BUDGET_S:-450}"   # stop starting new checks after this many seconds
start=$(date +%s)
log="$out/checks.log"
: >"$log"

"$py" - "$out/images" "$quick" <<'EOF' | tee -a "$log"
import sys
from pathlib import Path
from PIL import Image
out, quick = Path(sys.argv[1]), sys.argv[2] == "1"
from tensordiff.pipeline.inputs import default_image_path
pics = {"bundled": Image.open(default_image_path()).convert("RGB")}
try:
    import skimage.data as d
    for name in ("astronaut", "chelsea", "coffee", "rocket", "camera"):
        a = getattr(d, name)()
        pics[name] = Image.fromarray(a).convert("RGB")
except Exception as e:  # no scikit-image here: the bundled picture and its crops stand in
    print(f"scikit-image unavailable ({type(e).__name__}); photographs: the bundled picture only")
names = []
for i, (name, im) in enumerate(pics.items()):
    fmt = "jpg" if i % 2 == 0 else "png"  # alternate formats across photographs
    im.save(out / f"{name}.{fmt}", quality=90) if fmt == "jpg" else im.save(out / f"{name}.png")
    names.append(f"{name}.{fmt}")
b = pics["bundled"]
b.save(out / "readme.jpg", quality=90)  # the README's prompt example (q90 reproduces issue 11's flip)
b.crop((0, b.height // 2 - b.height // 8, b.width, b.height // 2 + b.height // 8)).save(out / "wide.png")
b.crop((b.width // 2 - b.width // 10, 0, b.width // 2 + b.width // 10, b.height)).save(out / "tall.png")
names += ["readme.jpg", "wide.png", "tall.png"]
if quick:
    names = ["readme.jpg"]
(out / "list.txt").write_text("\n".join(names) + "\n")
print("images:", " ".join(names))
EOF

if [ "${FULL_LANGUAGE:-0}" = 1 ] && timeout 60 "$py" -m tensordiff.commands.cli check --help 2>/dev/null | grep -q -- "--layers"; then
  weights=(--weights synthetic:full --layers "${LAYERS:-0-2}")
else
  weights=(--weights synthetic:tiny)
fi
echo "weights: ${weights[*]}  device: $device" | tee -a "$log"
P="Describe <image>."

run() {  # name, then check arguments
  local name="$1"; shift
  if (( $(date +%s) - start > budget )); then echo "$name: skipped (time budget)" | tee -a "$log"; return; fi
  timeout 300 "$py" -m tensordiff.commands.cli check deepseek-v4.1-flash --device "$device" "${weights[@]}" "$@" \
    --json "$out/$name.json" >"$out/$name.txt" 2>&1
  local rc=$?
  echo "$rc" >"$out/$name.rc"
  echo "$name: exit $rc $(head -1 "$out/$name.txt" | cut -c1-160)" | tee -a "$log"
}

# the README's example first (JPEG of the bundled picture, chunk 64, 4 decode steps), in fp32
run readme-fp32 --image "$out/images/readme.jpg" --prompt "$P" --chunk 64 --decode 4
for chunk in none 1 5 64; do
  c=(); [ "$chunk" = none ] || c=(--chunk "$chunk")
  run "readme-bf16-c$chunk" --image "$out/images/readme.jpg" --dtype bfloat16 --oracle-dtype float32 \
      --prompt "$P" "${c[@]}" --decode 4
  [ "$quick" = 1 ] && break
done
run readme-bf16-vs-bf16 --image "$out/images/readme.jpg" --dtype bfloat16 --prompt "$P" --chunk 64 --decode 4
while read -r img; do
  [ "$img" = readme.jpg ] && continue
  for chunk in none 64; do
    c=(); [ "$chunk" = none ] || c=(--chunk "$chunk")
    run "${img%.*}-bf16-c$chunk" --image "$out/images/$img" --dtype bfloat16 --oracle-dtype float32 \
        --prompt "$P" "${c[@]}" --decode 4
  done
done <"$out/images/list.txt"
for fault in router-text-bias-for-images router-biased-weights; do
  run "fault-$fault" --image "$out/images/readme.jpg" --dtype bfloat16 --oracle-dtype float32 --prompt "$P" \
      --chunk 64 --fault "$fault"
done

"$py" - "$out" <<'EOF' | tee -a "$log"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = []
for rc_file in sorted(out.glob("*.rc")):
    name = rc_file.stem
    row = {"check": name, "exit": int(rc_file.read_text().strip() or -1)}
    j = out / f"{name}.json"
    if j.is_file():
        data = json.loads(j.read_text())
        rep = data.get("report", data) if isinstance(data, dict) else {}
        bounds = rep.get("boundaries") or []
        row["verdict"] = rep.get("verdict")
        loc = data.get("local_error") if isinstance(data, dict) else None
        row["local_origin"] = (loc or {}).get("origin") if loc else "not run"
        row["roots"] = rep.get("earliest")
        flips = []
        for b in bounds:
            for t in b.get("tensors", []):
                ties = (t.get("metrics") or {}).get("ties")
                if ties:
                    flips += [dict(f, tensor=t["name"]) for f in ties.get("flips", [])]
        benign = [f for f in flips if f.get("benign")]
        row["benign_boundaries"] = [b["name"] for b in bounds if b.get("status") == "benign"]
        row["cascade"] = [b["name"] for b in bounds if b.get("status") == "cascade"]
        row["flips"] = flips
        worst = max(benign, key=lambda f: f["margin"] / f["floor"] if f["floor"] else 0.0, default=None)
        row["worst_benign"] = worst and {k: worst[k] for k in ("tensor", "row", "margin", "floor")}
        logits = next((b for b in bounds if b["name"] == "logits"), None)
        if logits and logits.get("tensors"):
            row["logits_cosine"] = (logits["tensors"][0].get("metrics") or {}).get("cosine")
    rows.append(row)
(out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
lines = ["| check | exit | verdict | roots | local origin | benign flips (boundaries) | worst margin / floor | cascade | logits cos |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for r in rows:
    w = r.get("worst_benign")
    lines.append(f"| {r['check']} | {r['exit']} | {r.get('verdict')} | {', '.join(r.get('roots') or []) or '-'} | "
                 f"{r.get('local_origin') or '-'} | "
                 f"{sum(f.get('benign', False) for f in r.get('flips', []))} ({', '.join(r.get('benign_boundaries') or []) or '-'}) | "
                 f"{'%.3g / %.3g (%s row %d)' % (w['margin'], w['floor'], w['tensor'], w['row']) if w else '-'} | "
                 f"{len(r.get('cascade') or [])} | {r.get('logits_cosine', '-')} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
clean = [r for r in rows if not r["check"].startswith("fault-")]
faults = [r for r in rows if r["check"].startswith("fault-")]
print(f"clean checks exiting 0: {sum(r['exit'] == 0 for r in clean)} of {len(clean)}; "
      f"faults caught (exit 1): {sum(r['exit'] == 1 for r in faults)} of {len(faults)}")
EOF
echo "done in $(( $(date +%s) - start )) s" | tee -a "$log"
