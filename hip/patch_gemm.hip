// Patch projection: y = x . w^T + bias with x [m, k], w [n, k] (both k-contiguous), fp32
// accumulation, bf16 or fp32 operands and output.
//
// A plain shared-memory tiled kernel (64 x 64 outputs per block of 256 threads, 4 x 4 per
// thread, k in slabs of 16). The k loop has no bounds check: k must be a multiple of 16, which
// is why the 588-column patch rows and the projection weight are zero-padded to 592 at backend
// preparation. Rows and columns (m, n) may be any size.
#include "common.h"

namespace {

constexpr int kThreads = 256;
constexpr int BM = 64, BN = 64, BK = 16, PAD = 4;

template <int DT>
__global__ void __launch_bounds__(kThreads)
patch_gemm(const void* __restrict__ x, const void* __restrict__ w, const float* __restrict__ bias,
           void* __restrict__ y, int64_t m, int64_t n, int64_t k) {
  typedef td::Elem<DT> E;
  typedef typename E::raw raw;
  __shared__ __attribute__((aligned(16))) float As[BK][BM + PAD];
  __shared__ __attribute__((aligned(16))) float Bs[BK][BN + PAD];
  const raw* xa = static_cast<const raw*>(x);
  const raw* wb = static_cast<const raw*>(w);
  const int tid = threadIdx.x;
  const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
  // Loading: thread -> one tile row, 4 consecutive k.
  const int lr = tid / 4, lk = (tid % 4) * 4;
  // Computing: thread -> 4 x 4 outputs.
  const int tx = tid % 16, ty = tid / 16;

  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

  const bool a_in = m0 + lr < m, b_in = n0 + lr < n;
  const raw* ap = xa + (m0 + lr) * k + lk;
  const raw* bp = wb + (n0 + lr) * k + lk;
  for (int64_t k0 = 0; k0 < k; k0 += BK) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      As[lk + q][lr] = a_in ? E::get(ap[k0 + q]) : 0.f;
      Bs[lk + q][lr] = b_in ? E::get(bp[k0 + q]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      const float4 a4 = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
      const float4 b4 = *reinterpret_cast<const float4*>(&Bs[kk][tx * 4]);
      const float a[4] = {a4.x, a4.y, a4.z, a4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }

  raw* yo = static_cast<raw*>(y);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = m0 + ty * 4 + i;
    if (r >= m) break;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = n0 + tx * 4 + j;
      if (c < n) yo[r * n + c] = E::put(bias ? acc[i][j] + bias[c] : acc[i][j]);
    }
  }
}

}  // namespace

extern "C" int td_patch_gemm(const void* x, const void* w, const float* bias, void* y, int64_t m, int64_t n,
                             int64_t k, int dtype, void* stream) {
  if (m < 0 || n <= 0 || k <= 0) return TD_BAD_SHAPE;
  if (k % BK != 0) return TD_K_NOT_ALIGNED;
  if (m == 0) return TD_OK;
  if ((m + BM - 1) / BM > 65535) return TD_BAD_SHAPE;
  hipStream_t s = static_cast<hipStream_t>(stream);
  const dim3 grid(td::blocks_for(n, BN), td::blocks_for(m, BM)), block(kThreads);
  switch (dtype) {
    case TD_F32: hipLaunchKernelGGL(HIP_KERNEL_NAME(patch_gemm<TD_F32>), grid, block, 0, s, x, w, bias, y, m, n, k); break;
    case TD_BF16: hipLaunchKernelGGL(HIP_KERNEL_NAME(patch_gemm<TD_BF16>), grid, block, 0, s, x, w, bias, y, m, n, k); break;
    default: return TD_BAD_DTYPE;
  }
  return td::launch_status();
}
