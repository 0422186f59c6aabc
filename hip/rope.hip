// Rotate-half RoPE, fp32 math: out = [x1*c1 - x2*s1, x2*c2 + x1*s2] over the two halves of a
// head. The DeepSeek table is blocked and half wide (c2 = c1); Qwen3-VL's is cat(rot, rot), full
// width. Each product and the sum round once (no FMA), exactly as the unfused torch reference.
//
// One work item = P consecutive elements of the first half and the matching P of the second;
// P = 16 bytes of x when the half splits into aligned vectors, else 1.
#include "common.h"

namespace {

constexpr int kThreads = 256;

template <int DT, int P>
__device__ inline void load_x(const typename td::Elem<DT>::raw* p, float* f) {
  if constexpr (P == td::Elem<DT>::kPer16) td::load16<DT>(p, f);
  else {
#pragma unroll
    for (int i = 0; i < P; ++i) f[i] = td::Elem<DT>::get(p[i]);
  }
}
template <int DT, int P>
__device__ inline void store_x(typename td::Elem<DT>::raw* p, const float* f) {
  if constexpr (P == td::Elem<DT>::kPer16) td::store16<DT>(p, f);
  else {
#pragma unroll
    for (int i = 0; i < P; ++i) p[i] = td::Elem<DT>::put(f[i]);
  }
}
template <int P>
__device__ inline void load_table(const float* p, float* f) {
  if constexpr (P % 4 == 0) td::load_f32(p, f, P);
  else {
#pragma unroll
    for (int i = 0; i < P; ++i) f[i] = p[i];
  }
}

template <int DT, int P>
__global__ void __launch_bounds__(kThreads)
rope_rotate_half(const void* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
                 void* __restrict__ y, int64_t rows, int64_t heads, int64_t n_pos, int64_t hd,
                 int64_t table_w) {
  typedef typename td::Elem<DT>::raw raw;
  const int64_t half = hd / 2, chunks = half / P;
  const int64_t item = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (item >= rows * chunks) return;
  const int64_t row = item / chunks, i0 = (item - row * chunks) * P;
  const int64_t pos = (row / heads) % n_pos;
  const raw* xr = static_cast<const raw*>(x) + row * hd;
  raw* yr = static_cast<raw*>(y) + row * hd;
  const float* cr = cos + pos * table_w;
  const float* sr = sin + pos * table_w;
  const int64_t second = table_w == hd ? half : 0;  // where the second half's angles live

  float x1[P], x2[P], c1[P], s1[P], c2[P], s2[P], o1[P], o2[P];
  load_x<DT, P>(xr + i0, x1);
  load_x<DT, P>(xr + half + i0, x2);
  load_table<P>(cr + i0, c1);
  load_table<P>(sr + i0, s1);
  load_table<P>(cr + second + i0, c2);
  load_table<P>(sr + second + i0, s2);
#pragma unroll
  for (int p = 0; p < P; ++p) {
    o1[p] = port_add_rn(port_mul_rn(x1[p], c1[p]), port_mul_rn(-x2[p], s1[p]));
    o2[p] = port_add_rn(port_mul_rn(x2[p], c2[p]), port_mul_rn(x1[p], s2[p]));
  }
  store_x<DT, P>(yr + i0, o1);
  store_x<DT, P>(yr + half + i0, o2);
}

template <int DT>
int launch(const void* x, const float* cos, const float* sin, void* y, int64_t rows, int64_t heads,
           int64_t n_pos, int64_t hd, int64_t table_w, hipStream_t s) {
  constexpr int P = td::Elem<DT>::kPer16;
  const int64_t half = hd / 2;
  // 16-byte vectors need every row, both halves and every table row to start aligned.
  const size_t es = sizeof(typename td::Elem<DT>::raw);
  const bool vec = half % P == 0 && (half * es) % 16 == 0 && table_w % 4 == 0 && td::aligned16(x) &&
                   td::aligned16(y) && td::aligned16(cos) && td::aligned16(sin) && P % 4 == 0;
  const int p = vec ? P : 1;
  const dim3 grid(td::blocks_for(rows * (half / p), kThreads)), block(kThreads);
  if (vec) hipLaunchKernelGGL(HIP_KERNEL_NAME(rope_rotate_half<DT, P>), grid, block, 0, s, x, cos, sin, y, rows, heads, n_pos, hd, table_w);
  else hipLaunchKernelGGL(HIP_KERNEL_NAME(rope_rotate_half<DT, 1>), grid, block, 0, s, x, cos, sin, y, rows, heads, n_pos, hd, table_w);
  return td::launch_status();
}

}  // namespace

extern "C" int td_rope_rotate_half(const void* x, const float* cos, const float* sin, void* y, int64_t rows,
                                   int64_t heads, int64_t n_pos, int64_t hd, int64_t table_w, int dtype,
                                   void* stream) {
  if (rows < 0 || heads <= 0 || n_pos <= 0 || hd <= 0 || hd % 2 != 0 || (table_w != hd && table_w * 2 != hd))
    return TD_BAD_SHAPE;
  if (rows == 0) return TD_OK;
  if ((rows * (hd / 2) + kThreads - 1) / kThreads > 0x7fffffff) return TD_BAD_SHAPE;
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (dtype) {
    case TD_F32: return launch<TD_F32>(x, cos, sin, y, rows, heads, n_pos, hd, table_w, s);
    case TD_BF16: return launch<TD_BF16>(x, cos, sin, y, rows, heads, n_pos, hd, table_w, s);
    default: return TD_BAD_DTYPE;
  }
}
