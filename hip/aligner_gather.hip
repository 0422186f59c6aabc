// Aligner grid assembly on the device: y[t, c*9 + j] = x[index[t, j], c], zero where
// index[t, j] < 0 (the right/bottom padding of the grid to multiples of 3).
//
// A pure copy, so the element type is only a width (2 or 4 bytes). One block per (token, slab of
// kSlab channels): the 9 source rows of the slab are read coalesced and written into a shared
// tile laid out exactly as the output span (channel-major, slab * 9 contiguous elements), which
// then goes out as a straight copy, 16 bytes per thread when the span is aligned. (Transposing
// on the way out instead put a warp's 16-byte gathers into one bank: 26% of the copy roofline.)
#include "common.h"

namespace {

constexpr int kThreads = 256;
constexpr int kSlab = 1024;  // channels per block: a whole 1024-wide token, 36 loads in flight per thread

template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads)
aligner_gather(const T* __restrict__ x, const int32_t* __restrict__ index, T* __restrict__ y, int64_t c,
               int64_t n_src) {
  __shared__ __attribute__((aligned(16))) T tile[kSlab * 9];
  const int64_t t = blockIdx.y;
  const int64_t c0 = (int64_t)blockIdx.x * kSlab;
  const int cn = (int)(c - c0 < kSlab ? c - c0 : kSlab);
  // Issue every load of the slab before the first shared store: 9 rows x kPerThread channels in
  // flight per thread (a load feeding a store at once would leave one in flight).
  constexpr int kPerThread = kSlab / kThreads;
  T v[9][kPerThread];
#pragma unroll
  for (int j = 0; j < 9; ++j) {
    const int32_t src = index[t * 9 + j];
    const bool real = src >= 0 && src < n_src;  // out of range is an engine bug: read nothing
    const T* row = x + (real ? (int64_t)src * c + c0 : 0);
#pragma unroll
    for (int q = 0; q < kPerThread; ++q) {
      const int i = threadIdx.x + q * kThreads;
      v[j][q] = real && i < cn ? row[i] : (T)0;
    }
  }
#pragma unroll
  for (int j = 0; j < 9; ++j)
#pragma unroll
    for (int q = 0; q < kPerThread; ++q) {
      const int i = threadIdx.x + q * kThreads;
      if (i < cn) tile[i * 9 + j] = v[j][q];
    }
  __syncthreads();

  T* out = y + t * c * 9 + c0 * 9;
  const int n_out = cn * 9;
  if constexpr (VEC) {
    const uint4* from = reinterpret_cast<const uint4*>(tile);
    uint4* to = reinterpret_cast<uint4*>(out);
    const int n_vec = n_out * (int)sizeof(T) / 16;
    for (int v = threadIdx.x; v < n_vec; v += kThreads) to[v] = from[v];
  } else {
    for (int e = threadIdx.x; e < n_out; e += kThreads) out[e] = tile[e];
  }
}

template <typename T>
int launch(const void* x, const int32_t* index, void* y, int64_t t, int64_t c, int64_t n_src, hipStream_t s) {
  constexpr int W = 16 / sizeof(T);
  // Every block's output span starts at (t*c + c0) * 9 elements and is a multiple of W long
  // when c is a multiple of W (kSlab is).
  const bool vec = c % W == 0 && td::aligned16(y);
  const dim3 grid(td::blocks_for(c, kSlab), (unsigned int)t), block(kThreads);
  const T* xs = static_cast<const T*>(x);
  T* ys = static_cast<T*>(y);
  if (vec) hipLaunchKernelGGL(HIP_KERNEL_NAME(aligner_gather<T, true>), grid, block, 0, s, xs, index, ys, c, n_src);
  else hipLaunchKernelGGL(HIP_KERNEL_NAME(aligner_gather<T, false>), grid, block, 0, s, xs, index, ys, c, n_src);
  return td::launch_status();
}

}  // namespace

extern "C" int td_aligner_gather(const void* x, const int32_t* index, void* y, int64_t t, int64_t c,
                                 int64_t n_src, int elem_bytes, void* stream) {
  if (t < 0 || c <= 0 || n_src < 0 || t > 65535) return TD_BAD_SHAPE;
  if (t == 0) return TD_OK;
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (elem_bytes) {
    case 2: return launch<uint16_t>(x, index, y, t, c, n_src, s);
    case 4: return launch<uint32_t>(x, index, y, t, c, n_src, s);
    default: return TD_BAD_DTYPE;
  }
}
