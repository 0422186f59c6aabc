// Dual-bias MoE router. Per row: s = sqrt(softplus(logit)) in fp32; the row's bias is bias_vl
// when it is an image row (text and image rows interleave in one launch), else bias; the top-k
// ids are ranked by s + bias; their weights come from the UNBIASED s, normalised
// (sum + 1e-20) and multiplied by route_scale.
//
// One row per block of 64 threads (one wave64, or two warp32s joined through shared memory);
// each thread holds PT experts in registers and top-k is k rounds of a block-wide argmax
// (ties to the lower expert id). Planted fault `router-text-bias-for-images`: image rows are
// ranked with the text bias, the kind of one-character kernel bug the comparator must catch.
#include "common.h"

namespace {

constexpr int kThreads = 64;
constexpr int kMaxTopK = 8;

__device__ inline bool better(float key_a, int id_a, float key_b, int id_b) {
  return key_a > key_b || (key_a == key_b && id_a < id_b);
}

// Block-wide argmax of (key, id), carrying s along; every thread gets the winner.
__device__ inline void block_argmax(float& key, int& id, float& s, float* sk, int* si, float* ss) {
  const int ws = warpSize;
  const int width = ws < kThreads ? ws : kThreads;
  for (int o = width / 2; o > 0; o >>= 1) {
    const float ok = port_shfl_xor(key, o, width);
    const int oi = port_shfl_xor(id, o, width);
    const float os = port_shfl_xor(s, o, width);
    if (better(ok, oi, key, id)) { key = ok; id = oi; s = os; }
  }
  const int n_warps = kThreads / width;  // 1 on wave64, 2 on warp32: uniform over the block
  if (n_warps > 1) {
    const int lane = threadIdx.x % width, warp = threadIdx.x / width;
    if (lane == 0) { sk[warp] = key; si[warp] = id; ss[warp] = s; }
    __syncthreads();
    key = sk[0]; id = si[0]; s = ss[0];
    for (int w = 1; w < n_warps; ++w)
      if (better(sk[w], si[w], key, id)) { key = sk[w]; id = si[w]; s = ss[w]; }
    __syncthreads();
  }
}

template <int DT, int PT>
__global__ void __launch_bounds__(kThreads)
moe_route(const void* __restrict__ logits, const float* __restrict__ bias, const float* __restrict__ bias_vl,
          const uint8_t* __restrict__ image_rows, float* __restrict__ weights, int64_t* __restrict__ ids,
          int64_t experts, int topk, float route_scale, int fault_text_bias_for_images) {
  typedef td::Elem<DT> E;
  __shared__ float sk[PORT_MAX_WARPS_PER_BLOCK];
  __shared__ int si[PORT_MAX_WARPS_PER_BLOCK];
  __shared__ float ss[PORT_MAX_WARPS_PER_BLOCK];
  const int64_t row = blockIdx.x;
  const bool image = image_rows != nullptr && bias_vl != nullptr && image_rows[row] != 0;
  const float* b = (image && !fault_text_bias_for_images) ? bias_vl : bias;
  const typename E::raw* lr = static_cast<const typename E::raw*>(logits) + row * experts;

  float s[PT], key[PT];
  unsigned int taken = 0;  // bit p: expert threadIdx.x + p*kThreads already chosen
#pragma unroll
  for (int p = 0; p < PT; ++p) {
    const int e = threadIdx.x + p * kThreads;
    if (e < experts) {
      const float l = E::get(lr[e]);
      // torch's softplus (beta 1, threshold 20)
      s[p] = sqrtf(l > 20.f ? l : log1pf(expf(l)));
      key[p] = s[p] + b[e];
    } else {
      s[p] = 0.f;
      key[p] = -INFINITY;
      taken |= 1u << p;
    }
  }

  float w_sel[kMaxTopK];
  int id_sel[kMaxTopK];
  float sum = 0.f;
#pragma unroll
  for (int r = 0; r < kMaxTopK; ++r) {
    w_sel[r] = 0.f;
    id_sel[r] = 0;
    if (r < topk) {  // uniform over the block
      float bk = -INFINITY, bs = 0.f;
      int bi = 0x7fffffff;
#pragma unroll
      for (int p = 0; p < PT; ++p) {
        const int e = threadIdx.x + p * kThreads;
        if (!(taken & (1u << p)) && better(key[p], e, bk, bi)) { bk = key[p]; bi = e; bs = s[p]; }
      }
      block_argmax(bk, bi, bs, sk, si, ss);
#pragma unroll
      for (int p = 0; p < PT; ++p)
        if (threadIdx.x + p * kThreads == bi) taken |= 1u << p;
      w_sel[r] = bs;
      id_sel[r] = bi;
      sum += bs;
    }
  }
  if (threadIdx.x == 0) {
#pragma unroll
    for (int r = 0; r < kMaxTopK; ++r) {
      if (r < topk) {
        weights[row * topk + r] = w_sel[r] / (sum + 1e-20f) * route_scale;
        ids[row * topk + r] = id_sel[r];
      }
    }
  }
}

template <int DT>
int launch(const void* logits, const float* bias, const float* bias_vl, const uint8_t* image_rows, float* weights,
           int64_t* ids, int64_t rows, int64_t experts, int topk, float route_scale, int fault, hipStream_t s) {
  const dim3 grid((unsigned int)rows), block(kThreads);
  const int64_t pt = (experts + kThreads - 1) / kThreads;
#define TD_ROUTE(PT) hipLaunchKernelGGL(HIP_KERNEL_NAME(moe_route<DT, PT>), grid, block, 0, s, logits, bias, bias_vl, \
                                        image_rows, weights, ids, experts, topk, route_scale, fault)
  if (pt <= 1) TD_ROUTE(1);
  else if (pt <= 2) TD_ROUTE(2);
  else if (pt <= 4) TD_ROUTE(4);
  else if (pt <= 8) TD_ROUTE(8);
  else TD_ROUTE(16);
#undef TD_ROUTE
  return td::launch_status();
}

}  // namespace

extern "C" int td_moe_route(const void* logits, const float* bias, const float* bias_vl, const uint8_t* image_rows,
                            float* weights, int64_t* ids, int64_t rows, int64_t experts, int topk, float route_scale,
                            int dtype, int fault_text_bias_for_images, void* stream) {
  if (rows < 0 || experts <= 0 || rows > 0x7fffffff) return TD_BAD_SHAPE;
  if (experts > 16 * kThreads) return TD_TOO_MANY_EXPERTS;
  if (topk < 1 || topk > kMaxTopK || topk > experts) return TD_TOPK_TOO_LARGE;
  if (rows == 0) return TD_OK;
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (dtype) {
    case TD_F32: return launch<TD_F32>(logits, bias, bias_vl, image_rows, weights, ids, rows, experts, topk, route_scale,
                                       fault_text_bias_for_images, s);
    case TD_BF16: return launch<TD_BF16>(logits, bias, bias_vl, image_rows, weights, ids, rows, experts, topk,
                                         route_scale, fault_text_bias_for_images, s);
    default: return TD_BAD_DTYPE;
  }
}
