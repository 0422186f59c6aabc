// Rotate-half RoPE, fp32 math: out = [x1*c1 - x2*s1, x2*c2 + x1*s2] over the two halves of a
// head. The DeepSeek table is blocked and half wide (c2 = c1); Qwen3-VL's is cat(rot, rot), full
// width. Each product and the sum round once (no FMA), exactly as the unfused torch reference.
//
// One work item = P consecutive elements of the first half and the matching P of the second;
// P is the widest access (16, 8, 4 bytes, or one element) that the half and the tables allow:
// DeepSeek's head of 64 moves in 16-byte pieces, Qwen3-VL's head of 72 in 8-byte ones.
#include "common.h"

namespace {

constexpr int kThreads = 256;

// P consecutive elements of x as one access of P * sizeof(raw) bytes (16, 8 or 4) when that
// width exists, else element by element; the caller guarantees alignment.
template <int DT, int P>
__device__ inline void load_x(const typename td::Elem<DT>::raw* p, float* f) {
  typedef td::Elem<DT> E;
  constexpr int bytes = P * (int)sizeof(typename E::raw);
  if constexpr (bytes == 16) {
    E::unpack(*reinterpret_cast<const uint4*>(p), f);
  } else if constexpr (bytes == 8 && DT == TD_BF16) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    E::unpack2(u.x, f);
    E::unpack2(u.y, f + 2);
  } else {
#pragma unroll
    for (int i = 0; i < P; ++i) f[i] = E::get(p[i]);
  }
}
template <int DT, int P>
__device__ inline void store_x(typename td::Elem<DT>::raw* p, const float* f) {
  typedef td::Elem<DT> E;
  constexpr int bytes = P * (int)sizeof(typename E::raw);
  if constexpr (bytes == 16) {
    *reinterpret_cast<uint4*>(p) = E::pack(f);
  } else if constexpr (bytes == 8 && DT == TD_BF16) {
    *reinterpret_cast<uint2*>(p) = make_uint2(E::pack2(f[0], f[1]), E::pack2(f[2], f[3]));
  } else {
#pragma unroll
    for (int i = 0; i < P; ++i) p[i] = E::put(f[i]);
  }
}
template <int P>
__device__ inline void load_table(const float* p, float* f) {
  if constexpr (P % 4 == 0) {
    td::load_f32(p, f, P);
  } else if constexpr (P == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    f[0] = v.x;
    f[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < P; ++i) f[i] = p[i];
  }
}

// I: the index type, 32-bit whenever rows * hd fits (three divisions per item are cheaper so).
template <int DT, int P, typename I>
__global__ void __launch_bounds__(kThreads)
rope_rotate_half(const void* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
                 void* __restrict__ y, I rows, I heads, I n_pos, I hd, I table_w) {
  typedef typename td::Elem<DT>::raw raw;
  const I half = hd / 2, chunks = half / P;
  const I item = (I)blockIdx.x * kThreads + threadIdx.x;
  if (item >= rows * chunks) return;
  const I row = item / chunks, i0 = (item - row * chunks) * P;
  const I pos = (row / heads) % n_pos;
  const raw* xr = static_cast<const raw*>(x) + row * hd;
  raw* yr = static_cast<raw*>(y) + row * hd;
  const float* cr = cos + pos * table_w;
  const float* sr = sin + pos * table_w;
  const I second = table_w == hd ? half : 0;  // where the second half's angles live

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

// Can P-element accesses be used? Every row, both halves and every table row must start on the
// access width (tables are read min(P, 4) floats at a time).
inline bool fits(int p, size_t es, const void* x, const void* y, const float* cos, const float* sin,
                 int64_t half, int64_t table_w) {
  const uintptr_t xa = (uintptr_t)p * es, ta = (uintptr_t)(p < 4 ? p : 4) * 4;
  return half % p == 0 && (reinterpret_cast<uintptr_t>(x) % xa) == 0 && (reinterpret_cast<uintptr_t>(y) % xa) == 0 &&
         table_w % (p < 4 ? p : 4) == 0 && (reinterpret_cast<uintptr_t>(cos) % ta) == 0 &&
         (reinterpret_cast<uintptr_t>(sin) % ta) == 0;
}

template <int DT, typename I>
void launch_p(int p, dim3 grid, const void* x, const float* cos, const float* sin, void* y, I rows, I heads, I n_pos,
              I hd, I table_w, hipStream_t s) {
  const dim3 block(kThreads);
#define TD_ROPE(P) hipLaunchKernelGGL(HIP_KERNEL_NAME(rope_rotate_half<DT, P, I>), grid, block, 0, s, x, cos, sin, y, \
                                      rows, heads, n_pos, hd, table_w)
  if (p == 8) TD_ROPE(8);
  else if (p == 4) TD_ROPE(4);
  else if (p == 2) TD_ROPE(2);
  else TD_ROPE(1);
#undef TD_ROPE
}

template <int DT>
int launch(const void* x, const float* cos, const float* sin, void* y, int64_t rows, int64_t heads,
           int64_t n_pos, int64_t hd, int64_t table_w, int max_access_bytes, hipStream_t s) {
  constexpr int P16 = td::Elem<DT>::kPer16;  // 16 bytes of x: 8 bf16 or 4 fp32
  const int es = (int)sizeof(typename td::Elem<DT>::raw);
  const int64_t half = hd / 2;
  int p = 1;
  for (int c = P16; c > 1; c /= 2)
    if (c * es <= max_access_bytes && fits(c, (size_t)es, x, y, cos, sin, half, table_w)) { p = c; break; }
  const dim3 grid(td::blocks_for(rows * (half / p), kThreads));
  if (rows * hd + kThreads < 0x7fffffff)
    launch_p<DT, int32_t>(p, grid, x, cos, sin, y, (int32_t)rows, (int32_t)heads, (int32_t)n_pos, (int32_t)hd,
                          (int32_t)table_w, s);
  else
    launch_p<DT, int64_t>(p, grid, x, cos, sin, y, rows, heads, n_pos, hd, table_w, s);
  return td::launch_status();
}

}  // namespace

extern "C" int td_rope_rotate_half(const void* x, const float* cos, const float* sin, void* y, int64_t rows,
                                   int64_t heads, int64_t n_pos, int64_t hd, int64_t table_w, int max_access_bytes,
                                   int dtype, void* stream) {
  if (rows < 0 || heads <= 0 || n_pos <= 0 || hd <= 0 || hd % 2 != 0 || (table_w != hd && table_w * 2 != hd))
    return TD_BAD_SHAPE;
  if (rows == 0) return TD_OK;
  if ((rows * (hd / 2) + kThreads - 1) / kThreads > 0x7fffffff) return TD_BAD_SHAPE;
  if (max_access_bytes <= 0) max_access_bytes = 16;
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (dtype) {
    case TD_F32: return launch<TD_F32>(x, cos, sin, y, rows, heads, n_pos, hd, table_w, max_access_bytes, s);
    case TD_BF16: return launch<TD_BF16>(x, cos, sin, y, rows, heads, n_pos, hd, table_w, max_access_bytes, s);
    default: return TD_BAD_DTYPE;
  }
}
