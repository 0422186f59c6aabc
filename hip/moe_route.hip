// Dual-bias MoE router. Per row: s = sqrt(softplus(logit)) in fp32; the row's bias is bias_vl
// when it is an image row (text and image rows interleave in one launch), else bias; the top-k
// ids are ranked by s + bias; their weights come from the UNBIASED s, normalised
// (sum + 1e-20) and multiplied by route_scale.
//
// One row per block of 64, 128 or 256 threads (whole wave64s or pairs of warp32s), each thread
// holding up to PT experts in registers; top-k is k rounds of a block-wide maximum over packed
// (key, id) values (ties to the lower expert id). Planted fault `router-text-bias-for-images`: image rows are
// ranked with the text bias, the kind of one-character kernel bug the comparator must catch.
#include "common.h"

namespace {

constexpr int kMaxTopK = 8;

// (key, id) as one orderable 64-bit value: the float key's bits made monotonic in the high word,
// the id inverted in the low word, so the maximum is the best key and, among equal keys, the
// lower id. 0 is below every packed value ("nothing left").
__device__ inline unsigned long long pack(float key, int id) {
  const uint32_t u = __float_as_uint(key);
  const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)ord << 32) | (unsigned long long)(0x7fffffffu - (uint32_t)id);
}
__device__ inline int unpack_id(unsigned long long v) {
  return (int)(0x7fffffffu - (uint32_t)v);  // the low word
}

// Maximum over the TPR threads of the block; every thread gets it. Shuffles inside each wave
// (width min(warpSize, TPR)), then the waves' results through shared memory.
template <int TPR>
__device__ inline unsigned long long block_max(unsigned long long v, unsigned long long* part) {
  const int ws = warpSize;
  const int width = ws < TPR ? ws : TPR;
  for (int o = width / 2; o > 0; o >>= 1) {
    const unsigned long long other = port_shfl_xor(v, o, width);
    v = other > v ? other : v;
  }
  const int n_waves = TPR / width;  // uniform over the block
  if (n_waves > 1) {
    if (threadIdx.x % width == 0) part[threadIdx.x / width] = v;
    __syncthreads();
    v = part[0];
    for (int w = 1; w < n_waves; ++w) v = part[w] > v ? part[w] : v;
    __syncthreads();
  }
  return v;
}

// One row per block of TPR threads; thread t holds experts t, t + TPR, ... (PT of them).
template <int DT, int TPR, int PT>
__global__ void __launch_bounds__(TPR)
moe_route(const void* __restrict__ logits, const float* __restrict__ bias, const float* __restrict__ bias_vl,
          const uint8_t* __restrict__ image_rows, float* __restrict__ weights, int64_t* __restrict__ ids,
          int64_t experts, int topk, float route_scale, int fault_text_bias_for_images) {
  typedef td::Elem<DT> E;
  __shared__ unsigned long long part[PORT_MAX_WARPS_PER_BLOCK];
  __shared__ float chosen_s[kMaxTopK];
  const int64_t row = blockIdx.x;
  const bool image = image_rows != nullptr && bias_vl != nullptr && image_rows[row] != 0;
  const float* b = (image && !fault_text_bias_for_images) ? bias_vl : bias;
  const typename E::raw* lr = static_cast<const typename E::raw*>(logits) + row * experts;

  // Each thread packs its experts once and keeps its own best; per round only the owner of the
  // winner rescans its few experts, so a round costs little more than the block-wide maximum.
  float s[PT];
  unsigned long long packed[PT];  // 0: no such expert, or already chosen
  unsigned long long mine = 0;
#pragma unroll
  for (int p = 0; p < PT; ++p) {
    const int e = threadIdx.x + p * TPR;
    s[p] = 0.f;
    packed[p] = 0;
    if (e < experts) {
      const float l = E::get(lr[e]);
      s[p] = sqrtf(l > 20.f ? l : log1pf(expf(l)));  // torch's softplus (beta 1, threshold 20)
      packed[p] = pack(s[p] + b[e], e);
    }
    mine = packed[p] > mine ? packed[p] : mine;
  }

  int id_sel[kMaxTopK];
#pragma unroll
  for (int r = 0; r < kMaxTopK; ++r) {
    id_sel[r] = 0;
    if (r < topk) {  // uniform over the block
      const unsigned long long best = block_max<TPR>(mine, part);
      if (mine == best) {  // packed values are unique (ids are): exactly one owner
        unsigned long long next = 0;
#pragma unroll
        for (int p = 0; p < PT; ++p) {
          if (packed[p] == best) {
            chosen_s[r] = s[p];  // the unbiased score, for the weights
            packed[p] = 0;
          }
          next = packed[p] > next ? packed[p] : next;
        }
        mine = next;
      }
      id_sel[r] = unpack_id(best);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxTopK; ++r)
      if (r < topk) sum += chosen_s[r];
#pragma unroll
    for (int r = 0; r < kMaxTopK; ++r) {
      if (r < topk) {
        weights[row * topk + r] = chosen_s[r] / (sum + 1e-20f) * route_scale;
        ids[row * topk + r] = id_sel[r];
      }
    }
  }
}

template <int DT, int TPR>
void launch_tpr(int64_t pt, dim3 grid, hipStream_t s, const void* logits, const float* bias, const float* bias_vl,
                const uint8_t* image_rows, float* weights, int64_t* ids, int64_t experts, int topk, float route_scale,
                int fault) {
  const dim3 block(TPR);
#define TD_ROUTE(PT) hipLaunchKernelGGL(HIP_KERNEL_NAME(moe_route<DT, TPR, PT>), grid, block, 0, s, logits, bias, \
                                        bias_vl, image_rows, weights, ids, experts, topk, route_scale, fault)
  if (pt <= 2) TD_ROUTE(2);
  else if (pt <= 4) TD_ROUTE(4);
  else if (TPR <= 128 && pt <= 8) TD_ROUTE((TPR <= 128 ? 8 : 4));
  else TD_ROUTE((TPR <= 64 ? 16 : TPR <= 128 ? 8 : 4));
#undef TD_ROUTE
}

// Threads per row. 1,024 rows of 384 experts (1.5 MB) are far too small to be bandwidth-bound:
// the time is the chain of k dependent block-wide maxima, shortest with the fewest waves per row
// (measured on an H200: 64 threads 10.8 us, 128 11.3 us, 256 17.1 us, before the owner-only
// rescan).
int auto_threads(int64_t experts) { return experts <= 512 ? 64 : 128; }

template <int DT>
int launch(const void* logits, const float* bias, const float* bias_vl, const uint8_t* image_rows, float* weights,
           int64_t* ids, int64_t rows, int64_t experts, int topk, float route_scale, int fault, int tpr,
           hipStream_t s) {
  const dim3 grid((unsigned int)rows);
  if (tpr <= 0) tpr = auto_threads(experts);
  const int64_t pt = (experts + tpr - 1) / tpr;
  if (tpr == 64) launch_tpr<DT, 64>(pt, grid, s, logits, bias, bias_vl, image_rows, weights, ids, experts, topk, route_scale, fault);
  else if (tpr == 128) launch_tpr<DT, 128>(pt, grid, s, logits, bias, bias_vl, image_rows, weights, ids, experts, topk, route_scale, fault);
  else if (tpr == 256) launch_tpr<DT, 256>(pt, grid, s, logits, bias, bias_vl, image_rows, weights, ids, experts, topk, route_scale, fault);
  else return TD_BAD_SHAPE;
  return td::launch_status();
}

}  // namespace

extern "C" int td_moe_route(const void* logits, const float* bias, const float* bias_vl, const uint8_t* image_rows,
                            float* weights, int64_t* ids, int64_t rows, int64_t experts, int topk, float route_scale,
                            int dtype, int fault_text_bias_for_images, int threads_per_row, void* stream) {
  if (rows < 0 || experts <= 0 || rows > 0x7fffffff) return TD_BAD_SHAPE;
  if (experts > 1024) return TD_TOO_MANY_EXPERTS;
  if (topk < 1 || topk > kMaxTopK || topk > experts) return TD_TOPK_TOO_LARGE;
  if (rows == 0) return TD_OK;
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (dtype) {
    case TD_F32: return launch<TD_F32>(logits, bias, bias_vl, image_rows, weights, ids, rows, experts, topk, route_scale,
                                       fault_text_bias_for_images, threads_per_row, s);
    case TD_BF16: return launch<TD_BF16>(logits, bias, bias_vl, image_rows, weights, ids, rows, experts, topk,
                                         route_scale, fault_text_bias_for_images, threads_per_row, s);
    default: return TD_BAD_DTYPE;
  }
}
