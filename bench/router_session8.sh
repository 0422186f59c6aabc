#!/usr/bin/env bash
# Issue 15, the router's bf16 target, session 8: one script, one H200, under 8 minutes.
#
#   bench/router_session8.sh OUTDIR [STAGES] [OLD_SOURCE]
#
# STAGES: a subset of "tests kernels sweep variants profile" (default "tests kernels variants profile").
# ROUTER8_VARIANTS (environment): more exact_bf16 builds for the variants stage, "name=-DFLAG=V ...;name2=...".
# OLD_SOURCE: another moe_route.hip (e.g. session 7's, `git show a80c49f:hip/moe_route.hip`) timed
# beside this tree's in the variants stage, in the same process (the lead's A/B on one GPU).
#
#   tests     build the hip backend, the router's GPU tests -> router_tests.txt
#   kernels   bench/kernels.py --only moe_route: every named route at 1,024 and 65,536 rows
#   sweep     the same with --router-sweep (where the default switches)
#   variants  moe_route.hip compiled by nvcc alone into shared libraries (this tree's, with each
#             ROUTER8_VARIANTS flag set, and OLD_SOURCE's), exact_bf16 timed at 65,536 and 1,024
#             bf16 rows by bench/kernels.py's graph replay; each held bit for bit to the wave route
#             (session 8 compared its knobs this way; the ones that lost left the kernel with them)
#   profile   ncu on exact_bf16 at 65,536 bf16 rows: warp states, scheduler statistics, and the
#             executed warp instructions by SASS opcode and by source line (SourceCounters)
# Everything is printed (a stage's key lines) and logged to OUTDIR/router8.log.
set -u -o pipefail
out="${1:?usage: bench/router_session8.sh OUTDIR [STAGES] [OLD_SOURCE]}"
stages="${2:-tests kernels variants profile}"
old_source="${3:-}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
[ -n "$old_source" ] && old_source="$(cd "$(dirname "$old_source")" && pwd)/$(basename "$old_source")"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
log="$out/router8.log"
: >"$log"
stage() { echo "=== $1 ($(date +%T), ${SECONDS}s)" | tee -a "$log"; }
has() { [[ " $stages " == *" $1 "* ]]; }
status=0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; command -v ncu nvcc; } 2>&1 | tee -a "$log"

if has tests; then
  stage "tests: build + the router's GPU tests"
  timeout 300 "$py" -m pytest -q -p no:cacheprovider tests/hip/test_hip_kernels.py tests/hip/test_hip_router_fault.py \
    -k "moe_route or router" >"$out/router_tests.txt" 2>&1
  rc=$?
  echo "router tests: exit $rc, $(tail -1 "$out/router_tests.txt")" | tee -a "$log"
  [ $rc -eq 0 ] || { status=1; grep -E "^(FAILED|ERROR)|Error" "$out/router_tests.txt" | head -20 | tee -a "$log"; }
fi

if has kernels; then
  stage "kernels: bench/kernels.py --only moe_route"
  timeout 200 "$py" bench/kernels.py --only moe_route --out "$out/kernels_router.json" 2>&1 | grep -E "router|copy" | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has sweep; then
  stage "sweep: bench/kernels.py --only moe_route --router-sweep"
  timeout 300 "$py" bench/kernels.py --only moe_route --router-sweep --out "$out/kernels_sweep.json" 2>&1 \
    | grep -E "router|copy|^  (f32|bf16)/" | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has variants; then
  stage "variants: exact_bf16 with its compile-time knobs${old_source:+, and $old_source}"
  cat >"$work/variants.py" <<'PY'
import ctypes, json, os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import torch
from bench.kernels import copy_bandwidth, graph_us, router_bytes, sets_for

HIP = Path("hip").resolve()
out, work, old = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
# name -> (source, -D flags, route code)
VARIANTS = {"exact_bf16": (HIP / "moe_route.hip", [], -13), "filter_g16": (HIP / "moe_route.hip", [], -11)}
# more: ROUTER8_VARIANTS="name=-DFLAG=1 -DOTHER=2;name2=..." (exact_bf16 built with those flags)
for spec in filter(None, os.environ.get("ROUTER8_VARIANTS", "").split(";")):
    name, _, flags = spec.partition("=")
    VARIANTS[name.strip()] = (HIP / "moe_route.hip", flags.split(), -13)
if old:
    VARIANTS["old_exact_bf16"] = (Path(old), [], -13)
arch = "sm_%d%d" % torch.cuda.get_device_capability()

def build(item):
    name, (src, flags, _) = item
    so = work / f"lib_{name}.so"
    r = subprocess.run(["nvcc", "-x", "cu", f"-arch={arch}", "-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC",
                        "-Xptxas", "-v", *flags, f"-I{HIP}", str(src), "-o", str(so)], capture_output=True, text=True)
    if r.returncode != 0:
        return name, None, r.stderr[-1500:]
    ln = r.stderr.splitlines()
    info = next((ln[i + 2].strip() + "; " + ln[i + 3].strip() for i, s in enumerate(ln[:-3])
                 if "Compiling entry function" in s and "Li1ELi24ELb0ELi16ELb1E" in s), "")
    lib = ctypes.CDLL(str(so))
    lib.td_moe_route.restype = ctypes.c_int
    lib.td_moe_route.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_float,
                                                          ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return name, lib, info

def call(lib, code, a):
    logits, bias, bias_vl, image = a
    rows = logits.shape[0]
    w = torch.empty(rows, 6, device="cuda")
    ids = torch.empty(rows, 6, dtype=torch.int64, device="cuda")
    rc = lib.td_moe_route(logits.data_ptr(), bias.data_ptr(), bias_vl.data_ptr(), image.data_ptr(), w.data_ptr(),
                          ids.data_ptr(), rows, 384, 6, 1.5, 1, 0, code, torch.cuda.current_stream().cuda_stream)
    assert rc == 0, rc
    return w, ids

with ThreadPoolExecutor(8) as ex:
    built = {n: (lib, info) for n, lib, info in ex.map(build, VARIANTS.items())}
g = torch.Generator(device="cuda").manual_seed(0)
bw = copy_bandwidth(10)
res = {"copy_gbs": bw, "variants": {}}
print(f"copy {bw:.0f} GB/s")
for rows in (65536, 1024):
    nbytes = router_bytes(rows, 2)
    n_sets = sets_for(nbytes)
    sets = [((torch.randn(rows, 384, generator=g, device="cuda") * 2.0).to(torch.bfloat16),
             torch.randn(384, generator=g, device="cuda"), torch.randn(384, generator=g, device="cuda"),
             (torch.arange(rows, device="cuda") % 2 == 1).view(torch.uint8)) for _ in range(n_sets)]
    roof = nbytes / (bw * 1e9) * 1e6
    for name, (src, flags, code) in VARIANTS.items():
        lib, info = built[name]
        key = f"{name}/{rows}"
        if lib is None:
            res["variants"][key] = {"error": info}
            print(f"{key:30} build failed: {info}")
            continue
        us = graph_us(lambda i, lib=lib, code=code: call(lib, code, sets[i]), n_sets, 20)
        w, ids = call(lib, code, sets[0])
        w0, ids0 = call(lib, -1, sets[0])
        same = bool(torch.equal(ids, ids0) and torch.equal(w.view(torch.int32), w0.view(torch.int32)))
        res["variants"][key] = {"us": us, "pct_roofline": 100 * roof / us, "bitwise_equal_wave_route": same, "ptxas": info}
        print(f"{key:30} {us:8.2f} us {100 * roof / us:5.1f}%  {'= wave' if same else 'DIFFERS from wave'}  {info}")
    del sets
    torch.cuda.empty_cache()
(out / "router_variants8.json").write_text(json.dumps(res, indent=1))
PY
  timeout 240 "$py" "$work/variants.py" "$out" "$work" "$old_source" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has profile; then
  stage "profile: ncu on exact_bf16, 65,536 bf16 rows"
  cat >"$work/profile_run.py" <<'PY'
import torch
from engine.backend.hip_ops import HipBackend
g = torch.Generator(device="cuda").manual_seed(0)
rows = 65536
a = ((torch.randn(rows, 384, generator=g, device="cuda") * 2).to(torch.bfloat16), torch.randn(384, device="cuda"),
     torch.randn(384, device="cuda"), torch.arange(rows, device="cuda") % 2 == 1)
be = HipBackend(router_threads="exact_bf16")
for _ in range(4):
    be.moe_route(*a, 6, 1.5)
torch.cuda.synchronize()
PY
  if command -v ncu >/dev/null; then
    timeout 150 ncu --clock-control none --kernel-name regex:moe_route_filter --launch-skip 2 --launch-count 1 \
      --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
      --section SpeedOfLight --section SourceCounters --section InstructionStats -o "$work/exact" \
      "$py" "$work/profile_run.py" >>"$log" 2>&1
    echo "ncu: exit $?" | tee -a "$log"
    ncu -i "$work/exact.ncu-rep" --page details 2>&1 | sed 's/  */ /g' \
      | grep -E "Duration|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|Stall|Achieved Occupancy|Registers Per|Block Limit|Executed Ipc|Memory Throughput|Compute \(SM\)|Executed Instructions|Grid Size|Waves Per SM" \
      | head -60 | tee -a "$log"
    ncu -i "$work/exact.ncu-rep" --page source --csv --print-source sass >"$out/exact_sass.csv" 2>>"$log"
    "$py" - "$out/exact_sass.csv" 65536 <<'PY' 2>&1 | tee -a "$log"
import csv, re, sys
try:
    rows = list(csv.reader(open(sys.argv[1])))
    next(i for i, r in enumerate(rows) if any("Instructions Executed" in c for c in r))
except Exception as e:  # the CSV's layout is not the one expected: show its head instead
    print("exact_sass.csv not parsed:", e, open(sys.argv[1]).read()[:1500])
    sys.exit(0)
from collections import Counter
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if any("Instructions Executed" in c for c in r))
h = rows[hdr]
src = next(i for i, c in enumerate(h) if c.strip() in ("Source", "# Source"))
ex = next(i for i, c in enumerate(h) if c.strip() == "Instructions Executed")
stall = [i for i, c in enumerate(h) if "Warp Stall Sampling (All" in c]
ops, total, lines = Counter(), 0, []
for r in rows[hdr + 1:]:
    if len(r) <= ex or not r[ex].strip().replace(",", "").isdigit():
        continue
    n = int(r[ex].replace(",", ""))
    s = re.sub(r"^\s*(@!?U?P\w+\s+)?", "", r[src]).split()
    op = s[0].split(".")[0] if s else "?"
    ops[op] += n
    total += n
    lines.append((n, int(r[stall[0]].replace(",", "") or 0) if stall else 0, r[src].strip()))
warps2 = int(sys.argv[2]) / 2  # a warp32's 2 rows
print(f"executed warp instructions: {total}, {total / warps2:.1f} per warp's 2 rows")
print("by opcode (per warp's 2 rows):", ", ".join(f"{k} {v / warps2:.1f}" for k, v in ops.most_common(25)))
print("busiest SASS lines (per warp's 2 rows, stall samples):")
for n, st, s in sorted(lines, reverse=True)[:12]:
    print(f"  {n / warps2:6.2f}  {st:6}  {s[:90]}")
top = sorted(lines, key=lambda t: -t[1])[:12]
print("most stalled SASS lines (samples, per warp's 2 rows):")
for n, st, s in top:
    print(f"  {st:6}  {n / warps2:6.2f}  {s[:90]}")
PY
  else
    echo "no ncu on this machine" | tee -a "$log"
  fi
fi
stage "done (exit $status)"
exit $status
