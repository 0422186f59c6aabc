// RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w, fp32 accumulation, bf16 or fp32 in and out.
//
// One block per row. Fast path: the row is read once into registers as 16-byte vectors (NV of
// them per thread), reduced, scaled and written; a row that does not split into aligned
// 16-byte vectors, or is longer than 8 vectors per thread, takes the scalar path, which reads
// the row twice (the second read hits the cache).
#include "common.h"

namespace {

constexpr int kThreads = 128;  // a multiple of 64: whole wavefronts on wave64 and warp32

template <int DT, int NV>
__global__ void __launch_bounds__(kThreads)
rms_norm_vec(const void* __restrict__ x, const float* __restrict__ w, void* __restrict__ y,
             int64_t d, float eps) {
  typedef typename td::Elem<DT>::raw raw;
  constexpr int P = td::Elem<DT>::kPer16;
  __shared__ float scratch[PORT_MAX_WARPS_PER_BLOCK];
  const int64_t row = blockIdx.x;
  const raw* xr = static_cast<const raw*>(x) + row * d;
  raw* yr = static_cast<raw*>(y) + row * d;
  const int n_vec = (int)(d / P);

  float v[NV][P];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int vi = threadIdx.x + j * kThreads;
    if (vi < n_vec) {
      td::load16<DT>(xr + (int64_t)vi * P, v[j]);
#pragma unroll
      for (int p = 0; p < P; ++p) ss += v[j][p] * v[j][p];
    }
  }
  const float total = td::block_sum(ss, scratch);
  const float r = rsqrtf(total / (float)d + eps);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int vi = threadIdx.x + j * kThreads;
    if (vi < n_vec) {
      float wv[P];
      td::load_f32(w + (int64_t)vi * P, wv, P);
      float o[P];
#pragma unroll
      for (int p = 0; p < P; ++p) o[p] = (v[j][p] * r) * wv[p];
      td::store16<DT>(yr + (int64_t)vi * P, o);
    }
  }
}

template <int DT>
__global__ void __launch_bounds__(kThreads)
rms_norm_any(const void* __restrict__ x, const float* __restrict__ w, void* __restrict__ y,
             int64_t d, float eps) {
  typedef td::Elem<DT> E;
  __shared__ float scratch[PORT_MAX_WARPS_PER_BLOCK];
  const int64_t row = blockIdx.x;
  const typename E::raw* xr = static_cast<const typename E::raw*>(x) + row * d;
  typename E::raw* yr = static_cast<typename E::raw*>(y) + row * d;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    const float f = E::get(xr[i]);
    ss += f * f;
  }
  const float total = td::block_sum(ss, scratch);
  const float r = rsqrtf(total / (float)d + eps);
  for (int64_t i = threadIdx.x; i < d; i += kThreads) yr[i] = E::put((E::get(xr[i]) * r) * w[i]);
}

template <int DT>
int launch(const void* x, const float* w, void* y, int64_t rows, int64_t d, float eps, hipStream_t s) {
  constexpr int P = td::Elem<DT>::kPer16;
  const bool vec = d % P == 0 && td::aligned16(x) && td::aligned16(y) && td::aligned16(w);
  const int64_t per_thread = (d / P + kThreads - 1) / kThreads;
  const dim3 grid((unsigned int)rows), block(kThreads);
  if (vec && per_thread <= 1) hipLaunchKernelGGL(HIP_KERNEL_NAME(rms_norm_vec<DT, 1>), grid, block, 0, s, x, w, y, d, eps);
  else if (vec && per_thread <= 2) hipLaunchKernelGGL(HIP_KERNEL_NAME(rms_norm_vec<DT, 2>), grid, block, 0, s, x, w, y, d, eps);
  else if (vec && per_thread <= 4) hipLaunchKernelGGL(HIP_KERNEL_NAME(rms_norm_vec<DT, 4>), grid, block, 0, s, x, w, y, d, eps);
  else if (vec && per_thread <= 8) hipLaunchKernelGGL(HIP_KERNEL_NAME(rms_norm_vec<DT, 8>), grid, block, 0, s, x, w, y, d, eps);
  else hipLaunchKernelGGL(HIP_KERNEL_NAME(rms_norm_any<DT>), grid, block, 0, s, x, w, y, d, eps);
  return td::launch_status();
}

}  // namespace

extern "C" int td_rms_norm(const void* x, const float* w, void* y, int64_t rows, int64_t d, float eps,
                           int dtype, void* stream) {
  if (rows < 0 || d <= 0 || rows > 0x7fffffff) return TD_BAD_SHAPE;
  if (rows == 0) return TD_OK;
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (dtype) {
    case TD_F32: return launch<TD_F32>(x, w, y, rows, d, eps, s);
    case TD_BF16: return launch<TD_BF16>(x, w, y, rows, d, eps, s);
    default: return TD_BAD_DTYPE;
  }
}
