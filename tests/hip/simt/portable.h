// A stand-in for hip/portable.h that runs a kernel source on the CPU: every GPU thread of a block
// is a std::thread, blocks run one after another, and a wave (warpSize lanes, 32 or 64: chosen
// at run time with simt_set_warp_size) shares one barrier. A shuffle is "each lane publishes its
// value and where it is in the source, barrier, each lane reads its source, barrier". Shuffles
// are full-mask (as on NVIDIA): when the lanes of a wave are not all at the same shuffle of the
// source, or a lane has already left, the launch reports an error (hipGetLastError) instead of
// the results; a barrier never reached deadlocks (the harness runs under a time limit).
// __shared__ is a static (one block at a time); __syncthreads is a barrier over the block.
//
// Only for tests (tests/hip/test_hip_moe_route_simt.py): it checks the kernel's logic and its
// wave-uniformity on warp32 and wave64 without a GPU; the maths library is the host's, so
// transcendental results may differ from the GPU's by an ulp.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <atomic>
#include <barrier>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1) : x(a), y(b), z(c) {}
};
struct uint4 { unsigned int x, y, z, w; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct uint2 { unsigned int x, y; };
inline uint4 make_uint4(unsigned int a, unsigned int b, unsigned int c, unsigned int d) { return {a, b, c, d}; }

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
#define __shared__ static
#define HIP_KERNEL_NAME(...) __VA_ARGS__
typedef void* hipStream_t;
typedef int hipError_t;
#define hipSuccess 0

namespace simt {
struct Ctx {
  dim3 tid, bid;
  int lane = 0;                       // lane in its wave
  std::barrier<>* wave = nullptr;     // this thread's wave
  std::barrier<>* block = nullptr;
  uint64_t* slots = nullptr;          // one per lane of this thread's wave
  int* sites = nullptr;               // the source line of each lane's current shuffle
  int* left = nullptr;                // lanes of this wave that have returned
};
inline int warp_size = 32;
inline int resident_blocks = 3;  // a persistent launch's grid: few, so blocks loop over row blocks
inline dim3 block_dim, grid_dim;
inline thread_local Ctx ctx;
inline std::atomic<int> diverged{0};  // the first source line where a wave's lanes disagreed

template <typename K, typename... A>
void launch(K kernel, dim3 grid, dim3 block, A... args) {
  if (block.x % (unsigned)warp_size) throw std::runtime_error("block not a multiple of the wave");
  block_dim = block;
  grid_dim = grid;
  const int waves = (int)block.x / warp_size;
  for (unsigned int b = 0; b < grid.x; ++b) {
    std::barrier<> block_bar((std::ptrdiff_t)block.x);
    std::vector<std::unique_ptr<std::barrier<>>> wave_bars;
    for (int w = 0; w < waves; ++w) wave_bars.emplace_back(new std::barrier<>(warp_size));
    std::vector<uint64_t> slots(block.x);
    std::vector<int> sites(block.x), left(waves);
    std::vector<std::thread> threads;
    for (unsigned int t = 0; t < block.x; ++t) {
      threads.emplace_back([&, t] {
        ctx.tid = dim3(t);
        ctx.bid = dim3(b);
        ctx.lane = (int)t % warp_size;
        ctx.wave = wave_bars[t / warp_size].get();
        ctx.block = &block_bar;
        ctx.slots = slots.data() + (t / warp_size) * warp_size;
        ctx.sites = sites.data() + (t / warp_size) * warp_size;
        ctx.left = left.data() + t / warp_size;
        kernel(args...);
        // a lane that returns leaves its wave's barrier, so the others do not wait for it
        __atomic_add_fetch(ctx.left, 1, __ATOMIC_SEQ_CST);
        ctx.wave->arrive_and_drop();
      });
    }
    for (auto& th : threads) th.join();
  }
}
}  // namespace simt

#define threadIdx (simt::ctx.tid)
#define blockIdx (simt::ctx.bid)
#define blockDim (simt::block_dim)
#define gridDim (simt::grid_dim)
#define warpSize (simt::warp_size)
#define __syncthreads() (simt::ctx.block->arrive_and_wait())
#define hipLaunchKernelGGL(k, grid, block, shmem, stream, ...) simt::launch(k, grid, block __VA_OPT__(,) __VA_ARGS__)

inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

inline hipError_t hipGetLastError() { return simt::diverged.exchange(0) ? 98 : 0; }
inline const char* hipGetErrorString(hipError_t) { return "simt: lanes of a wave at different shuffles"; }

template <typename T> inline T simt_exchange(T v, int src_in_wave, int line) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  simt::ctx.slots[simt::ctx.lane] = u;
  simt::ctx.sites[simt::ctx.lane] = line;
  simt::ctx.wave->arrive_and_wait();
  bool together = __atomic_load_n(simt::ctx.left, __ATOMIC_SEQ_CST) == 0;
  for (int l = 0; l < warpSize; ++l) together = together && simt::ctx.sites[l] == line;
  if (!together) {
    int none = 0;
    simt::diverged.compare_exchange_strong(none, line);
  }
  const uint64_t r = simt::ctx.slots[src_in_wave];
  simt::ctx.wave->arrive_and_wait();
  T out;
  memcpy(&out, &r, sizeof(T));
  return out;
}
template <typename T> inline T port_shfl_xor(T v, int lane_mask, int width, int line = __builtin_LINE()) {
  if (width > warpSize || lane_mask >= width) throw std::runtime_error("shfl_xor outside its width");
  return simt_exchange(v, simt::ctx.lane ^ lane_mask, line);
}
template <typename T> inline T port_shfl(T v, int src_lane, int width, int line = __builtin_LINE()) {
  if (width > warpSize) throw std::runtime_error("shfl width over the wave");
  const int base = simt::ctx.lane - simt::ctx.lane % width;
  return simt_exchange(v, base + src_lane % width, line);
}

// Ballot: every lane's predicate, one bit a lane (64 bits, as on AMD), at one site for all lanes.
inline uint64_t port_ballot(int pred, int line = __builtin_LINE()) {
  simt::ctx.slots[simt::ctx.lane] = pred ? 1 : 0;
  simt::ctx.sites[simt::ctx.lane] = line;
  simt::ctx.wave->arrive_and_wait();
  bool together = __atomic_load_n(simt::ctx.left, __ATOMIC_SEQ_CST) == 0;
  uint64_t mask = 0;
  for (int l = 0; l < warpSize; ++l) {
    together = together && simt::ctx.sites[l] == line;
    if (simt::ctx.slots[l]) mask |= 1ull << l;
  }
  if (!together) {
    int none = 0;
    simt::diverged.compare_exchange_strong(none, line);
  }
  simt::ctx.wave->arrive_and_wait();
  return mask;
}
// Shared memory between the lanes of a wave: a barrier of the wave, at one site of the source
// for all its lanes (as a shuffle: a lane elsewhere or gone is reported).
inline void port_wave_sync(int line = __builtin_LINE()) { simt_exchange(0, simt::ctx.lane, line); }
inline uint32_t port_wave_max_u32(uint32_t v, int width, int line = __builtin_LINE()) {
  for (int o = width / 2; o > 0; o >>= 1) {
    const uint32_t other = port_shfl_xor(v, o, width, line);
    v = other > v ? other : v;
  }
  return v;
}
// Two 16-bit lanes of a word, each mod 2^16 (hip/portable.h's port_vadd2_u16 / port_vmin2_u16),
// written lane by lane here: an independent statement of what the kernel's bit tricks must equal.
inline uint32_t port_vadd2_u16(uint32_t a, uint32_t b) {
  return ((uint32_t)(uint16_t)(a + b)) | ((uint32_t)(uint16_t)((a >> 16) + (b >> 16)) << 16);
}
inline uint32_t port_vmin2_u16(uint32_t a, uint32_t b) {
  const uint16_t a0 = (uint16_t)a, a1 = (uint16_t)(a >> 16), b0 = (uint16_t)b, b1 = (uint16_t)(b >> 16);
  return (uint32_t)(a0 < b0 ? a0 : b0) | ((uint32_t)(a1 < b1 ? a1 : b1) << 16);
}
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned int x) { return __builtin_popcount(x); }

// The fast approximations of the router's filter, made WORSE than the GPUs' on purpose: errors
// of a pseudo-random sign per input at (or beyond) the CUDA guide's worst case for |x| <= 88
// (__expf 2^-15 relative, __logf 2^-21 absolute plus 3 ulp, sqrt 2^-22 relative), denormal
// results flushed. The filter's margin must cover them (every route test passes) and a margin
// made too tight must not (tests/hip/test_hip_moe_route_simt.py plants it).
inline float simt_sign(float x, uint32_t salt) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return ((u ^ salt) * 0x9E3779B1u) & 0x80000000u ? 1.f : -1.f;
}
inline float simt_ftz(float r) { return fabsf(r) < 1.17549435e-38f ? 0.f : r; }
inline float port_fast_exp(float x) { return simt_ftz(expf(x) * (1.f + simt_sign(x, 0u) * 0x1p-15f)); }
inline float port_fast_log(float x) {
  const float r = logf(x);
  return r + simt_sign(x, 0x5bd1e995u) * (0x1p-21f + fabsf(r) * 0x3p-23f);
}
inline float port_fast_sqrt(float x) { return simt_ftz(sqrtf(simt_ftz(x)) * (1.f + simt_sign(x, 0x27d4eb2fu) * 0x1p-22f)); }

#define PORT_MAX_WARPS_PER_BLOCK 32
constexpr int kNarrowestWave = 1024 / PORT_MAX_WARPS_PER_BLOCK;
inline int port_device_warp_size() { return simt::warp_size; }
template <typename K> inline int port_resident_blocks(K, int) { return simt::resident_blocks; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline float port_mul_rn(float a, float b) { return a * b; }
inline float port_add_rn(float a, float b) { return a + b; }
