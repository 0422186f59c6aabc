// Dual-bias MoE router. Per row: s = sqrt(softplus(logit)) in fp32; the row's bias is bias_vl
// when it is an image row (text and image rows interleave in one launch), else bias; the top-k
// ids are ranked by s + bias; their weights come from the UNBIASED s, normalised
// (sum + 1e-20) and multiplied by route_scale.
//
// Routes (`threads_per_row`; 0 is kDefaultRoute below, the one line to flip after a measurement):
//  - wave (-1): one row per wave, k rounds of wave maxima over packed (key, id) values (main's);
//  - group16 (-3): one row per group of 16 lanes (32 past 512 experts), in one pass: each lane
//    keeps its experts in registers (16-byte loads where rows are aligned), the k-th largest of
//    the lane bests bounds the candidates, and each candidate's rank is counted over shuffles: no
//    dependent rounds of maxima; it measured 1.45x slower than wave at 65,536 rows (106-121
//    registers a thread: low occupancy);
//  - wave_lb (-2) / group16_lb (-4): the same kernels with more resident blocks asked of the
//    compiler (__launch_bounds__'s second argument: at most 64 registers a thread);
//  - group32 (-5): the group kernel with 32 lanes a row, half the slots a lane;
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

// (key, id) packed from a slot's ordered key word (0: no such expert) and its expert id.
__device__ inline unsigned long long pack_ord(uint32_t ord, int id) {
  return ord == 0u ? 0ull : ((unsigned long long)ord << 32) | (unsigned long long)(0x7fffffffu - (uint32_t)id);
}
__device__ inline uint32_t order_key(float key) {
  const uint32_t u = __float_as_uint(key);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // nonzero for every key sqrt can give
}

// The group route: one row per group of G lanes (16 or 32; 32 past 512 experts), ws / G rows per
// wave, in one pass and with no dependent rounds of maxima:
//   1. each lane loads its S experts (V consecutive ones per 16-byte load), keeps s and the
//      ordered biased key in registers, and its own best m;
//   2. T = the k-th largest of the group's G lane bests (each lane counts the bests above its
//      own over G shuffles). At least k experts are >= T (the k lane bests), so the top k are
//      all >= T, and only the k lanes whose best is >= T can hold one: the candidates;
//   3. a candidate's rank is the number of candidates above it, counted over G shuffles per
//      "layer" (layer j: each lane's j-th best candidate; J layers, J = the wave's most
//      candidates in one lane, capped at k). When every lane holds at most one candidate
//      (J == 1, the common case) the ranks of step 2 are these ranks and nothing more is counted;
//   4. the candidate of rank r < k writes output slot r; its unbiased s reaches every lane of the
//      group through one exact sum (one nonzero term), so the weights' sum runs in rank order.
// Every loop bound is uniform over the wave (J included) and no lane leaves early: the shuffles
// (full-mask on NVIDIA) always see whole waves, warp32 and wave64 alike. Rows past the end run
// with no experts and write nothing.
template <int DT, int G, int CH, int V, int MINB>
__global__ void __launch_bounds__(128, MINB)
moe_route_group(const void* __restrict__ logits, const float* __restrict__ bias, const float* __restrict__ bias_vl,
                const uint8_t* __restrict__ image_rows, float* __restrict__ weights, int64_t* __restrict__ ids,
                int64_t rows, int64_t experts, int topk, float route_scale, int fault_text_bias_for_images) {
  typedef td::Elem<DT> E;
  constexpr int S = CH * V;  // slots per lane; slot c * V + v is expert (c * G + lane) * V + v
  const int ws = warpSize;
  const int lane = threadIdx.x % G;
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / G) + threadIdx.x / G;
  const bool valid = row < rows;
  const int64_t r_in = valid ? row : 0;
  const bool image = valid && image_rows != nullptr && bias_vl != nullptr && image_rows[r_in] != 0;
  const float* b = (image && !fault_text_bias_for_images) ? bias_vl : bias;
  const typename E::raw* lr = static_cast<const typename E::raw*>(logits) + r_in * experts;

  // 1. s and ordered keys; this lane's best as (ord, first slot): ids grow with the slot
  float s[S];
  uint32_t ord[S];
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    const int e0 = (c * G + lane) * V;
    float l[V], bb[V];
    bool here[V];
    if constexpr (V > 1) {  // experts % V == 0: a chunk is all in or all out
      const bool in = valid && e0 < experts;
      if (in) {
        td::load16<DT>(lr + e0, l);
        td::load_f32(b + e0, bb, V);
      }
#pragma unroll
      for (int v = 0; v < V; ++v) here[v] = in;
    } else {
      here[0] = valid && e0 < experts;
      if (here[0]) {
        l[0] = E::get(lr[e0]);
        bb[0] = b[e0];
      }
    }
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int p = c * V + v;
      s[p] = 0.f;
      ord[p] = 0u;
      if (here[v]) {
        const float x = l[v];
        s[p] = sqrtf(x > 20.f ? x : log1pf(expf(x)));  // torch's softplus (beta 1, threshold 20)
        ord[p] = order_key(s[p] + bb[v]);
      }
    }
  }
  uint32_t best_ord = 0u;
  int best_id = 0;
  float best_s = 0.f;
#pragma unroll
  for (int p = 0; p < S; ++p) {
    if (ord[p] > best_ord) {  // strict: the lower id among equal keys
      best_ord = ord[p];
      best_id = ((p / V) * G + lane) * V + p % V;
      best_s = s[p];
    }
  }
  const unsigned long long m = pack_ord(best_ord, best_id);

  // 2. the k-th largest lane best; r0: how many lane bests are above this lane's
  int r0 = 0;
#pragma unroll
  for (int src = 0; src < G; ++src) r0 += port_shfl(m, src, G) > m ? 1 : 0;
  unsigned long long t = (r0 == topk - 1) ? m : 0ull;  // one lane of a live group has rank k - 1
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) {
    const unsigned long long other = port_shfl_xor(t, o, G);
    t = other > t ? other : t;
  }
  int count = 0;
#pragma unroll
  for (int p = 0; p < S; ++p)
    count += (ord[p] != 0u && pack_ord(ord[p], ((p / V) * G + lane) * V + p % V) >= t) ? 1 : 0;
  int layers = count < topk ? count : topk;
  for (int o = ws / 2; o > 0; o >>= 1) {  // the most over the whole wave: a uniform loop bound
    const int other = port_shfl_xor(layers, o, ws);
    layers = other > layers ? other : layers;
  }

  // 3. candidates by layer (cand 0: none) and their ranks
  unsigned long long cand[kMaxTopK];
  float cs[kMaxTopK];
  int rank[kMaxTopK];
  cand[0] = (m != 0ull && m >= t) ? m : 0ull;
  cs[0] = best_s;
  rank[0] = r0;
#pragma unroll
  for (int j = 1; j < kMaxTopK; ++j) {
    cand[j] = 0ull;
    cs[j] = 0.f;
    rank[j] = 0;
    if (j < layers) {  // uniform
      unsigned long long nb = 0ull;
      float ns = 0.f;
#pragma unroll
      for (int p = 0; p < S; ++p) {
        const unsigned long long pk = pack_ord(ord[p], ((p / V) * G + lane) * V + p % V);
        if (pk < cand[j - 1] && pk > nb) { nb = pk; ns = s[p]; }
      }
      if (nb >= t) { cand[j] = nb; cs[j] = ns; }
    }
  }
  if (layers > 1) {  // uniform; with one layer the ranks of step 2 are the ranks
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j) rank[j] = 0;
#pragma unroll
    for (int jj = 0; jj < kMaxTopK; ++jj) {
      if (jj < layers) {
#pragma unroll
        for (int src = 0; src < G; ++src) {
          const unsigned long long o = port_shfl(cand[jj], src, G);
#pragma unroll
          for (int j = 0; j < kMaxTopK; ++j) rank[j] += (j < layers && o > cand[j]) ? 1 : 0;
        }
      }
    }
  }

  // 4. the chosen unbiased scores in rank order, to every lane of the group; then the writes
  float sum = 0.f;
#pragma unroll
  for (int r = 0; r < kMaxTopK; ++r) {
    if (r < topk) {  // uniform
      float v = 0.f;
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j)
        if (cand[j] != 0ull && rank[j] == r) v = cs[j];
#pragma unroll
      for (int o = G / 2; o > 0; o >>= 1) v += port_shfl_xor(v, o, G);  // one nonzero term: exact
      sum += v;  // in rank order, as the block route and the reference
    }
  }
  if (valid) {
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j) {
      if (cand[j] != 0ull && rank[j] < topk) {
        weights[row * topk + rank[j]] = cs[j] / (sum + 1e-20f) * route_scale;  // cs[j]: the rank's term of the sum
        ids[row * topk + rank[j]] = unpack_id(cand[j]);
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

constexpr int kGroupBlock = 128;  // threads per block of the group route: 8 rows (G 16), 4 (G 32)

// Slots per lane tiers: 16-byte loads where every row starts 16-byte aligned (experts a multiple
// of the elements per 16 bytes, aligned pointers), one element per load otherwise. G lanes a row
// (32 past 512 experts whatever was asked), MINB resident blocks asked of the compiler.
template <int DT, int G, int MINB>
void launch_group(int64_t rows, int64_t experts, hipStream_t st, const void* logits, const float* bias,
                  const float* bias_vl, const uint8_t* image_rows, float* weights, int64_t* ids, int topk,
                  float route_scale, int fault) {
  if constexpr (G == 16) {
    if (experts > 512) {
      launch_group<DT, 32, MINB>(rows, experts, st, logits, bias, bias_vl, image_rows, weights, ids, topk,
                                 route_scale, fault);
      return;
    }
  }
  constexpr int V = td::Elem<DT>::kPer16;
  const bool vec = experts % V == 0 && td::aligned16(logits) && td::aligned16(bias) &&
                   (bias_vl == nullptr || td::aligned16(bias_vl));
  const dim3 grid((unsigned int)((rows + kGroupBlock / G - 1) / (kGroupBlock / G))), block(kGroupBlock);
  const int64_t per_lane = (experts + G - 1) / G;
  const int64_t chunks = (per_lane + V - 1) / V;
#define TD_GROUP(CC, VV) hipLaunchKernelGGL(HIP_KERNEL_NAME(moe_route_group<DT, G, CC, VV, MINB>), grid, block, 0, st, \
                                            logits, bias, bias_vl, image_rows, weights, ids, rows, experts, topk, \
                                            route_scale, fault)
  if (vec) {
    if (chunks <= 1) TD_GROUP(1, V);
    else if (chunks <= 2) TD_GROUP(2, V);  // 384 experts in bf16 at G 32: 2 x 8 per lane
    else if (chunks <= 3) TD_GROUP(3, V);  // 384 experts: bf16 at G 16 (3 x 8), fp32 at G 32 (3 x 4)
    else if (chunks <= 4) TD_GROUP(4, V);  // bf16 ends here: 4 x 8 = 32 per lane (512 at G 16, 1,024 at 32)
    else if constexpr (V == 4) {  // fp32 only: no bf16 row needs more than 4 chunks
      if (chunks <= 6) TD_GROUP(6, V);  // 384 experts in fp32 at G 16: 6 x 4 per lane
      else TD_GROUP(8, V);
    }
  } else {
    if (per_lane <= 2) TD_GROUP(2, 1);
    else if (per_lane <= 8) TD_GROUP(8, 1);
    else if (per_lane <= 16) TD_GROUP(16, 1);
    else TD_GROUP(32, 1);
  }
#undef TD_GROUP
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
// measured 13.6 us there, and 266 us at 65,536 rows (9.5% of the roofline): the group route
// replaces those k dependent rounds with two rounds of independent shuffles.

// Routes by `threads_per_row`: 64 / 128 / 256 the block route; 0 the default; a negative code a
// named route (engine/backend/hip_ops.py ROUTER_ROUTES spells the same codes):
constexpr int kRouteWave = -1;       // one row per wave, k rounds of wave maxima (main's, round 2)
constexpr int kRouteWaveLb = -2;     // the same, 4 blocks of 256 resident asked (<= 64 registers a thread)
constexpr int kRouteGroup16 = -3;    // one row per 16 lanes, ranks counted (round 3; 106-121 registers)
constexpr int kRouteGroup16Lb = -4;  // the same, 8 blocks of 128 resident asked (<= 64 registers)
constexpr int kRouteGroup32 = -5;    // one row per 32 lanes: half the slots a lane (12 of 384 experts)
// THE DEFAULT ROUTE (threads_per_row 0): the fastest measured on the H200. Round 4's run (every
// route, one process) at 65,536 rows x 384: wave_lb 229.2 us f32 / 229.1 bf16, wave 269.0 / 268.1,
// group16_lb 291.8 / 337.7, group32 319.1 / 439.8, group16 362.0 / 392.1; at 1,024 rows (launch
// bound) wave 14.0, wave_lb 14.2: the launch bound caps the wave route's occupancy gain there.
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
      case kRouteGroup16: launch_group<DT, 16, 1>(TD_ARGS); break;
      case kRouteGroup16Lb: launch_group<DT, 16, 8>(TD_ARGS); break;
      case kRouteGroup32: launch_group<DT, 32, 1>(TD_ARGS); break;
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
