// The few names that differ between HIP (hipcc, AMD) and CUDA (nvcc, NVIDIA).
//
// Kernels are written in HIP; this header lets nvcc compile the same file. Kernels call only
// port_* names for anything that differs (warp shuffles, lane masks); the HIP runtime names they
// use (hipLaunchKernelGGL, hipGetLastError, hipStream_t, ...) are mapped to CUDA here, and only
// here, so a ROCm torch's hipify pass finds nothing to rewrite in the kernel sources.
//
// Wavefronts: 64 lanes on CDNA (gfx9), 32 on RDNA and NVIDIA. Nothing is sized by a constant
// warp of 32: use warpSize at run time (ROCm 7 made it non-constexpr), size shared arrays for
// PORT_MAX_WARPS_PER_BLOCK, launch blocks of a multiple of 64 threads.
#pragma once
#include <stdint.h>

#if defined(__HIP__) || defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
  #include <hip/hip_runtime.h>
  #define PORT_HIP 1
  // A ballot is 64 bits wide on AMD whatever the wave size.
  typedef unsigned long long port_lanemask_t;
  template <typename T> __device__ inline T port_shfl_xor(T v, int lane_mask, int width)
  { return __shfl_xor(v, lane_mask, width); }
  template <typename T> __device__ inline T port_shfl(T v, int src_lane, int width)
  { return __shfl(v, src_lane, width); }
  __device__ inline port_lanemask_t port_ballot(int pred) { return __ballot(pred); }
  // Lanes of one wave exchange through shared memory: a wave runs in lockstep on AMD, so only
  // the compiler must be kept from moving shared loads and stores across this point.
  __device__ inline void port_wave_sync() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
  }
  // Fast approximations (v_exp_f32 / v_log_f32 / v_sqrt_f32, about 1 ulp, denormals flushed):
  // only for the router's filter, whose margin covers errors far larger (moe_route.hip).
  __device__ inline float port_fast_exp(float x) { return __expf(x); }
  __device__ inline float port_fast_log(float x) { return __logf(x); }
  __device__ inline float port_fast_sqrt(float x) { return __fsqrt_rn(x); }
  // Two 16-bit lanes of a 32-bit word at once, each wrapping mod 2^16 (the router's table index,
  // two bf16 logits a word): plain integer operations here (the compiler may pack them).
  __device__ inline uint32_t port_vadd2_u16(uint32_t a, uint32_t b) {
    return ((a & 0x7fff7fffu) + (b & 0x7fff7fffu)) ^ ((a ^ b) & 0x80008000u);
  }
  __device__ inline uint32_t port_vmin2_u16(uint32_t a, uint32_t b) {
    const uint32_t lo = (a & 0xffffu) < (b & 0xffffu) ? a & 0xffffu : b & 0xffffu;
    const uint32_t hi = (a >> 16) < (b >> 16) ? a >> 16 : b >> 16;
    return (hi << 16) | lo;
  }
  // Maximum of an unsigned value over `width` lanes, every lane gets it (no one-instruction
  // reduction on AMD: xor shuffles).
  __device__ inline uint32_t port_wave_max_u32(uint32_t v, int width) {
    for (int o = width / 2; o > 0; o >>= 1) {
      const uint32_t other = __shfl_xor(v, o, width);
      v = other > v ? other : v;
    }
    return v;
  }
#elif defined(__CUDACC__)
  #include <cuda_runtime.h>
  // cuda_fp16.h / cuda_bf16.h declare their own shuffles: include them before any macro.
  #include <cuda_fp16.h>
  #include <cuda_bf16.h>
  #define PORT_CUDA 1
  typedef unsigned int port_lanemask_t;
  #define hipError_t           cudaError_t
  #define hipSuccess           cudaSuccess
  #define hipStream_t          cudaStream_t
  #define hipGetLastError      cudaGetLastError
  #define hipGetErrorString    cudaGetErrorString
  #define hipDeviceSynchronize cudaDeviceSynchronize
  #define hipGetDevice         cudaGetDevice
  #define hipDeviceGetAttribute cudaDeviceGetAttribute
  #define hipDeviceAttributeWarpSize cudaDevAttrWarpSize
  #define hipDeviceAttributeMultiprocessorCount cudaDevAttrMultiProcessorCount
  #define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
  #define HIP_KERNEL_NAME(...) __VA_ARGS__
  #define hipLaunchKernelGGL(k, grid, block, shmem, stream, ...) \
    do { k<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__); } while (0)
  // Full-mask *_sync: every call site must be reached by all lanes of the warp (no shuffles in
  // divergent branches); a warp is 32 lanes here, so the full mask is exact.
  template <typename T> __device__ inline T port_shfl_xor(T v, int lane_mask, int width)
  { return __shfl_xor_sync(0xffffffffu, v, lane_mask, width); }
  template <typename T> __device__ inline T port_shfl(T v, int src_lane, int width)
  { return __shfl_sync(0xffffffffu, v, src_lane, width); }
  __device__ inline port_lanemask_t port_ballot(int pred) { return __ballot_sync(0xffffffffu, pred); }
  // Lanes of one warp exchange through shared memory (independent thread scheduling since Volta:
  // the barrier also orders the memory accesses).
  __device__ inline void port_wave_sync() { __syncwarp(); }
  // Fast approximations, denormals flushed: what __expf / __logf compile to under -ftz=true (the
  // CUDA guide: at most 2 + floor(|1.173 x|) ulp, and 2^-21.41 absolute on [0.5, 2] else 3 ulp),
  // without the non-ftz forms' denormal fix-ups (~6 instructions an expert), and sqrt.approx: only
  // for the router's filter, whose margin covers errors far larger (moe_route.hip).
  __device__ inline float port_fast_exp(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.44269504f));
    return r;
  }
  __device__ inline float port_fast_log(float x) {
    float r;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r * 0.693147181f;
  }
  __device__ inline float port_fast_sqrt(float x) {
    float r;
    asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
  }
  // Two 16-bit lanes of a 32-bit word at once, each wrapping mod 2^16: one VIADD.16x2 /
  // VIMNMX.U16x2 each on sm_90 (the router's table index, two bf16 logits a word).
  __device__ inline uint32_t port_vadd2_u16(uint32_t a, uint32_t b) { return __vadd2(a, b); }
  __device__ inline uint32_t port_vmin2_u16(uint32_t a, uint32_t b) { return __vminu2(a, b); }
  // Maximum of an unsigned value over `width` lanes, every lane gets it: one REDUX instruction
  // over a full warp on sm_80+, xor shuffles otherwise.
  __device__ inline uint32_t port_wave_max_u32(uint32_t v, int width) {
  #if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (width == 32) return __reduce_max_sync(0xffffffffu, v);
  #endif
    for (int o = width / 2; o > 0; o >>= 1) {
      const uint32_t other = __shfl_xor_sync(0xffffffffu, v, o, width);
      v = other > v ? other : v;
    }
    return v;
  }
#else
  #error "compile with hipcc (-x hip) or nvcc (-x cu)"
#endif

// 1024 threads / the narrowest wave (32): enough slots for one value per warp of any block.
#define PORT_MAX_WARPS_PER_BLOCK 32
// The narrowest wave any target has (NVIDIA, RDNA): register arrays sized per lane use it.
constexpr int kNarrowestWave = 1024 / PORT_MAX_WARPS_PER_BLOCK;

// The current device's wave width, asked once per device on the host (64 when it cannot be
// asked: the wider wave means fewer rows per block, so a launch sized by it misses no row).
inline int port_device_warp_size() {
  static int known[64] = {0};
  int dev = 0;
  if (hipGetDevice(&dev) != hipSuccess || dev < 0 || dev >= 64) return 64;
  if (known[dev] == 0) {
    int ws = 0;
    known[dev] = (hipDeviceGetAttribute(&ws, hipDeviceAttributeWarpSize, dev) == hipSuccess && ws > 0) ? ws : 64;
  }
  return known[dev];
}

// How many blocks of `kernel` (`threads` a block, no dynamic shared memory) the current device
// holds at once: the grid of a persistent launch. 0 when it cannot be asked (the caller then
// launches a block per unit of work).
template <typename K>
inline int port_resident_blocks(K kernel, int threads) {
  int dev = 0, sms = 0, per_sm = 0;
  if (hipGetDevice(&dev) != hipSuccess || hipDeviceGetAttribute(&sms, hipDeviceAttributeMultiprocessorCount, dev) !=
      hipSuccess || hipOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != hipSuccess) {
    (void)hipGetLastError();  // not the launch's error
    return 0;
  }
  return sms * per_sm;
}

// IEEE single-rounding multiply and add: keeps the compiler from contracting a*b + c*d into an
// FMA, so a kernel rounds exactly as the unfused torch reference does.
__device__ inline float port_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float port_add_rn(float a, float b) { return __fadd_rn(a, b); }
