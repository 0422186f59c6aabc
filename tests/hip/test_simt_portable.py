"""tests/hip/simt/portable.h, the CPU stand-in the router's kernel runs on: a fiber per GPU
thread, so a wave's lanes meet only at its barriers. What the router tests lean on is proven here
on a kernel of a few lines: a clean kernel's shuffles, ballots and block barriers give the GPU's
values on warp32 and wave64, and each fault the stand-in exists to catch is reported, not passed
and not hung: lanes of a wave at different shuffles, a shuffle after some lanes returned, a block
barrier some threads never reach, and an exception inside the kernel."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

SIMT = Path(__file__).resolve().parent / "simt" / "portable.h"
CXX = shutil.which("g++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="needs a C++20 host compiler (g++ or clang++)")

# mode 0 clean; 1 half the wave shuffles at another site; 2 the upper lanes return before a
# shuffle; 3 thread 0 skips the block barrier; 4 an exception in one lane
KERNEL = r"""#include "portable.h"
__global__ void probe(int mode, int* out) {
  const int t = threadIdx.x, lane = t % warpSize;
  __shared__ int seen[256];
  int v = t * 10 + (int)blockIdx.x;
  if (mode == 1 && lane < warpSize / 2) v = port_shfl_xor(v, 1, warpSize);  // a site of their own
  else if (mode == 2 && lane >= warpSize / 2) return;
  else if (mode == 4 && t == 5) throw std::runtime_error("planted");
  v = port_shfl_xor(v, 1, warpSize);                                         // the pair's value
  const uint64_t odd = port_ballot(lane % 2);
  seen[t] = v;
  if (!(mode == 3 && t == 0)) __syncthreads();
  out[blockIdx.x * blockDim.x + t] = seen[(t + warpSize) % blockDim.x] + (odd == 0 ? -1 : __builtin_popcountll(odd));
}
extern "C" int run(int mode, int ws, int blocks, int threads, int* out) {
  simt::warp_size = ws;
  hipGetLastError();
  hipLaunchKernelGGL(probe, dim3(blocks), dim3(threads), 0, nullptr, mode, out);
  return hipGetLastError();
}
"""


@pytest.fixture(scope="module")
def lib(module_tmp):
    d = module_tmp("simt-portable")
    shutil.copy(SIMT, d / "portable.h")
    (d / "probe.cpp").write_text(KERNEL)
    r = subprocess.run([CXX, "-std=c++20", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{d}", str(d / "probe.cpp"),
                        "-o", str(d / "libprobe.so")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    so = ctypes.CDLL(str(d / "libprobe.so"))
    so.run.restype = ctypes.c_int
    so.run.argtypes = [ctypes.c_int] * 4 + [ctypes.c_void_p]
    return so


def launch(lib, mode: int, ws: int, blocks: int = 2, threads: int = 128):
    out = np.full(blocks * threads, -7, np.int32)
    return lib.run(mode, ws, blocks, threads, out.ctypes.data), out


@pytest.mark.parametrize("ws", [32, 64])
def test_a_clean_kernel_gives_the_gpus_values(lib, ws):
    status, out = launch(lib, 0, ws)
    assert status == 0
    blocks, threads = 2, 128
    b, t = np.divmod(np.arange(blocks * threads), threads)
    src = (t + ws) % threads               # the thread whose shared slot is read (after the barrier)
    want = (src ^ 1) * 10 + b + ws // 2    # its pair partner's value, plus the ballot's odd lanes
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("mode", [1, 2, 3, 4], ids=["shuffle-at-another-site", "shuffle-after-lanes-returned",
                                                   "barrier-not-reached", "exception"])
@pytest.mark.parametrize("ws", [32, 64])
def test_each_fault_is_reported_not_passed(lib, mode, ws):
    status, _ = launch(lib, mode, ws)
    assert status != 0
    assert launch(lib, 0, ws)[0] == 0  # and the next launch starts clean
