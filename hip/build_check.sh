#!/usr/bin/env bash
# Compile every kernel family with both compilers, warnings as errors; no GPU needed.
#
#   hip/build_check.sh [hipcc|nvcc|all] [FILE.hip ...]
#
# hipcc: Debian's hipcc, AMD platform, for gfx90a (MI200, wave64) and gfx940 (MI300, wave64);
# nvcc: sm_90 (H100/H200). Without FILEs it builds every hip/*.hip. Exit status 0 only if every
# compile succeeded; a missing compiler is a failure (CI must prove both builds).
# HIPCC, NVCC, HIP_ARCHS, NVCC_ARCH and JOBS override the defaults.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
which="${1:-all}"
[ $# -gt 0 ] && shift
case "$which" in hipcc|nvcc|all) ;; *) echo "usage: $0 [hipcc|nvcc|all] [FILE.hip ...]" >&2; exit 2 ;; esac
if [ $# -gt 0 ]; then files=("$@"); else files=("$here"/*.hip); fi

HIPCC="${HIPCC:-hipcc}"
NVCC="${NVCC:-nvcc}"
HIP_ARCHS="${HIP_ARCHS:-gfx90a gfx940}"
NVCC_ARCH="${NVCC_ARCH:-sm_90}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# hipcc's offload bundler leaves one empty /tmp/<kernel>-XXXXXX directory per compile: keep its
# scratch inside ours, which goes on exit.
export TMPDIR="$out"

hip_cmd() {  # $1 source, $2 object, $3 the one offload arch of this job, $4 "device" for its device pass only
  # The host pass is the same code whatever the offload arch: the first arch's job compiles it
  # (with that arch's device pass), every later arch's job only its own device pass.
  local only=(); [ "${4:-}" = device ] && only=(--offload-device-only)
  HIP_PLATFORM=amd "$HIPCC" -x hip --offload-arch="$3" "${only[@]}" -std=c++17 -O3 -fPIC -Wall -Werror -I"$here" -c "$1" -o "$2"
}
nvcc_cmd() {
  "$NVCC" -x cu -arch="$NVCC_ARCH" -std=c++17 -O3 -Werror all-warnings -Xcompiler -fPIC,-Wall,-Werror -I"$here" -c "$1" -o "$2"
}

compilers=()
[ "$which" = hipcc ] || [ "$which" = all ] && compilers+=(hip)
[ "$which" = nvcc ] || [ "$which" = all ] && compilers+=(nvcc)

status=0
for c in "${compilers[@]}"; do
  exe="$HIPCC"; [ "$c" = nvcc ] && exe="$NVCC"
  if ! command -v "$exe" >/dev/null 2>&1; then
    echo "FAIL $c: compiler '$exe' not found (apt-get install -y hipcc / the CUDA toolkit)"
    status=1
    continue
  fi
done
[ $status -ne 0 ] && exit $status

# Run the compiles JOBS at a time, the biggest sources first (a long compile started last would
# run alone at the end), then report each one in the order of the arguments. hipcc compiles one
# offload arch a job: the router's route templates take minutes a device pass, and two archs in
# one invocation run their device passes one after the other.
names=(); jobs_=()
i=0
for c in "${compilers[@]}"; do
  targets=("$NVCC_ARCH"); [ "$c" = hip ] && read -r -a targets <<<"$HIP_ARCHS"
  for f in "${files[@]}"; do
    part=full
    for t in "${targets[@]}"; do
      names+=("$c $t $(basename "$f")")
      jobs_+=("$(wc -c <"$f" 2>/dev/null || echo 0) $i $c $t $part $f")
      part=device
      i=$((i + 1))
    done
  done
done
while read -r _ j c t part f; do
  ( "${c}_cmd" "$f" "$out/$j.o" "$t" "$part" >"$out/$j.log" 2>&1; echo $? >"$out/$j.rc" ) &
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 0.1; done
done < <(printf '%s\n' "${jobs_[@]}" | sort -k1,1nr -k2,2n)
wait
for j in "${!names[@]}"; do
  rc="$(cat "$out/$j.rc" 2>/dev/null || echo 1)"
  if [ "$rc" = 0 ]; then
    echo "ok   ${names[$j]}"
  else
    echo "FAIL ${names[$j]}"
    sed 's/^/     /' "$out/$j.log"
    status=1
  fi
done
exit $status
