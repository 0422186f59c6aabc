#!/usr/bin/env bash
# The sharded DeepSeek language check, one process per rank under torchrun (bench/multi_gpu_sharded.py):
# the clean check and the three sharded faults, bf16, each run's rank dumps merged and compared
# against the unsharded oracle. OUT/multi_gpu_sharded.json: time per check, peak GPU memory per
# rank, merge + compare time, verdicts and the ranks named.
#
#   bash bench/multi_gpu_sharded.sh OUT                               # one GPU: 2 ranks on it, tiny config
#   NPROC=8 CONFIG=full LAYERS=2 bash bench/multi_gpu_sharded.sh OUT   # 8 GPUs, real dims, layer 2
#   DEVICE=cpu DTYPE=float32 bash bench/multi_gpu_sharded.sh OUT        # gloo on the CPU (what CI runs)
#
# NVLink multicast stays off in this process and every process torchrun starts.
set -u -o pipefail
out="${1:?usage: bench/multi_gpu_sharded.sh OUT}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TENSORDIFF_CACHE="${TENSORDIFF_CACHE:-/tmp/tensordiff-cache}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1 || true
args=(--out "$out" --nproc "${NPROC:-2}" --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}"
      --config "${CONFIG:-tiny}" --numerics "${NUMERICS:-official}" --backend "${DIST_BACKEND:-auto}"
      --timeout "${TIMEOUT:-300}" --faults "${FAULTS:-all}")
[ -n "${LAYERS:-}" ] && args+=(--layers "$LAYERS")
timeout "${TOTAL_TIMEOUT:-470}" "${PYTHON:-python3}" bench/multi_gpu_sharded.py "${args[@]}" 2>&1 | tee "$out/log.txt"
echo "exit ${PIPESTATUS[0]}" | tee -a "$out/log.txt"
