#!/usr/bin/env bash
# Issue 15, "Engines on the H200", round 3: one script, one GPU, about 7 minutes.
#
#   bench/gpu_round3.sh OUTDIR
#
# Stages (each writes under OUTDIR; a failing stage is logged and the next one still runs):
#   1. hip backend build + the router's correctness on the GPU: tests/hip -k "moe_route or router"
#      (every router route against torch.topk, ties, image/text bias rows, bf16/f32, the planted fault)
#      -> router_tests.txt
#   2. the router kernel against the copy roofline and one launch's latency (bench/kernels.py
#      --only moe_route: 1,024 rows is latency-bound and says so; 65,536 rows is the >= 30% target),
#      every named route (wave, wave_lb) at both sizes and dtypes;
#      the summary's "router best route" lines say what hip/moe_route.hip kDefaultRoute should be
#      -> kernels_router.json
#   3. the attention sweep: every Triton config of engine/runtime/triton_attention.py beside cuDNN,
#      flash and efficient SDPA at DeepSeek's (16 x 8,910 x 64) and Qwen3-VL's (16 x 2,728 x 72)
#      shapes, each checked against SDPA math in fp32 (bench/attention_sweep.py; each shape in
#      worker processes: a config that faults the device is recorded, a fresh worker goes on)
#      -> attention_sweep.json
#   4. the DeepSeek tower + aligner: every route (torch / hip, default / measured best first, hip
#      with its own kernels only), hip over torch, the verdict checks and the breakdown
#      (bench/engine_speed.py --only attention --only deepseek), with the sweep's best Triton
#      configs among those the kernel chooses from -> engine_speed.json
# Everything is also in OUTDIR/gpu_round3.log; the last lines are the summary.
#
# CPU smoke run (no GPU): ENGINE_SPEED_ARGS="--device cpu --small --iters 1" bench/gpu_round3.sh OUT
# (GPU-only stages say so and go on; the sweep runs through Triton's interpreter where Triton is
# installed). Needs on the GPU: a CUDA torch, Triton (compiled blocks, the sweep), nvcc (hip).
set -u -o pipefail
out="${1:?usage: bench/gpu_round3.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
py="${PYTHON:-python3}"
log="$out/gpu_round3.log"
: >"$log"
stage() { echo "=== $1 ($(date +%T), ${SECONDS}s)" | tee -a "$log"; }
status=0
args="${ENGINE_SPEED_ARGS:-}"
small=0; [[ "$args" == *--small* ]] && small=1
gpu=0; "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && gpu=1
[[ "$args" == *"--device cpu"* ]] && gpu=0
echo "gpu: $gpu  small: $small  engine_speed args: ${args:-(none)}" | tee -a "$log"

if [ $small -eq 0 ]; then
  stage "0. synthetic:full DeepSeek weights (cached after the first run)"
  timeout 120 "$py" -c "
from tensordiff.models.deepseek_v41_flash.synthetic import resolve
print(resolve('synthetic:full'))" 2>&1 | tail -1 | tee -a "$log"
fi

stage "1. hip build + router correctness (tests/hip -k 'moe_route or router')"
# ROUND_TESTS replaces stage 1's pytest arguments (e.g. every test file with a GPU path)
round_tests=(tests/hip -k "moe_route or router")
[ -n "${ROUND_TESTS:-}" ] && read -r -a round_tests <<<"$ROUND_TESTS"
timeout "${ROUND_TESTS_TIMEOUT:-200}" "$py" -m pytest -q -p no:cacheprovider "${round_tests[@]}" >"$out/router_tests.txt" 2>&1
rc=$?
echo "router tests: exit $rc, $(tail -1 "$out/router_tests.txt")" | tee -a "$log"
[ $gpu -eq 1 ] || echo "  (no GPU: the GPU tests skipped; the CPU SIMT run of hip/moe_route.hip ran)" | tee -a "$log"
[ $rc -eq 0 ] || status=1

stage "2. router kernel vs copy roofline and launch floor (bench/kernels.py --only moe_route)"
if [ $gpu -eq 1 ]; then
  timeout 150 "$py" bench/kernels.py --only moe_route --out "$out/kernels_router.json" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "  skipped: bench/kernels.py needs a GPU" | tee -a "$log"
fi

stage "3. attention sweep (bench/attention_sweep.py)"
if [ "${SKIP_SWEEP:-0}" = 1 ]; then
  echo "  skipped (SKIP_SWEEP=1): the Triton kernel runs its DEFAULT_CONFIGS" | tee -a "$log"
else
# SWEEP_ARGS replaces the GPU sweep's arguments (e.g. "--budget-s 150 --only deepseek")
read -r -a sweep_args <<<"${SWEEP_ARGS:---budget-s 80}"
[ $small -eq 1 ] && sweep_args=(--small --reps 1 --device cpu)
timeout 170 "$py" bench/attention_sweep.py "$out" "${sweep_args[@]}" 2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

stage "4. DeepSeek tower routes, hip vs torch, breakdown (bench/engine_speed.py)"
left=$(( 440 - SECONDS )); [ $left -lt 200 ] && left=200
sweep_json=()
[ -f "$out/attention_sweep.json" ] && sweep_json=(--attention-sweep "$out/attention_sweep.json")
# shellcheck disable=SC2086  # ENGINE_SPEED_ARGS is a list of words
# ENGINE_ONLY: the engine_speed sections (default "attention deepseek"; "qwen attention deepseek" adds Qwen3-VL's)
only=(); for o in ${ENGINE_ONLY:-attention deepseek}; do only+=(--only "$o"); done
timeout $left "$py" bench/engine_speed.py "$out" "${only[@]}" "${sweep_json[@]}" $args 2>&1 \
  | tee -a "$log"
rc=${PIPESTATUS[0]}
echo "engine_speed.py: exit $rc" | tee -a "$log"
[ $rc -eq 0 ] || status=1

stage "summary"
"$py" - "$out" <<'EOF' 2>&1 | tee -a "$log"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
k = load("kernels_router.json")
if k:
    for size, b in k.get("router_best", {}).items():
        print(f"router best route {size:14s} {b['route']:11s} {b['hip_us']:8.2f} us   ("
              + ", ".join(f"{n} {us:.1f}" for n, us in sorted(b["all_us"].items(), key=lambda x: x[1])) + ")")
    for r in k["kernels"]:
        print(f"router {r['kernel']:28s} hip {r['hip_us']:8.2f} us  roofline {r['roofline_us']:6.2f} us  "
              f"{r['hip_pct_roofline']:5.1f}% of roofline  bound: {r['bound']} ({r['hip_pct_of_bound']:.0f}%)  "
              f"target >= 30%: {'met' if r['hip_pct_roofline'] >= 30 else 'NOT met'}")
s = load("attention_sweep.json")
for name, r in (s or {}).get("shapes", {}).items():
    b, c = r.get("best_triton"), r.get("kernels", {}).get("sdpa_cudnn", {})
    print(f"attention {name}: cudnn {c.get('ms', float('nan')):.3f} ms; best triton "
          f"{b['label'] + ' %.3f ms %.0f TFLOP/s' % (b['ms'], b['tflops']) if b else None}; "
          f"triton/cudnn {r.get('triton_over_cudnn')}")
e = load("engine_speed.json")
q = (e or {}).get("qwen", {})
for name, v in q.get("engine", {}).items():
    print(f"qwen {name:22s} " + (f"{v['ms']:.2f} ms" if "ms" in v else v.get("error", ""))
          + (f"  ({v['ratio_to_transformers']:.3f}x transformers)" if "ratio_to_transformers" in v else ""))
if "transformers" in q:
    print(f"qwen transformers {q['transformers'].get('ms')} ms")
d = (e or {}).get("deepseek", {})
for name, v in d.get("routes", {}).items():
    print(f"deepseek {name:18s} " + (f"{v['ms']:.2f} ms" if "ms" in v else v.get("error", "")))
if d:
    print(f"deepseek best {d.get('best_route')}: target {d.get('target')} {'met' if d.get('met') else 'NOT met'}; "
          f"hip/torch default {d.get('hip_over_torch_default')} (target <= 1.0)")
    blk = d.get("routes", {}).get("hip_default", {}).get("speed_path", {}).get("vision", {}).get("ops_to_torch", {})
    if blk:
        print(f"hip_default ops_to_torch: " + json.dumps(blk))
for name, ok in (e or {}).get("checks", {}).items():
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
EOF
stage "done (exit $status)"
exit $status
