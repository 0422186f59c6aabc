// Dual-bias MoE router. Per row: s = sqrt(softplus(logit)) in fp32; the row's bias is bias_vl
// when it is an image row (text and image rows interleave in one launch), else bias; the top-k
// ids are ranked by s + bias; their weights come from the UNBIASED s, normalised
// (sum + 1e-20) and multiplied by route_scale.
//
// Routes (`threads_per_row`; 0 is kDefaultRoute below, the one line to flip after a measurement):
//  - wave (-1): one row per wave, k rounds of wave maxima over packed (key, id) values (main's);
//  - wave_lb (-2): the same kernel with more resident blocks asked of the compiler
//    (__launch_bounds__'s second argument: at most 64 registers a thread);
//  - 64 / 128 / 256: one row per block of that many threads, k block-wide maxima (the oldest).
// All shuffle-only but the block route; no lane leaves a shuffle early (tests/hip/simt runs every
// route on warp32 and wave64). Planted fault `router-text-bias-for-images`: image rows are
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

// One row per wave, `blockDim.x / warpSize` rows per block. PT slots per lane are sized for the
// narrowest wave (32 lanes); on a wave64 the upper slots of a lane stay empty. MINB > 1 asks the
// compiler for that many resident blocks (fewer registers a thread, spilling if it must).
template <int DT, int PT, int MINB>
__global__ void __launch_bounds__(256, MINB)
moe_route_wave(const void* __restrict__ logits, const float* __restrict__ bias, const float* __restrict__ bias_vl,
               const uint8_t* __restrict__ image_rows, float* __restrict__ weights, int64_t* __restrict__ ids,
               int64_t rows, int64_t experts, int topk, float route_scale, int fault_text_bias_for_images) {
  typedef td::Elem<DT> E;
  const int ws = warpSize;
  const int lane = threadIdx.x % ws;
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / ws) + threadIdx.x / ws;
  if (row >= rows) return;  // the whole wave leaves together: every shuffle below sees full waves
  const bool image = image_rows != nullptr && bias_vl != nullptr && image_rows[row] != 0;
  const float* b = (image && !fault_text_bias_for_images) ? bias_vl : bias;
  const typename E::raw* lr = static_cast<const typename E::raw*>(logits) + row * experts;

  float s[PT];
  unsigned long long packed[PT];  // 0: no such expert, or already chosen
  unsigned long long mine = 0;    // this lane's best remaining
#pragma unroll
  for (int p = 0; p < PT; ++p) {
    const int64_t e = lane + (int64_t)p * ws;
    s[p] = 0.f;
    packed[p] = 0;
    if (e < experts) {  // consecutive lanes read consecutive experts: coalesced
      const float l = E::get(lr[e]);
      s[p] = sqrtf(l > 20.f ? l : log1pf(expf(l)));  // torch's softplus (beta 1, threshold 20)
      packed[p] = pack(s[p] + b[e], (int)e);
    }
    mine = packed[p] > mine ? packed[p] : mine;
  }

  float chosen[kMaxTopK];
  int id_sel[kMaxTopK];
  float sum = 0.f;
#pragma unroll
  for (int r = 0; r < kMaxTopK; ++r) {
    chosen[r] = 0.f;
    id_sel[r] = 0;
    if (r < topk) {  // uniform over the wave
      unsigned long long best = mine;
      for (int o = ws / 2; o > 0; o >>= 1) {
        const unsigned long long other = port_shfl_xor(best, o, ws);
        best = other > best ? other : best;
      }
      float won = 0.f;
      if (mine == best) {  // packed values are unique (ids are): exactly one owner rescans its few slots
        unsigned long long next = 0;
#pragma unroll
        for (int p = 0; p < PT; ++p) {
          if (packed[p] == best) {
            won = s[p];
            packed[p] = 0;
          }
          next = packed[p] > next ? packed[p] : next;
        }
        mine = next;
      }
      const int id = unpack_id(best);
      chosen[r] = port_shfl(won, id % ws, ws);  // the owner's unbiased score, to every lane
      id_sel[r] = id;
      sum += chosen[r];  // in rank order, as the block route and the reference
    }
  }
#pragma unroll
  for (int r = 0; r < kMaxTopK; ++r) {
    if (r < topk && lane == r) {
      weights[row * topk + r] = chosen[r] / (sum + 1e-20f) * route_scale;
      ids[row * topk + r] = id_sel[r];
    }
  }
}

constexpr int kWaveBlock = 256;  // threads per block of the wave route: 4 rows (wave64) or 8 (warp32)

template <int DT, int MINB>
void launch_wave(int64_t rows, int64_t experts, hipStream_t s, const void* logits, const float* bias,
                 const float* bias_vl, const uint8_t* image_rows, float* weights, int64_t* ids, int topk,
                 float route_scale, int fault) {
  const int per_block = kWaveBlock / port_device_warp_size();
  const dim3 grid((unsigned int)((rows + per_block - 1) / per_block)), block(kWaveBlock);
  const int64_t pt = (experts + kNarrowestWave - 1) / kNarrowestWave;  // slots per lane on a 32-lane wave
#define TD_WAVE(PT) hipLaunchKernelGGL(HIP_KERNEL_NAME(moe_route_wave<DT, PT, MINB>), grid, block, 0, s, logits, bias, \
                                       bias_vl, image_rows, weights, ids, rows, experts, topk, route_scale, fault)
  if (pt <= 2) TD_WAVE(2);
  else if (pt <= 4) TD_WAVE(4);
  else if (pt <= 8) TD_WAVE(8);
  else if (pt <= 12) TD_WAVE(12);  // 384 experts: 12 per lane on NVIDIA, 6 on CDNA
  else if (pt <= 16) TD_WAVE(16);
  else TD_WAVE(32);  // up to 1,024 experts
#undef TD_WAVE
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

// 1,024 rows of 384 experts (1.5 MB) are far too small to be bandwidth-bound: the copy roofline
// (0.4 us) is below one kernel launch's latency, so that case measures latency, not throughput.
// One row per block (64, 128, 256 threads) measured 10.4, 10.2 and 16.0 us on an H200: each of
// the k rounds a block-wide step with two barriers. One row per wave (k rounds of wave maxima)
// measured 13.6 us there, and 266 us at 65,536 rows (9.5% of the roofline).

// Routes by `threads_per_row`: 64 / 128 / 256 the block route; 0 the default; a negative code a
// named route (engine/backend/hip_ops.py ROUTER_ROUTES spells the same codes):
constexpr int kRouteWave = -1;       // one row per wave, k rounds of wave maxima (main's, round 2)
constexpr int kRouteWaveLb = -2;     // the same, 4 blocks of 256 resident asked (<= 64 registers a thread)
// THE DEFAULT ROUTE (threads_per_row 0): the fastest measured on the H200. Round 4's run (every
// route, one process) at 65,536 rows x 384: wave_lb 229.2 us f32 / 229.1 bf16, wave 269.0 / 268.1;
// at 1,024 rows (launch bound) wave 14.0, wave_lb 14.2: the launch bound caps the wave route's
// occupancy gain there.
// Removed (2026-12-01), not to be re-added blindly: the group routes group16 (-3), group16_lb (-4)
// and group32 (-5), one row per 16 or 32 lanes with ranks counted over shuffles. They lost every
// H200 measurement (65,536 x 384 fp32: wave_lb 229 us, group16_lb 291.8, group32 319.1, group16
// 362.0: 106-121 registers a thread, low occupancy) and their templates (10 slot tiers x 2 launch
// bounds x 2 dtypes) took ~94 s of hipcc and ~102 s of nvcc against ~2 s for any other kernel
// file. Their codes stay unused: td_moe_route refuses them (TD_BAD_SHAPE).
constexpr int kDefaultRoute = kRouteWaveLb;

template <int DT>
int launch(const void* logits, const float* bias, const float* bias_vl, const uint8_t* image_rows, float* weights,
           int64_t* ids, int64_t rows, int64_t experts, int topk, float route_scale, int fault, int tpr,
           hipStream_t s) {
  if (tpr == 0) tpr = kDefaultRoute;
  if (tpr < 0) {
#define TD_ARGS rows, experts, s, logits, bias, bias_vl, image_rows, weights, ids, topk, route_scale, fault
    switch (tpr) {
      case kRouteWave: launch_wave<DT, 1>(TD_ARGS); break;
      case kRouteWaveLb: launch_wave<DT, 4>(TD_ARGS); break;
      default: return TD_BAD_SHAPE;
    }
#undef TD_ARGS
    return td::launch_status();
  }
  const dim3 grid((unsigned int)rows);
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
