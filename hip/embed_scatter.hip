// Embedding scatter for image spans: emb[rows[i]] = src[i], converted to emb's dtype, for every
// rows[i] in [0, n_emb) (-1 marks a source row with no place). This overlays the aligner rows
// and the START / NEWLINE / END vectors onto a chunk's embedding rows in one launch, in place.
//
// One block per source row; same-dtype rows move as 16-byte vectors when aligned.
#include "common.h"

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
scatter_copy16(uint4* __restrict__ emb, const int64_t* __restrict__ rows, const uint4* __restrict__ src,
               int64_t vecs_per_row, int64_t n_emb) {
  const int64_t i = blockIdx.x, dst = rows[i];
  if (dst < 0 || dst >= n_emb) return;
  const uint4* from = src + i * vecs_per_row;
  uint4* to = emb + dst * vecs_per_row;
  // Up to kUnroll loads in flight per thread before the first store (a 5120-wide bf16 row is
  // 640 vectors: 2.5 per thread).
  constexpr int kUnroll = 4;
  for (int64_t v0 = threadIdx.x; v0 < vecs_per_row; v0 += kThreads * kUnroll) {
    uint4 buf[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * kThreads;
      if (v < vecs_per_row) buf[u] = from[v];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * kThreads;
      if (v < vecs_per_row) to[v] = buf[u];
    }
  }
}

template <int ED, int SD>
__global__ void __launch_bounds__(kThreads)
scatter_convert(void* __restrict__ emb, const int64_t* __restrict__ rows, const void* __restrict__ src, int64_t d,
                int64_t n_emb) {
  typedef td::Elem<ED> EE;
  typedef td::Elem<SD> SE;
  const int64_t i = blockIdx.x, dst = rows[i];
  if (dst < 0 || dst >= n_emb) return;
  const typename SE::raw* from = static_cast<const typename SE::raw*>(src) + i * d;
  typename EE::raw* to = static_cast<typename EE::raw*>(emb) + dst * d;
  for (int64_t c = threadIdx.x; c < d; c += kThreads) to[c] = EE::put(SE::get(from[c]));
}

size_t elem_size(int dt) { return dt == TD_F32 ? 4 : 2; }

}  // namespace

extern "C" int td_embed_scatter(void* emb, const int64_t* rows, const void* src, int64_t m, int64_t d,
                                int64_t n_emb, int emb_dtype, int src_dtype, void* stream) {
  if (m < 0 || d <= 0 || n_emb < 0 || m > 0x7fffffff) return TD_BAD_SHAPE;
  if ((emb_dtype != TD_F32 && emb_dtype != TD_BF16) || (src_dtype != TD_F32 && src_dtype != TD_BF16)) return TD_BAD_DTYPE;
  if (m == 0) return TD_OK;
  hipStream_t s = static_cast<hipStream_t>(stream);
  const dim3 grid((unsigned int)m), block(kThreads);
  const int64_t row_bytes = d * (int64_t)elem_size(emb_dtype);
  if (emb_dtype == src_dtype && row_bytes % 16 == 0 && td::aligned16(emb) && td::aligned16(src)) {
    hipLaunchKernelGGL(scatter_copy16, grid, block, 0, s, static_cast<uint4*>(emb), rows,
                       static_cast<const uint4*>(src), row_bytes / 16, n_emb);
  } else if (emb_dtype == TD_F32 && src_dtype == TD_F32) {
    hipLaunchKernelGGL(HIP_KERNEL_NAME(scatter_convert<TD_F32, TD_F32>), grid, block, 0, s, emb, rows, src, d, n_emb);
  } else if (emb_dtype == TD_F32) {
    hipLaunchKernelGGL(HIP_KERNEL_NAME(scatter_convert<TD_F32, TD_BF16>), grid, block, 0, s, emb, rows, src, d, n_emb);
  } else if (src_dtype == TD_F32) {
    hipLaunchKernelGGL(HIP_KERNEL_NAME(scatter_convert<TD_BF16, TD_F32>), grid, block, 0, s, emb, rows, src, d, n_emb);
  } else {
    hipLaunchKernelGGL(HIP_KERNEL_NAME(scatter_convert<TD_BF16, TD_BF16>), grid, block, 0, s, emb, rows, src, d, n_emb);
  }
  return td::launch_status();
}
