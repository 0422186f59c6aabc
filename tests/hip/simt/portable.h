// A stand-in for hip/portable.h that runs a kernel source on the CPU: every GPU thread of a block
// is a fiber (its own stack, switched with ucontext on the calling thread: no OS thread a GPU
// thread, so no scheduler or futex traffic; the lanes interleave only at barriers, the one place
// lanes meet on a GPU too), blocks run one after another, and a wave (warpSize lanes, 32 or 64:
// chosen at run time with simt_set_warp_size) shares one barrier. A shuffle is "each lane
// publishes its value and where it is in the source, barrier, each lane reads its source,
// barrier". Shuffles are full-mask (as on NVIDIA): when the lanes of a wave are not all at the
// same shuffle of the source, or a lane has already left, the launch reports an error
// (hipGetLastError) instead of the results; so does a barrier that not every lane reaches (no
// fiber can run on: the launch stops there), and an exception inside the kernel.
// __shared__ is a static (one block at a time); __syncthreads is a barrier over the block.
//
// Only for tests (tests/hip/test_hip_moe_route_simt.py): it checks the kernel's logic and its
// wave-uniformity on warp32 and wave64 without a GPU; the maths library is the host's, so
// transcendental results may differ from the GPU's by an ulp.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>
#include <atomic>
#include <functional>
#include <memory>
#include <stdexcept>
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
// A barrier of `expected` fibers: the last to arrive opens the next phase; the others yield
// until it has. Dropping (a lane that returns) lowers `expected` for this phase and the next.
struct Barrier {
  int expected = 0, arrived = 0;
  uint64_t phase = 0;
};
struct Ctx {
  dim3 tid, bid;
  int lane = 0;               // lane in its wave
  Barrier* wave = nullptr;    // this thread's wave
  Barrier* block = nullptr;
  uint64_t* slots = nullptr;  // one per lane of this thread's wave
  int* sites = nullptr;       // the source line of each lane's current shuffle
  int* left = nullptr;        // lanes of this wave that have returned
};
struct Fiber {
  ucontext_t uc;
  Ctx ctx;
  bool done = false;
};
inline int warp_size = 32;
inline int resident_blocks = 3;  // a persistent launch's grid: few, so blocks loop over row blocks
inline dim3 block_dim, grid_dim;
inline thread_local Ctx ctx;  // the running fiber's (the scheduler sets it before each switch)
inline std::atomic<int> diverged{0};  // the first source line where a wave's lanes disagreed (-1: stuck)
inline thread_local ucontext_t scheduler;
inline thread_local Fiber* running = nullptr;
inline thread_local uint64_t progress = 0;  // arrivals, phases opened and exits: a pass without any is stuck
inline thread_local std::function<void()>* body = nullptr;
constexpr size_t kStack = 256 * 1024;  // a fiber's stack (pages touched only as deep as a kernel goes)
inline thread_local std::vector<std::unique_ptr<char[]>> stacks;  // reused from launch to launch

inline void report(int line) {
  int none = 0;
  diverged.compare_exchange_strong(none, line);
}
inline void yield() { swapcontext(&running->uc, &scheduler); }
inline void wait(Barrier* b) {
  const uint64_t mine = b->phase;
  ++progress;
  if (++b->arrived == b->expected) {
    b->arrived = 0;
    ++b->phase;
    return;
  }
  while (b->phase == mine) yield();
}
inline void drop(Barrier* b) {
  ++progress;
  if (--b->expected > 0 && b->arrived == b->expected) {
    b->arrived = 0;
    ++b->phase;
  }
}
inline void fiber_entry() {
  try {
    (*body)();
  } catch (...) {
    report(-2);  // (the threads' stand-in ended the process here)
  }
  // a lane that returns leaves its wave's barrier, so the others do not wait for it
  __atomic_add_fetch(ctx.left, 1, __ATOMIC_SEQ_CST);
  drop(ctx.wave);
  running->done = true;
}  // uc_link: back to the scheduler

template <typename K, typename... A>
void launch(K kernel, dim3 grid, dim3 block, A... args) {
  if (block.x % (unsigned)warp_size) throw std::runtime_error("block not a multiple of the wave");
  block_dim = block;
  grid_dim = grid;
  const int waves = (int)block.x / warp_size;
  while (stacks.size() < block.x) stacks.emplace_back(new char[kStack]);
  std::function<void()> run = [&] { kernel(args...); };
  body = &run;
  std::vector<Fiber> fibers(block.x);
  for (unsigned int b = 0; b < grid.x; ++b) {
    Barrier block_bar{(int)block.x};
    std::vector<Barrier> wave_bars(waves, Barrier{warp_size});
    std::vector<uint64_t> slots(block.x);
    std::vector<int> sites(block.x), left(waves);
    for (unsigned int t = 0; t < block.x; ++t) {
      Fiber& f = fibers[t];
      f.done = false;
      f.ctx.tid = dim3(t);
      f.ctx.bid = dim3(b);
      f.ctx.lane = (int)t % warp_size;
      f.ctx.wave = &wave_bars[t / warp_size];
      f.ctx.block = &block_bar;
      f.ctx.slots = slots.data() + (t / warp_size) * warp_size;
      f.ctx.sites = sites.data() + (t / warp_size) * warp_size;
      f.ctx.left = left.data() + t / warp_size;
      getcontext(&f.uc);
      f.uc.uc_stack.ss_sp = stacks[t].get();
      f.uc.uc_stack.ss_size = kStack;
      f.uc.uc_link = &scheduler;
      makecontext(&f.uc, fiber_entry, 0);
    }
    // round robin until every fiber has returned; a pass in which none moved is a barrier that
    // not every lane reaches (on a GPU: a hang), reported, and the launch stops
    for (bool live = true; live;) {
      live = false;
      const uint64_t before = progress;
      for (Fiber& f : fibers) {
        if (f.done) continue;
        running = &f;
        ctx = f.ctx;
        swapcontext(&scheduler, &f.uc);
        live = live || !f.done;
      }
      if (live && progress == before) {
        report(-1);
        return;
      }
    }
  }
}
}  // namespace simt
#define threadIdx (simt::ctx.tid)
#define blockIdx (simt::ctx.bid)
#define blockDim (simt::block_dim)
#define gridDim (simt::grid_dim)
#define warpSize (simt::warp_size)
#define __syncthreads() (simt::wait(simt::ctx.block))
#define hipLaunchKernelGGL(k, grid, block, shmem, stream, ...) simt::launch(k, grid, block __VA_OPT__(,) __VA_ARGS__)

inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

inline hipError_t hipGetLastError() { return simt::diverged.exchange(0) ? 98 : 0; }
inline const char* hipGetErrorString(hipError_t) { return "simt: lanes of a wave at different shuffles, a barrier not every lane reaches, or an exception"; }

template <typename T> inline T simt_exchange(T v, int src_in_wave, int line) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  simt::ctx.slots[simt::ctx.lane] = u;
  simt::ctx.sites[simt::ctx.lane] = line;
  simt::wait(simt::ctx.wave);
  bool together = __atomic_load_n(simt::ctx.left, __ATOMIC_SEQ_CST) == 0;
  for (int l = 0; l < warpSize; ++l) together = together && simt::ctx.sites[l] == line;
  if (!together) {
    int none = 0;
    simt::diverged.compare_exchange_strong(none, line);
  }
  const uint64_t r = simt::ctx.slots[src_in_wave];
  simt::wait(simt::ctx.wave);
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
  simt::wait(simt::ctx.wave);
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
  simt::wait(simt::ctx.wave);
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
