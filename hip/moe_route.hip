// Dual-bias MoE router. Per row: s = sqrt(softplus(logit)) in fp32; the row's bias is bias_vl
// when it is an image row (text and image rows interleave in one launch), else bias; the top-k
// ids are ranked by s + bias; their weights come from the UNBIASED s, normalised
// (sum + 1e-20) and multiplied by route_scale.
//
// Routes (`threads_per_row`; 0 is default_route below: filter_redux, and from a dtype's row count
// on filter_g16 (f32) / exact_bf16 (bf16), at the row counts where they become the faster):
//  - wave (-1): one row per wave, k rounds of wave maxima over packed (key, id) values (main's);
//  - wave_lb (-2): the same kernel with more resident blocks asked of the compiler
//    (__launch_bounds__'s second argument: at most 64 registers a thread);
//  - filter (-6), filter_redux (-7): one row per wave, a cheap bound on every expert's key, the
//    exact score and an exact ranking for the few candidates only (the same ids and weights as
//    wave, bit for bit; "The filter routes" below says why and how); filter_g16 (-11): a row per
//    16 lanes (2 rows a warp32, 4 a wave64);
//  - exact_bf16 (-13, bf16; fp32 calls and shapes it does not take run filter_g16): filter_g16's
//    steps on EXACT keys, a bf16 logit's exact score looked up in a shared table built on the GPU
//    by the exact score itself; persistent blocks ("exact_bf16" below);
//  - 64 / 128 / 256: one row per block of that many threads, k block-wide maxima (the oldest).
// The wave and filter routes exchange through shuffles (and a wave's own shared list); no lane
// leaves a shuffle early (tests/hip/simt runs every route on warp32 and wave64). Planted fault
// `router-text-bias-for-images`: image rows are ranked with the text bias, the kind of
// one-character kernel bug the comparator must catch.
#include "common.h"

namespace {

constexpr int kMaxTopK = 8;

// Faults planted at run time by the CPU tests, in their main build (a build a fault costs the CPU
// suite ~4 s): TD_ROUTER_PLANTED(n) is whether fault n is planted now. Builds that do not define
// it (every GPU build) plant nothing and compile the checks away (the same SASS).
#ifndef TD_ROUTER_PLANTED
#define TD_ROUTER_PLANTED(n) ((void)(n), false)
#endif
constexpr int kPlantPairSign = 1;  // table_index2: a word's high logit indexed with the low one's sign
constexpr int kPlantSortShort = 2;  // group_kth_largest: the sort's last step left out
constexpr int kPlantPrefetchSame = 3;  // exact_bf16: the row block just ranked loaded again, not the next

// The score every route ranks and weighs by: sqrt(torch's softplus (beta 1, threshold 20)), with
// the accurate library functions torch's own kernel uses, so ids and weights stay bit-faithful.
__device__ inline float exact_score(float l) { return sqrtf(l > 20.f ? l : log1pf(expf(l))); }

// (key, id) as one orderable 64-bit value: the float key's bits made monotonic in the high word,
// the id inverted in the low word, so the maximum is the best key and, among equal keys, the
// lower id. 0 is below every packed value ("nothing left").
__device__ inline uint32_t ordered(float key) {  // unsigned order = float order (-NaN lowest, +NaN highest)
  const uint32_t u = __float_as_uint(key);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ inline float from_ordered(uint32_t ord) {
  return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}
__device__ inline unsigned long long pack(float key, int id) {
  return ((unsigned long long)ordered(key) << 32) | (unsigned long long)(0x7fffffffu - (uint32_t)id);
}
__device__ inline int unpack_id(unsigned long long v) {
  return (int)(0x7fffffffu - (uint32_t)v);  // the low word
}

// Maximum over `ws` lanes by xor shuffles (packed 64-bit keys, or 32-bit ordered ones); every
// lane gets it. (filter_redux asks port_wave_max_u32, one REDUX where the GPU has it.)
template <typename T>
__device__ inline T wave_max(T v, int ws) {
  for (int o = ws / 2; o > 0; o >>= 1) {
    const T other = port_shfl_xor(v, o, ws);
    v = other > v ? other : v;
  }
  return v;
}

// The k-th largest (1 <= k <= G) of G UNIQUE values, one a lane of a group of G lanes (lane its
// number in the group); every lane gets it. A bitonic sort of the group by xor shuffles,
// descending (lane 0 the largest): log2(G) (log2(G) + 1) / 2 dependent steps, 10 for 16, against
// k rounds of log2(G) for k maxima (24 for top-6), then lane
// k - 1's value. Unique values make it the same number as the rounds of maxima.
template <int G>
__device__ inline uint32_t group_kth_largest(uint32_t v, int k, int lane) {
#pragma unroll
  for (int size = 2; size <= G; size <<= 1) {
#pragma unroll
    for (int j = size / 2; j > 0; j >>= 1) {
      if (TD_ROUTER_PLANTED(kPlantSortShort) && size == G && j == 1) break;
      const uint32_t o = port_shfl_xor(v, j, G);
      const bool keep_max = ((lane & size) == 0) == ((lane & j) == 0);  // blocks with lane & size 0 descend
      v = keep_max ? (o > v ? o : v) : (o < v ? o : v);
    }
  }
  return port_shfl(v, k - 1, G);
}

// Maximum over the TPR threads of the block; every thread gets it. Shuffles inside each wave
// (width min(warpSize, TPR)), then the waves' results through shared memory.
template <int TPR>
__device__ inline unsigned long long block_max(unsigned long long v, unsigned long long* part) {
  const int ws = warpSize;
  const int width = ws < TPR ? ws : TPR;
  v = wave_max(v, width);
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
      s[p] = exact_score(l);
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

  // every slot's logit loaded first, unconditionally (a slot past the row reads the row's last
  // expert and is ignored): the PT loads in flight together, not one behind each branch
  const int n_exp = (int)experts;  // <= 1,024
  float lv[PT];
#pragma unroll
  for (int p = 0; p < PT; ++p) {  // consecutive lanes read consecutive experts: coalesced
    const int e = lane + p * ws;
    lv[p] = E::get(lr[e < n_exp ? e : n_exp - 1]);
  }
  float s[PT];
  unsigned long long packed[PT];  // 0: no such expert, or already chosen
  unsigned long long mine = 0;    // this lane's best remaining
#pragma unroll
  for (int p = 0; p < PT; ++p) {
    const int64_t e = lane + (int64_t)p * ws;
    s[p] = 0.f;
    packed[p] = 0;
    if (e < experts) {
      const float l = lv[p];
      s[p] = exact_score(l);
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
      const unsigned long long best = wave_max(mine, ws);
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

// ---- The filter routes: a cheap bound on every expert, the exact score for candidates only ----
//
// Where the wave route's time goes (65,536 rows x 384): every expert pays the accurate expf +
// log1pf + sqrtf (~50 instructions; 25.2 M experts, ~1.26 G thread instructions), then k = 6
// rounds, each 5 dependent 64-bit shuffle steps (10 shuffles and 64-bit compares) and the
// winner's rescan of its 12 slots (~120 instructions the whole warp waits for): ~1,800 warp
// instructions a row.
//
// The filter routes (exact by construction, one row per wave as the wave route):
//  1. every expert: a fast bound [lo, hi] on its exact key (port_fast_exp/log/sqrt, 3 MUFU and
//     ~20 instructions with the loads); a lane keeps hi per slot and the maximum of its lo's;
//  2. T = the k-th largest of the lanes' maximum lo: k rounds of a 32-bit wave maximum, the lanes
//     holding a round's maximum dropping out (lanes tied on it all drop, so T can only come out
//     lower: safe). The k rounds' maxima are distinct lanes' values >= T, so >= k experts have
//     lo >= T, so >= k exact keys are >= T: the k-th largest exact key is >= T, and every expert
//     of the exact top-k (ties to the lower id included) has hi >= its key >= T;
//  3. the candidates, hi >= T (about k + 1..3 of 384 on random rows), alone pay the exact score;
//     their packed exact (key, id) go to the wave's list in shared memory (slots by a prefix
//     count over the lanes);
//  4. a candidate's rank is the number of candidates with a larger packed value (unique: ids
//     are), so ranks 0..k-1 are the exact top-k in order: the same ids, order and weights (summed
//     in rank order) as the wave route. Over kFilterCap candidates (mass ties: saturated logits of
//     a few values, a zero bias) a row takes k rounds of 64-bit wave maxima over its candidates
//     instead, exact scores recomputed each round: slow, rare, the same result.
//
// Why [lo, hi] holds the exact key. The bound on s is a = fast_sqrt(max(fast_log(1 +
// fast_exp(l)), 0)) (fast_sqrt(l) past 20, as exact_score), widened by m = a * 2^-10 + 2^-8. The
// fast functions' errors (the CUDA guide: __expf 2 + floor(1.173 |x|) ulp, <= 1.3e-5 relative for
// |x| <= 88; __logf 2^-21.41 absolute on [0.5, 2], else 3 ulp; sqrt.approx and AMD's v_exp, v_log,
// v_sqrt about 1 ulp) give |a - s| <= ~1.5e-5 s where s > 0.8, and <= sqrt(5e-7) = 7.1e-4 (the
// log's absolute error under the root) near s = 0, the accurate functions' few ulps included: m is
// 60x the first and 5x the second. Flushed denormals (l < -87, s < 1.2e-19) are inside the 2^-8.
// On keys: fl(a - m) <= s <= fl(a + m) (m is far above half an ulp of a) and rounding is
// monotone, so lo = fl(fl(a - m) + b) <= fl(s + b) <= fl(fl(a + m) + b) = hi. A NaN bound (a NaN
// logit or bias, l = +inf) is no bound: its lo raises no threshold, its hi is always a candidate.
// The guide's bounds come from tests, not proofs: the GPU test (tests/hip/test_hip_kernels.py)
// runs td_moe_route_score_bound over EVERY fp32 bit pattern, so the bound is checked
// exhaustively on the GPU that runs it; the CPU stand-in's fast functions are worse than the
// documented worst case, and a margin made too tight
// (-DTD_ROUTER_FILTER_FAULT_NO_MARGIN) fails tests/hip/test_hip_moe_route_simt.py.
//
// Per row (warp32, 384 experts, top-6, counted from the source and its PTX): the fast bound ~22
// instructions an expert (264); the rest ~300 with the threshold's 6 rounds of 5 shuffle steps
// (filter), ~230 with one REDUX a round (filter_redux): the prefix count (~23), the candidates'
// exact scores (1-2 rounds of ~60 per lane, the busiest lane's), ranks (~40), the weights (~30).
// filter ~570, filter_redux ~500 against the wave route's ~1,800. Every slot's load is issued
// before any is used (step 1): behind its own branch each slot would cost a lane one memory
// latency, which outweighs the instruction counts. The routes' times: bench/README.md.
constexpr float kFilterRel = 0x1p-10f;  // the margin's relative part (60x the fast functions')
constexpr float kFilterAbs = 0x1p-8f;   // and its absolute part (5x the log's error under a root)
#ifdef TD_ROUTER_FILTER_FAULT_NO_MARGIN
constexpr float kFilterMarginScale = 0.f;  // planted (CPU tests only): the bound made too tight
#else
constexpr float kFilterMarginScale = 1.f;
#endif
#ifndef TD_ROUTER_FILTER_CAP
#define TD_ROUTER_FILTER_CAP 64
#endif
// Candidates a wave ranks through shared memory; more take the slow path (the CPU tests also
// build 0: every row the slow path, which must give the same result).
constexpr int kFilterCap = TD_ROUTER_FILTER_CAP;
constexpr int kExactCap = 32;  // exact_bf16's (random rows have ~k + 2 candidates)
constexpr int kWavesPerBlock = kWaveBlock / kNarrowestWave;

// The fast score a (NaN for a NaN logit, +inf for +inf: no bound) and its margin m: exact_score(l)
// lies in [a - m, a + m] (margin_scale 1: the routes' margin).
__device__ inline float fast_score(float l) {
  const float soft = fmaxf(port_fast_log(1.f + port_fast_exp(l)), 0.f);
  return port_fast_sqrt(!(l <= 20.f) ? l : soft);  // a NaN logit takes the root of itself: stays NaN
}
__device__ inline float score_margin(float a, float margin_scale) {
  return (a * kFilterRel + kFilterAbs) * margin_scale;
}

// ---- exact_bf16 (-13): bf16's exact scores from a table, so every key is exact ----
//
// A bf16 logit has 65,536 values, so exact_score can be looked up instead of computed: a table of
// exact_score over the window |l| in [2^-25, 127.5) (4,095 values a sign, each sign's block closed
// by a NaN entry: 8,192 floats, 32 KB of shared memory), computed ON THE GPU by exact_score itself,
// so an entry is bit for bit what the wave route computes. A logit off the window (|l| < 2^-25 or
// >= 127.5, 0, inf, NaN: rare) reads the NaN entry: no key, so it is a candidate (as a NaN bound
// is in the filter), and step 3 computes its exact score (table_score: exact_score there). The
// keys fl(s + b) are otherwise exact: the filter's steps 2-4 run on them as on a bound of width 0
// (lo = hi = the key, no margin), a candidate's s comes from the table again, and no slot
// branches. The blocks are persistent (as many as are resident, each looping over row blocks):
// each copies the table from g_score_table and both biases into shared memory once; a process's
// first launch computes the table in every block and block 0 publishes it (g_score_table_ready).
// A lane's experts are contiguous quads (one 8-byte load of 4 logits, one 16-byte shared load of
// their biases): 384 experts on 16 lanes are 6 quads a lane. T is taken with the lane's number
// in the low bits, so that the values are unique (step 2), and their k-th largest comes from a
// sort (group_kth_largest: 10 dependent shuffle steps for 16 values, not 24). (A REDUX a round
// with each group's lane mask does not pay: nvcc checks the mask for uniformity and, the two
// groups of a warp naming different masks, always takes its divergent fallback.)
// The route's time is issue slots, so its form keeps the instructions a row low: no branch a slot
// (the off-window logit reads the NaN entry instead), biases in shared memory (one 16-byte shared
// load a quad), the table filled inside the route (no fill kernel a call), whole-lane rows
// specialised and the per-row invariants out of the loop, both logits of a 32-bit word indexed at
// once (table_index2, 16-bit lanes), the weights' sum from two 16-byte shared loads, the next row
// block's quads loaded once this row's keys are consumed, the ranks' loop unrolled 4, and the
// filter kernel's shared arrays one object (the candidates' loop does not rebuild each array's
// address). At 64 registers a thread there is no room for more: loading the next row block's
// quads earlier, or each candidate's logit ahead, or a fifth block a multiprocessor spills.
constexpr uint32_t kTableLoBits = 102u << 7;  // the bf16 bits of 2^-25, the window's lowest
constexpr int kTableHalf = 4096;              // a sign's entries: the window's 4,095 values, then a NaN
constexpr int kTableSize = 2 * kTableHalf;    // positive, then negative: 8,192 floats
constexpr uint32_t kTableReady = 0x7ab1e5edu;
static_assert(kTableHalf == 1 << 12 && kTableLoBits + kTableHalf == 134u << 7, "[2^-25, 2^7) a sign; bit 15 -> bit 12");
__device__ float g_score_table[kTableSize];
__device__ uint32_t g_score_table_ready;  // kTableReady once g_score_table holds every entry

// The bf16 bits of table entry i.
__device__ inline uint32_t table_bits(int i) {
  return ((uint32_t)(i / kTableHalf) << 15) | (kTableLoBits + (uint32_t)(i % kTableHalf));
}

// The table's indices of the two bf16 logits of a 32-bit word (bits h0 in the low half, h1 in the
// high), i0 | i1 << 16, both halves at once (16-bit lanes in one register: a bf16 row's words as
// loaded, one VIADD.16x2 and one VIMNMX.U16x2 on sm_90 for two logits). Per half:
// x = h - (the window's lowest bits) mod 2^16, so the positive window is x in [0, 4095) and the
// negative one [0x8000, 0x8fff); the index min(x & 0x7fff, 4095) | x's bit 15 moved to bit 12. A
// logit off the window reads its sign's last entry, NaN.
constexpr uint32_t kTableMinusLo = 0x10000u - kTableLoBits;  // x = h + this, mod 2^16
constexpr uint32_t kHalves = 0x10001u;                       // a 16-bit constant in both halves
__device__ inline uint32_t table_index2(uint32_t w) {
  const uint32_t x = port_vadd2_u16(w, kTableMinusLo * kHalves);
  const uint32_t m = port_vmin2_u16(x & 0x7fffu * kHalves, (uint32_t)(kTableHalf - 1) * kHalves);
  if (TD_ROUTER_PLANTED(kPlantPairSign)) return m | ((x >> 3) & (uint32_t)kTableHalf) | ((x << 13) & (uint32_t)kTableHalf << 16);
  return m | ((x >> 3) & (uint32_t)kTableHalf * kHalves);
}

// The table's entry for the bf16 with bits h (the low half of table_index2), and whether h is in
// the window (its entry a score, not the NaN that closes each sign's block).
__device__ inline float table_entry(uint32_t h, const float* table, bool& in) {
  const uint32_t i = table_index2(h & 0xffffu) & 0xffffu;
#ifdef TD_ROUTER_TABLE_FAULT_EDGE
  in = ((h + kTableMinusLo) & 0x7fffu) <= (uint32_t)kTableHalf - 1;  // planted (CPU tests only): the NaN entry taken as a score
#else
  in = (i & (kTableHalf - 1)) < (uint32_t)kTableHalf - 1;
#endif
  return table[i];
}

// exact_score of the bf16 with bits h, from `table` inside the window.
__device__ inline float table_score(uint32_t h, const float* table) {
  bool in;
  float s = table_entry(h, table, in);
  if (!in) s = exact_score(td::bf16_bits_to_f32((uint16_t)h));
  return s;
}

// Table entry i: exact_score itself, on this GPU; a sign's last entry NaN (what a logit off the
// window reads: no key, a candidate).
__device__ inline float table_value(int i) {
  if (i % kTableHalf == kTableHalf - 1) return __uint_as_float(0x7fc00000u);
  float s = exact_score(td::bf16_bits_to_f32((uint16_t)table_bits(i)));
#ifdef TD_ROUTER_TABLE_FAULT_ULP
  if (((table_bits(i) >> 7) & 0xffu) == 128u) s = __uint_as_float(__float_as_uint(s) + 1u);  // planted: [2, 4) an ulp up
#endif
  return s;
}

__device__ inline bool score_table_filled() {
  return *reinterpret_cast<volatile uint32_t*>(&g_score_table_ready) == kTableReady;
}

// g_score_table from the block's copy `table`, then the flag (the block's threads all call it)
__device__ inline void publish_score_table(const float* table) {
  for (int i = threadIdx.x; i < kTableSize; i += blockDim.x) g_score_table[i] = table[i];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) *reinterpret_cast<volatile uint32_t*>(&g_score_table_ready) = kTableReady;
}

// One block of 256: g_score_table, once (a later launch sees the flag and returns). The check's;
// the route fills it itself (load_score_table).
__global__ void __launch_bounds__(256) moe_route_table_fill() {
  __shared__ float table[kTableSize];
  if (score_table_filled()) return;  // uniform
  for (int i = threadIdx.x; i < kTableSize; i += blockDim.x) table[i] = table_value(i);
  __syncthreads();
  publish_score_table(table);
}

// A block's shared copy of the table and of both biases (bias_vl 0 where there is none). From
// g_score_table once it is filled; before that (a process's first launch) each block computes
// its own, and block 0 publishes it for the launches after. All of a block's threads call it.
__device__ inline void load_score_table(float* table, float* sb, float* sbvl, const float* bias, const float* bias_vl,
                                        int experts) {
  __shared__ uint32_t filled;
  if (threadIdx.x == 0) filled = score_table_filled() ? 1u : 0u;
  __syncthreads();
  const bool copy = filled != 0;  // uniform over the block
  if (copy) {
    __threadfence();  // the flag seen, then the entries written before it
    for (int i = 4 * (int)threadIdx.x; i < kTableSize; i += 4 * (int)blockDim.x)
      *reinterpret_cast<float4*>(table + i) = *reinterpret_cast<const float4*>(g_score_table + i);
  } else {
    for (int i = threadIdx.x; i < kTableSize; i += blockDim.x) table[i] = table_value(i);
  }
  for (int i = threadIdx.x; i < experts; i += blockDim.x) {
    sb[i] = bias[i];
    sbvl[i] = bias_vl != nullptr ? bias_vl[i] : 0.f;
  }
  __syncthreads();
  if (!copy && blockIdx.x == 0) publish_score_table(table);
}

// Every bf16 bit pattern: bad[t] counts thread t's whose table_score (g_score_table) is not
// exact_score bit for bit, or whose table_index2 in a word's high half (beside its sign-flipped
// self in the low half) is not its index alone, example[t] its last. One block of 256.
__global__ void __launch_bounds__(256) moe_route_table_check(uint32_t* bad, uint32_t* example) {
  uint32_t n = 0, last = 0;
  for (uint32_t h = threadIdx.x; h < 0x10000u; h += blockDim.x) {
    const float got = table_score(h, g_score_table), want = exact_score(td::bf16_bits_to_f32((uint16_t)h));
    const uint32_t pair = table_index2(h << 16 | (h ^ 0x8000u));
    const bool halves = pair >> 16 == (table_index2(h) & 0xffffu) && (pair & 0xffffu) == (table_index2(h ^ 0x8000u) & 0xffffu);
    if (__float_as_uint(got) != __float_as_uint(want) || !halves) {
      ++n;
      last = h;
    }
  }
  bad[threadIdx.x] = n;
  example[threadIdx.x] = last;
}

template <bool B> struct Flag { static constexpr bool value = B; };  // a compile-time choice, as a value

// Expert of a lane's slot p: lane + p * gw (a slot a row of lanes), or with quads the p % 4-th of
// the lane's (p / 4)-th quad, quads lane + j * gw.
template <bool QUADS>
__device__ inline int slot_expert(int lane, int p, int gw) {
  return QUADS ? 4 * (lane + (int)((unsigned)p / 4u) * gw) + (int)((unsigned)p % 4u) : lane + p * gw;
}
// and the lane that holds expert e
template <bool QUADS>
__device__ inline int expert_lane(int e, int gw) {
  return (QUADS ? e / 4 : e) % gw;
}

// G = 0: a row a wave; G = 16: a row a group of 16 lanes (2 rows a warp32, 4 a wave64), so every
// per-row step (the threshold's rounds, the prefix count, the exact scores, the ranks) serves
// several rows with one instruction: filter_g16. TAB (bf16, G 16): the keys exact from the table
// (exact_bf16, above), persistent blocks.
// exact_bf16's ranks: the inner loop unrolled 4 (faster than the compiler's 16, or 1, 2 or 8)
constexpr int kExactRankUnroll = 4;
template <int DT, int PT, bool REDUX, int G, bool TAB>
__global__ void __launch_bounds__(256, 4)
moe_route_filter(const void* __restrict__ logits, const float* __restrict__ bias, const float* __restrict__ bias_vl,
                 const uint8_t* __restrict__ image_rows, float* __restrict__ weights, int64_t* __restrict__ ids,
                 int64_t rows, int64_t experts, int topk, float route_scale, int fault_text_bias_for_images) {
  typedef td::Elem<DT> E;
  static_assert(G == 0 || (G >= 8 && kNarrowestWave % (G ? G : 1) == 0), "a group divides every wave");
  static_assert(!TAB || (DT == TD_BF16 && G != 0 && PT % 4 == 0), "the table holds bf16 scores; slots are quads");
  constexpr int kGroups = G ? kWaveBlock / G : kWavesPerBlock;  // rows a block holds at most
  // TAB: a shorter list (its table and biases take 35 KB of the 48 KB a block may declare)
  constexpr int kCap = TAB && kFilterCap > kExactCap ? kExactCap : kFilterCap;
  constexpr int kSlots = kCap > 0 ? kCap : 1;
  // One shared object, so that every array is its base plus a constant (separate arrays had
  // their shared-window addresses rebuilt inside the candidates' loop: ~14 instructions a
  // candidate)
  struct Shared {
    unsigned long long cand_key[kGroups][kSlots];
    float cand_s[kGroups][kSlots];
    alignas(16) float top_s[kGroups][kMaxTopK];  // TAB: a group's read as two 16-byte loads
    int top_id[kGroups][kMaxTopK];
    alignas(16) float table[TAB ? kTableSize : 1];  // 16-byte loads and stores
    alignas(16) float sbias[TAB ? 2 : 1][TAB ? PT * G : 1];  // TAB: bias and bias_vl (0 without it)
  };
  __shared__ Shared sm;
  auto& cand_key = sm.cand_key;
  auto& cand_s = sm.cand_s;
  auto& top_s = sm.top_s;
  auto& top_id = sm.top_id;
  auto& table = sm.table;
  auto& sbias = sm.sbias;
  const int ws = warpSize, gw = G ? G : ws;  // the wave, and the lanes of one row
  const int lane = threadIdx.x % gw, group = threadIdx.x / gw;
  const float inf = __uint_as_float(0x7f800000u);
  const int n_exp = (int)experts;  // <= 1,024: 32-bit offsets
  // the exact score of expert e of row lr (a candidate's, again)
  auto exact_of = [&](const typename E::raw* lr, int e) -> float {
    if constexpr (TAB) return table_score(lr[e], table);
    else return exact_score(E::get(lr[e]));
  };

  // The rows of row block rb (blockDim.x / gw rows): the wave's first row and this group's place
  // after it, one row a group. A wave whose first row is past the end skips it whole; otherwise it
  // runs whole (a group past the last row computes the last row again and writes nothing): every
  // shuffle and wave barrier below sees the full wave. (What does not change from one row block to
  // the next is worked out once, here.)
  const int per_block = blockDim.x / gw, wave_first = (threadIdx.x / ws) * (ws / gw), my_row = threadIdx.x / gw;
  constexpr int Q = TAB ? PT / 4 : 1;  // TAB: a lane's quads
  const int n_quads = n_exp / 4;
  const bool full = TAB && n_quads == Q * gw;  // every slot of every lane an expert (384 on 16 lanes)
  // TAB: the quads of this thread's row in row block rb, loaded into `pre` one row block ahead
  // (issued once a row's keys are consumed, so the loads' latency hides behind its candidates,
  // ranks and weights). A row past the end loads the last row (valid memory, unused).
  uint2 pre[Q];
  auto load_quads = [&](int64_t rb) {
    const int64_t r = rb * per_block + my_row < rows ? rb * per_block + my_row : rows - 1;
    const uint2* rq = reinterpret_cast<const uint2*>(static_cast<const typename E::raw*>(logits) + r * experts);
#pragma unroll
    for (int j = 0; j < Q; ++j) {  // a group's lanes read consecutive quads: coalesced
      const int q = lane + j * gw;
      pre[j] = rq[q < n_quads ? q : n_quads - 1];
    }
  };

  auto row_block = [&](int64_t rb) {
  const int64_t wave_row = rb * per_block + wave_first;
  if (wave_row < rows) {
    const int64_t mine_row = rb * per_block + my_row;
    const bool live = mine_row < rows;
    const int64_t row = live ? mine_row : rows - 1;
    const bool image = image_rows != nullptr && bias_vl != nullptr && image_rows[row] != 0;
    const bool use_vl = image && !fault_text_bias_for_images;
    const float* b = TAB ? sbias[use_vl ? 1 : 0] : use_vl ? bias_vl : bias;
    const typename E::raw* lr = static_cast<const typename E::raw*>(logits) + row * experts;

    // 1. a bound on every expert's key: hi kept per slot, the lane's largest lo. Every slot's
    // logit is loaded first, unconditionally (a slot past the row reads the row's last expert
    // and is ignored), so the PT loads from memory are in flight together, not one a branch
    float hi[PT];
    float lane_lo = -inf;
    if constexpr (TAB) {  // exact keys: lo = hi = fl(s + b); n_exp % 4 == 0, 8-byte rows (launch_exact)
      auto keys = [&](auto full_rows) {
        constexpr bool kFull = decltype(full_rows)::value;
        const uint2* raw = pre;  // this row's quads (load_quads)
#pragma unroll
        for (int j = 0; j < Q; ++j) {
          const int q = lane + j * gw;
          const float4 bq = *reinterpret_cast<const float4*>(b + 4 * (kFull || q < n_quads ? q : n_quads - 1));
          // both logits of a word indexed at once (table_index2), as byte offsets: an index is
          // under 2^13, so the high one's is the word shifted right by 14 (one instruction)
          const uint32_t i01 = table_index2(raw[j].x), i23 = table_index2(raw[j].y);
          const uint32_t off[4] = {(i01 << 2) & 0xffffu, i01 >> 14, (i23 << 2) & 0xffffu, i23 >> 14};
          const float be[4] = {bq.x, bq.y, bq.z, bq.w};
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            // a logit off the table (|l| < 2^-25 or >= 127.5, 0, inf, NaN) reads the NaN entry: no
            // key here, a candidate whose exact score step 3 computes, passed over by fmaxf (as a
            // NaN logit or bias). No branch a slot
            const float key = *reinterpret_cast<const float*>(reinterpret_cast<const char*>(table) + off[c]) + be[c];
            hi[4 * j + c] = kFull || q < n_quads ? key : -inf;
            lane_lo = fmaxf(lane_lo, hi[4 * j + c]);
          }
        }
      };
      if (full) keys(Flag<true>{});
      else keys(Flag<false>{});
    } else {
      float lv[PT];
#pragma unroll
      for (int p = 0; p < PT; ++p) {  // consecutive lanes read consecutive experts: coalesced
        const int e = lane + p * gw;
        lv[p] = E::get(lr[e < n_exp ? e : n_exp - 1]);
      }
#pragma unroll
      for (int p = 0; p < PT; ++p) {
        const int e = lane + p * gw;
        hi[p] = -inf;
        if (e < n_exp) {
          const float l = lv[p], be = b[e];
          const float a = fast_score(l), m = score_margin(a, kFilterMarginScale);
          const float s_lo = a - m, s_hi = a + m;
          // a NaN bound (a NaN logit or bias, l = +inf, an infinite bias against an infinite a) is no
          // bound: fmaxf passes over a NaN lo, and a NaN hi is a candidate (step 3 asks !(hi < T))
          hi[p] = s_hi + be;
          lane_lo = fmaxf(lane_lo, s_lo + be);
        }
      }
    }
    // 2. T <= the k-th largest lo (lane_lo is never NaN: 0 is below every ordered value it has)
    uint32_t v = ordered(lane_lo), t = 0;
    // TAB: exact keys tie exactly (bf16 logits, a zero bias), and a round drops every lane tied on
    // its maximum: ties over k lanes would leave T = -inf and the whole row as candidates. So the
    // lane's own number replaces the value's low bits: unique, one lane a round; the value only
    // comes out lower (safe, as above), by at most gw - 1 steps of the ordered order (a T of ~-inf
    // becomes a NaN, which !(hi < T) takes as every expert: the same as -inf).
    const uint32_t low = TAB ? (uint32_t)(gw - 1) : 0u;
    v = (v & ~low) | ((uint32_t)lane & low);  // never 0: lane_lo is never a NaN
    if constexpr (TAB) {  // unique values: their k-th largest by a sort (group_kth_largest)
      t = group_kth_largest<G>(v, topk, lane);
    } else {
      for (int r = 0; r < topk; ++r) {  // uniform over the wave
        t = (REDUX && G == 0) ? port_wave_max_u32(v, ws) : wave_max(v, gw);
        if (v == t) v = 0;
      }
    }
    const float thr = t == 0 ? -inf : from_ordered(t & ~low);

    // 3. the candidates and their places in the wave's list
    uint32_t mask = 0;
    if constexpr (TAB) {  // a quad is in the row or not
      auto candidates = [&](auto full_rows) {
#pragma unroll
        for (int p = 0; p < PT; ++p)
          if ((decltype(full_rows)::value || lane + (p / 4) * gw < n_quads) && !(hi[p] < thr)) mask |= 1u << p;
      };
      if (full) candidates(Flag<true>{});
      else candidates(Flag<false>{});
    } else {
#pragma unroll
      for (int p = 0; p < PT; ++p)
        if (lane + p * gw < n_exp && !(hi[p] < thr)) mask |= 1u << p;
    }
    if constexpr (TAB) load_quads(TD_ROUTER_PLANTED(kPlantPrefetchSame) ? rb : rb + gridDim.x);  // keys consumed: the next row block's
    const int mine = __popc(mask);
    int upto = mine;  // inclusive prefix count over the row's lanes
    for (int o = 1; o < gw; o <<= 1) {
      const int below = port_shfl(upto, lane >= o ? lane - o : lane, gw);
      if (lane >= o) upto += below;
    }
    // total >= k whatever the bound's accuracy: the k lanes behind T each hold an expert with
    // lo >= T, and hi >= lo by construction (a + m >= a - m)
    const int total = port_shfl(upto, gw - 1, gw);
#ifdef TD_ROUTER_FILTER_PROBE
    if (lane == 0 && live) TD_ROUTER_FILTER_PROBE(total);  // the CPU tests' count of candidates a row
#endif
    unsigned long long* keys = cand_key[group];
    float* ks = cand_s[group];
    float* ts = top_s[group];
    int* ti = top_id[group];

    // uniform over the wave (its barriers and shuffles): a row of too many candidates sends every
    // row of its wave to the slow path
    if (port_ballot(total > kCap) == 0) {
      int at = upto - mine;
      for (uint32_t mm = mask; mm != 0; mm &= mm - 1) {  // divergent, no shuffle inside
        const int e = slot_expert<TAB>(lane, __ffs((int)mm) - 1, gw);
        const float s = exact_of(lr, e);
        keys[at] = pack(s + b[e], e);
        ks[at] = s;
        ++at;
      }
      port_wave_sync();
      // 4. ranks: how many candidates are larger
      for (int i = lane; i < total; i += gw) {
        const unsigned long long ki = keys[i];
        int rank = 0;
        if constexpr (TAB) {
#pragma unroll kExactRankUnroll
          for (int j = 0; j < total; ++j) rank += keys[j] > ki ? 1 : 0;
        } else {
          for (int j = 0; j < total; ++j) rank += keys[j] > ki ? 1 : 0;
        }
        if (rank < topk) {
          ts[rank] = ks[i];
          ti[rank] = unpack_id(ki);
        }
      }
    } else {  // mass ties: k rounds of wave maxima over the candidates
      unsigned long long prev = ~0ull;
      for (int r = 0; r < topk; ++r) {
        unsigned long long best = 0;
        float best_s = 0.f;
        for (uint32_t mm = mask; mm != 0; mm &= mm - 1) {
          const int e = slot_expert<TAB>(lane, __ffs((int)mm) - 1, gw);
          const float s = exact_of(lr, e);
          const unsigned long long kv = pack(s + b[e], e);
          if (kv < prev && kv > best) {
            best = kv;
            best_s = s;
          }
        }
        best = wave_max(best, gw);
        const int id = unpack_id(best);
        const float won = port_shfl(best_s, expert_lane<TAB>(id, gw), gw);  // the owner's unbiased score
        if (lane == 0) {
          ts[r] = won;
          ti[r] = id;
        }
        prev = best;
      }
    }
    port_wave_sync();
    if (live && lane < topk) {
      float sum = 0.f;
      if constexpr (TAB) {  // the group's scores in registers (two 16-byte loads), no branch a term
        static_assert(kMaxTopK == 8, "two float4");
        const float4 t03 = *reinterpret_cast<const float4*>(ts), t47 = *reinterpret_cast<const float4*>(ts + 4);
        const float t[kMaxTopK] = {t03.x, t03.y, t03.z, t03.w, t47.x, t47.y, t47.z, t47.w};
#pragma unroll
        for (int r = 0; r < kMaxTopK; ++r) sum = r < topk ? sum + t[r] : sum;  // in rank order, as the other routes
      } else {
        for (int r = 0; r < topk; ++r) sum += ts[r];  // in rank order, as the other routes
      }
      weights[row * topk + lane] = ts[lane] / (sum + 1e-20f) * route_scale;
      ids[row * topk + lane] = ti[lane];
    }
  }
  };
  if constexpr (TAB) {  // persistent: block b takes row blocks b, b + gridDim.x, ...
    load_quads(blockIdx.x);  // the first row block's quads in flight while the table is copied
    load_score_table(table, sbias[0], sbias[1], bias, bias_vl, (int)experts);
    for (int64_t rb = blockIdx.x; rb * (blockDim.x / gw) < rows; rb += gridDim.x) row_block(rb);
  } else {
    row_block(blockIdx.x);
  }
}

template <int DT, bool REDUX, int G>
void launch_filter(int64_t rows, int64_t experts, hipStream_t s, const void* logits, const float* bias,
                   const float* bias_vl, const uint8_t* image_rows, float* weights, int64_t* ids, int topk,
                   float route_scale, int fault) {
  if (G != 0 && experts > 32 * (G ? G : 1)) {  // over 32 slots a lane: a row a wave instead
    launch_filter<DT, true, 0>(rows, experts, s, logits, bias, bias_vl, image_rows, weights, ids, topk, route_scale,
                               fault);  // (filter_redux's kernels)
    return;
  }
  const int per_block = kWaveBlock / (G ? G : port_device_warp_size());
  const int64_t blocks = (rows + per_block - 1) / per_block;
  const dim3 grid((unsigned int)blocks), block(kWaveBlock);
  const int64_t pt = (experts + (G ? G : kNarrowestWave) - 1) / (G ? G : kNarrowestWave);  // slots a lane
#define TD_FILTER(PT) hipLaunchKernelGGL(HIP_KERNEL_NAME(moe_route_filter<DT, PT, REDUX, G, false>), grid, \
                                         block, 0, s, logits, bias, bias_vl, image_rows, weights, ids, rows, \
                                         experts, topk, route_scale, fault)
  if constexpr (G == 0) {
    if (pt <= 2) TD_FILTER(2);
    else if (pt <= 4) TD_FILTER(4);
    else if (pt <= 8) TD_FILTER(8);
    else if (pt <= 12) TD_FILTER(12);
    else if (pt <= 16) TD_FILTER(16);
    else TD_FILTER(32);
  } else {  // fewer tiers (build time): 384 experts on 16 lanes are 24 a lane
    if (pt <= 8) TD_FILTER(8);
    else if (pt <= 16) TD_FILTER(16);
    else if (pt <= 24) TD_FILTER(24);
    else TD_FILTER(32);
  }
#undef TD_FILTER
}


// exact_bf16's kernels: 8, 16, 24 or 32 slots (2-8 quads) a lane of 16, persistent blocks (as
// many as are resident, or a block a row block where that cannot be asked), after the table's
// fill kernel in the same stream. launch() sends what does not fit to filter_g16.
void launch_exact(int64_t rows, int64_t experts, hipStream_t s, const void* logits, const float* bias,
                  const float* bias_vl, const uint8_t* image_rows, float* weights, int64_t* ids, int topk,
                  float route_scale, int fault) {
  constexpr int G = 16;
  const int64_t blocks = (rows + kWaveBlock / G - 1) / (kWaveBlock / G);
  const int64_t pt = 4 * ((experts + 4 * G - 1) / (4 * G));  // slots a lane, whole quads
#define TD_EXACT(PT)                                                                                                  \
  do {                                                                                                                \
    const auto k = moe_route_filter<TD_BF16, PT, false, G, true>;                                                     \
    const int resident = port_resident_blocks(k, kWaveBlock);                                                         \
    const dim3 grid((unsigned int)(resident > 0 && resident < blocks ? resident : blocks)), block(kWaveBlock);       \
    hipLaunchKernelGGL(HIP_KERNEL_NAME(moe_route_filter<TD_BF16, PT, false, G, true>), grid, block, 0, s, logits,   \
                       bias, bias_vl, image_rows, weights, ids, rows, experts, topk, route_scale, fault);             \
  } while (0)
  if (pt <= 8) TD_EXACT(8);
  else if (pt <= 16) TD_EXACT(16);
  else if (pt <= 24) TD_EXACT(24);
  else TD_EXACT(32);
#undef TD_EXACT
}

// What exact_bf16 takes: bf16 logits of whole quads (experts % 4 == 0, <= 512: 32 slots a lane
// of 16) in 8-byte aligned rows, 16-byte aligned biases (a quad's biases in one load).
inline bool exact_fits(int dtype, int64_t experts, const void* logits, const float* bias, const float* bias_vl) {
  return dtype == TD_BF16 && experts % 4 == 0 && experts <= 512 && (reinterpret_cast<uintptr_t>(logits) & 7u) == 0 &&
         td::aligned16(bias) && (bias_vl == nullptr || td::aligned16(bias_vl));
}

// Every fp32 bit pattern start .. start + count - 1 as a logit: bad[i] counts those of thread i
// whose exact_score falls outside [a - m, a + m] (fast_score, score_margin; a NaN or infinite logit has no
// bound, so it passes), example[i] its last one. `threads` threads in blocks of 256.
__global__ void __launch_bounds__(256)
moe_route_score_bound(uint64_t start, uint64_t count, float margin_scale, uint64_t threads, uint32_t* bad,
                      uint32_t* example) {
  const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t n = 0, last = 0;
  for (uint64_t i = tid; i < count; i += threads) {
    const uint32_t u = (uint32_t)(start + i);
    const float l = __uint_as_float(u);
    const float a = fast_score(l), m = score_margin(a, margin_scale), s = exact_score(l);
    const float lo = a - m, hi = a + m;
    if (lo <= hi && !(lo <= s && s <= hi)) {  // !(lo <= hi): no bound (NaN, +inf), as in the routes
      ++n;
      last = u;
    }
  }
  bad[tid] = n;
  example[tid] = last;
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
// One row per block (64, 128, 256 threads) pays, in each of the k rounds, a block-wide step with
// two barriers; one row per wave (k rounds of wave maxima) pays the accurate score of every
// expert and k dependent rounds of shuffles.

// Routes by `threads_per_row`: 64 / 128 / 256 the block route; 0 the default; a negative code a
// named route (engine/backend/hip_ops.py ROUTER_ROUTES spells the same codes):
constexpr int kRouteWave = -1;       // one row per wave, k rounds of wave maxima
constexpr int kRouteWaveLb = -2;     // the same, 4 blocks of 256 resident asked (<= 64 registers a thread)
constexpr int kRouteFilter = -6;     // a fast bound on every expert, the exact score for candidates only
constexpr int kRouteFilterRedux = -7;  // the same, the threshold's wave maxima one REDUX each (sm_80+)
constexpr int kRouteFilterG16 = -11;  // filter's fast bound, a row a group of 16 lanes, one launch a row group
constexpr int kRouteExactBf16 = -13;  // bf16: exact keys from a table of scores, filter_g16's steps, persistent
// THE DEFAULT ROUTE (threads_per_row 0) below the row thresholds: filter_redux, the fastest at
// 1,024 rows (launch bound).
// Removed, their codes refused (td_moe_route returns TD_BAD_SHAPE): filter_table (-8),
// filter_table_g16 (-9), filter_table_g16_count (-10) and filter_g16_count (-12), a table of
// exact scores as the bound and the threshold by counting; the group routes group16 (-3),
// group16_lb (-4) and group32 (-5), one row per 16 or 32 lanes with ranks counted over shuffles
// (106-121 registers a thread, and templates that made this file the build's slowest by far).
// Each was slower than a kept route at every measured size.
constexpr int kDefaultRoute = kRouteFilterRedux;
// The default by row count: filter_g16 has the better throughput, filter_redux the shorter row
// (g16's lane walks 24 slots to redux's 12, which costs latency on few rows); bf16 (the same
// instructions, half the bytes) has exact_bf16, whose persistent blocks copy the table and biases
// first. Each threshold is the midpoint of the bracket where the faster route changes in
// `bench/kernels.py --router-sweep`: filter_g16 from 49,152 fp32 rows, exact_bf16 from 6,144 bf16
// rows. The choice changes no number: every route is the wave route bit for bit. (The CPU tests
// build other thresholds to run both sides on a few rows.)
#ifndef TD_ROUTER_G16_FROM_ROWS_F32
#define TD_ROUTER_G16_FROM_ROWS_F32 49152
#endif
#ifndef TD_ROUTER_EXACT_FROM_ROWS_BF16
#define TD_ROUTER_EXACT_FROM_ROWS_BF16 6144
#endif
constexpr int64_t kG16FromRowsF32 = TD_ROUTER_G16_FROM_ROWS_F32;
constexpr int64_t kExactFromRowsBf16 = TD_ROUTER_EXACT_FROM_ROWS_BF16;

// What threads_per_row 0 runs: kDefaultRoute, or from the dtype's row count on filter_g16 (f32) /
// exact_bf16 (bf16; filter_g16 where the table route does not fit)
template <int DT>
inline int default_route(int64_t rows) {
  int64_t from = DT == TD_BF16 ? kExactFromRowsBf16 : kG16FromRowsF32;
#ifdef TD_ROUTER_FROM_ROWS_PROBE
  TD_ROUTER_FROM_ROWS_PROBE(DT, from);  // the CPU tests' lowered thresholds (both sides on a few rows)
#endif
  if (rows < from) return kDefaultRoute;
  return DT == TD_BF16 ? kRouteExactBf16 : kRouteFilterG16;
}

template <int DT>
int launch(const void* logits, const float* bias, const float* bias_vl, const uint8_t* image_rows, float* weights,
           int64_t* ids, int64_t rows, int64_t experts, int topk, float route_scale, int fault, int tpr,
           hipStream_t s) {
  if (tpr == 0) tpr = default_route<DT>(rows);
#ifdef TD_ROUTER_ROUTE_PROBE
  TD_ROUTER_ROUTE_PROBE(tpr);  // the CPU tests' record of the route a call ran
#endif
  if (tpr < 0) {
#define TD_ARGS rows, experts, s, logits, bias, bias_vl, image_rows, weights, ids, topk, route_scale, fault
    switch (tpr) {
      case kRouteWave: launch_wave<DT, 1>(TD_ARGS); break;
      case kRouteWaveLb: launch_wave<DT, 4>(TD_ARGS); break;
      case kRouteFilter: launch_filter<DT, false, 0>(TD_ARGS); break;
      case kRouteFilterRedux: launch_filter<DT, true, 0>(TD_ARGS); break;
      case kRouteFilterG16: launch_filter<DT, false, 16>(TD_ARGS); break;
      case kRouteExactBf16:  // bf16 logits it fits; anything else filter_g16 (the table is bf16's)
        if (exact_fits(DT, experts, logits, bias, bias_vl)) launch_exact(TD_ARGS);
        else launch_filter<DT, false, 16>(TD_ARGS);
        break;
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

extern "C" int td_moe_route_score_bound(uint64_t start, uint64_t count, float margin_scale, uint32_t* bad,
                                        uint32_t* example, int64_t threads, void* stream) {
  if (threads <= 0 || threads % 256 != 0 || threads > (int64_t)256 << 20) return TD_BAD_SHAPE;
  hipLaunchKernelGGL(moe_route_score_bound, dim3((unsigned int)(threads / 256)), dim3(256), 0,
                     static_cast<hipStream_t>(stream), start, count, margin_scale, (uint64_t)threads, bad, example);
  return td::launch_status();
}

extern "C" int td_moe_route_table_check(uint32_t* bad, uint32_t* example, void* stream) {
  hipLaunchKernelGGL(moe_route_table_fill, dim3(1), dim3(256), 0, static_cast<hipStream_t>(stream));
  hipLaunchKernelGGL(moe_route_table_check, dim3(1), dim3(256), 0, static_cast<hipStream_t>(stream), bad, example);
  return td::launch_status();
}
