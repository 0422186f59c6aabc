#!/usr/bin/env bash
# Issue 15, the router's bf16 target, session 7: one script, one H200, about 6 minutes.
#
#   bench/router_session7.sh OUTDIR [STAGES]     (STAGES: a subset of "tests kernels sweep profile")
#
# Stages (each logs to OUTDIR/router7.log; a failing stage is logged and the next still runs):
#   tests     build the hip backend, the router's GPU tests (every route against wave and torch,
#             exact_bf16's table for every bf16 value, unaligned rows) -> router_tests.txt
#   kernels   bench/kernels.py --only moe_route: every named route at 1,024 and 65,536 rows -> kernels_router.json
#   sweep     the same with --router-sweep (1k..64k rows: where the default switches) -> kernels_sweep.json
#   profile   where exact_bf16 and filter_g16 spend their time at 65,536 bf16 rows: ncu's warp
#             states and scheduler statistics (when ncu is there), the kernels' SASS instruction
#             counts (cuobjdump) -> profile.txt
set -u -o pipefail
out="${1:?usage: bench/router_session7.sh OUTDIR [STAGES]}"
stages="${2:-tests kernels profile}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
log="$out/router7.log"
: >"$log"
stage() { echo "=== $1 ($(date +%T), ${SECONDS}s)" | tee -a "$log"; }
has() { [[ " $stages " == *" $1 "* ]]; }
status=0
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; command -v ncu cuobjdump nvcc; } 2>&1 | tee -a "$log"

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

if has profile; then
  stage "profile: ncu warp states, SASS counts"
  cat >"$out/profile_run.py" <<'EOF'
import torch
from engine.backend.hip_ops import HipBackend
g = torch.Generator(device="cuda").manual_seed(0)
rows = 65536
a = ((torch.randn(rows, 384, generator=g, device="cuda") * 2).to(torch.bfloat16), torch.randn(384, device="cuda"),
     torch.randn(384, device="cuda"), torch.arange(rows, device="cuda") % 2 == 1)
for r in ("exact_bf16", "filter_g16"):
    be = HipBackend(router_threads=r)
    for _ in range(3):
        be.moe_route(*a, 6, 1.5)
torch.cuda.synchronize()
EOF
  if command -v ncu >/dev/null; then
    timeout 200 ncu --clock-control none --kernel-name regex:moe_route_filter --launch-skip 2 --launch-count 4 \
      --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SpeedOfLight \
      "$py" "$out/profile_run.py" >"$out/profile.txt" 2>&1
    echo "ncu: exit $?" | tee -a "$log"
    grep -E "moe_route_filter|Duration|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|Stall|Achieved Occupancy|Registers Per|Block Limit|Executed Ipc|Memory Throughput|DRAM Throughput|Compute \(SM\)|Waves Per SM|Grid Size" \
      "$out/profile.txt" | sed 's/  */ /g' | head -120 | tee -a "$log"
  else
    echo "no ncu on this machine" | tee -a "$log"
  fi
  if command -v ncu >/dev/null; then  # per-instruction executed counts and stall samples of exact_bf16
    timeout 150 ncu --clock-control none --kernel-name regex:moe_route_filter --launch-skip 2 --launch-count 1 \
      --section SourceCounters --section InstructionStats -o "$out/exact" "$py" "$out/profile_run.py" >>"$log" 2>&1
    ncu -i "$out/exact.ncu-rep" --page source --csv --print-source sass >"$out/exact_sass.csv" 2>>"$log" \
      || ncu -i "$out/exact.ncu-rep" --page source --csv >"$out/exact_sass.csv" 2>>"$log"
    echo "exact_sass.csv: $(wc -l <"$out/exact_sass.csv") lines" | tee -a "$log"
    ncu -i "$out/exact.ncu-rep" --page details --section InstructionStats 2>&1 | sed 's/  */ /g' | head -40 | tee -a "$log"
    rm -f "$out/exact.ncu-rep"
  fi
  if command -v cuobjdump >/dev/null; then
    nvcc -x cu -arch=sm_90 -std=c++17 -O3 -cubin -Ihip hip/moe_route.hip -o "$out/moe_route.cubin" 2>>"$log" &&
    cuobjdump -sass "$out/moe_route.cubin" >"$out/moe_route.sass" 2>>"$log" &&
    "$py" - "$out/moe_route.sass" <<'EOF' 2>&1 | tee -a "$log"
import re, sys
from collections import Counter
text = open(sys.argv[1]).read()
for f in re.split(r"\n\s*Function : ", text)[1:]:
    name = f.split("\n")[0]
    if "Li1ELi24ELb0ELi16ELb" not in name:  # bf16, 24 slots, g16: filter_g16 (b0) and exact_bf16 (b1)
        continue
    ops = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*(@!?U?P\w+\s+)?", "", ln).split()[0].split(".")[0]
           for ln in f.split("\n") if re.match(r"\s*/\*[0-9a-f]{4}\*/", ln)]
    c = Counter(ops)
    print(("exact_bf16" if name.rstrip().endswith(("Lb1EEEvPKvPKfS4_PKhPfPlllifi",)) or "Lb1EE" in name else "filter_g16"),
          len(ops), "SASS instructions:", ", ".join(f"{k} {v}" for k, v in c.most_common(22)))
EOF
  fi
fi
stage "done (exit $status)"
exit $status
