// Element types, 16-byte vector access and block reductions shared by the kernel families.
//
// bf16 is handled as its raw 16 bits: the vendor bf16 types differ (__nv_bfloat16,
// __hip_bfloat16, ROCm 5.2's hip_bfloat16 class), the bit conversions do not. The f32 -> bf16
// conversion rounds to nearest even with NaN kept quiet, as torch's `.to(torch.bfloat16)`.
#pragma once
#include "portable.h"
#include "kernels.h"

namespace td {

__device__ inline float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(((uint32_t)b) << 16); }

__device__ inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// Elem<TD_F32> / Elem<TD_BF16>: storage type, elements per 16 bytes, conversions.
template <int DT> struct Elem;
template <> struct Elem<TD_F32> {
  typedef float raw;
  static constexpr int kPer16 = 4;
  __device__ static float get(raw v) { return v; }
  __device__ static raw put(float f) { return f; }
  __device__ static void unpack(uint4 u, float* f) {
    f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
  }
  __device__ static uint4 pack(const float* f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  }
};
template <> struct Elem<TD_BF16> {
  typedef uint16_t raw;
  static constexpr int kPer16 = 8;
  __device__ static float get(raw v) { return bf16_bits_to_f32(v); }
  __device__ static raw put(float f) { return f32_to_bf16_bits(f); }
  __device__ static void unpack2(uint32_t w, float* f) {
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
  }
  __device__ static uint32_t pack2(float a, float b) {
    return (uint32_t)f32_to_bf16_bits(a) | ((uint32_t)f32_to_bf16_bits(b) << 16);
  }
  __device__ static void unpack(uint4 u, float* f) {
    unpack2(u.x, f); unpack2(u.y, f + 2); unpack2(u.z, f + 4); unpack2(u.w, f + 6);
  }
  __device__ static uint4 pack(const float* f) {
    return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
  }
};

// Load / store kPer16 consecutive elements (16 bytes) as floats; p must be 16-byte aligned.
template <int DT> __device__ inline void load16(const void* p, float* f) {
  Elem<DT>::unpack(*reinterpret_cast<const uint4*>(p), f);
}
template <int DT> __device__ inline void store16(void* p, const float* f) {
  *reinterpret_cast<uint4*>(p) = Elem<DT>::pack(f);
}
// n (a multiple of 4) floats from 16-byte aligned fp32 memory.
__device__ inline void load_f32(const float* p, float* f, int n) {
  for (int i = 0; i < n; i += 4) {
    float4 v = *reinterpret_cast<const float4*>(p + i);
    f[i] = v.x; f[i + 1] = v.y; f[i + 2] = v.z; f[i + 3] = v.w;
  }
}

__host__ __device__ inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Sum over the whole block; every thread gets the total. Reads and writes `scratch`
// (PORT_MAX_WARPS_PER_BLOCK floats); all threads of the block must call it.
__device__ inline float block_sum(float v, float* scratch) {
  const int ws = warpSize;
  for (int o = ws / 2; o > 0; o >>= 1) v += port_shfl_xor(v, o, ws);
  const int lane = threadIdx.x % ws, warp = threadIdx.x / ws, n_warps = (blockDim.x + ws - 1) / ws;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < n_warps; ++w) total += scratch[w];  // same order in every thread
  __syncthreads();  // scratch may be reused by the caller's next reduction
  return total;
}

inline int launch_status() {
  hipError_t e = hipGetLastError();
  return e == hipSuccess ? 0 : (int)e;
}

inline unsigned int blocks_for(int64_t work, int threads) {
  return (unsigned int)((work + threads - 1) / threads);
}

}  // namespace td
