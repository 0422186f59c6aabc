// Host entry points of the kernel families: plain C, no GPU types, so the torch binding
// (bindings.cpp, compiled by the host compiler) links against objects built by hipcc or nvcc.
//
// Every function launches on `stream` (a hipStream_t / cudaStream_t passed as void*), returns
// 0 or an error code that td_error_string() explains, and never synchronises the device, so
// the calls can be captured in a graph. Tensors are contiguous and on the current device.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum td_dtype { TD_F32 = 0, TD_BF16 = 1 };

// Argument errors (negative); positive codes are the runtime's own error codes.
enum td_status {
  TD_OK = 0,
  TD_BAD_DTYPE = -1,
  TD_BAD_SHAPE = -2,
  TD_K_NOT_ALIGNED = -3,  // patch GEMM: K % 16 != 0 (pad the operands at preparation)
  TD_TOPK_TOO_LARGE = -4,
  TD_TOO_MANY_EXPERTS = -5,
};

const char* td_error_string(int code);

// y = x * rsqrt(mean(x^2) + eps) * w, fp32 math. x, y: [rows, d] of `dtype`; w: [d] fp32.
int td_rms_norm(const void* x, const float* w, void* y, int64_t rows, int64_t d, float eps,
                int dtype, void* stream);

// Rotate-half RoPE. x, y: [rows, hd] of `dtype`, rows = (batch, n_pos, heads) flattened, so
// row r uses table row (r / heads) % n_pos. cos, sin: [n_pos, table_w] fp32, table_w = hd / 2
// (DeepSeek's blocked half table, used for both halves) or hd (Qwen3-VL's cat(rot, rot)).
// max_access_bytes caps the width of one access of x (16, 8, 4; 0 = the widest that fits).
int td_rope_rotate_half(const void* x, const float* cos, const float* sin, void* y, int64_t rows,
                        int64_t heads, int64_t n_pos, int64_t hd, int64_t table_w, int max_access_bytes,
                        int dtype, void* stream);

// Tiled y[m, n] = x[m, k] . w[n, k] + bias[n] (bias may be NULL), fp32 accumulation; x, w, y of
// `dtype`. Requires k % 16 == 0: the tile walks k in steps of 16 with no bounds check, which is
// why patch rows (588 columns) are zero-padded to 592 at backend preparation.
int td_patch_gemm(const void* x, const void* w, const float* bias, void* y, int64_t m, int64_t n,
                  int64_t k, int dtype, void* stream);

// y[t, c * 9 + j] = x[index[t, j], c], or 0 where index < 0 (right/bottom padding of the 3x3
// cells). x: [n_src, c] of any 2- or 4-byte element type (a pure copy); index: [t, 9] int32.
int td_aligner_gather(const void* x, const int32_t* index, void* y, int64_t t, int64_t c,
                      int64_t n_src, int elem_bytes, void* stream);

// Dual-bias MoE routing: s = sqrt(softplus(logit)); rank by s + bias_vl on
// rows with image_rows[r] != 0 (when both are given), else s + bias; weights = s of the chosen
// ids / (sum + 1e-20) * route_scale. logits: [rows, experts] of `dtype`; bias, bias_vl: fp32
// [experts]; image_rows: uint8 [rows] or NULL; weights: fp32 [rows, topk]; ids: int64
// [rows, topk] in descending biased score (ties to the lower id). topk <= 8, experts <= 1024.
// fault_text_bias_for_images != 0 plants the fault `router-text-bias-for-images`;
// threads_per_row is 64, 128, 256 (one row per block of that many threads), a named route's
// negative code (-1 wave, -2 wave_lb, -6 filter, -7 filter_redux, -11 filter_g16, -13 exact_bf16:
// bf16 only, other calls run filter_g16) or 0 (the
// default route, moe_route.hip default_route: filter_redux, from a dtype's row count on
// filter_g16 (fp32) / exact_bf16 (bf16)); any other code (a removed route's included: see
// hip/README.md) returns TD_BAD_SHAPE.
int td_moe_route(const void* logits, const float* bias, const float* bias_vl,
                 const uint8_t* image_rows, float* weights, int64_t* ids, int64_t rows,
                 int64_t experts, int topk, float route_scale, int dtype,
                 int fault_text_bias_for_images, int threads_per_row, void* stream);

// The filter routes' bound on sqrt(softplus(l)), checked for the fp32 bit patterns start ..
// start + count - 1 (count up to 2^32: every one): bad[i] counts thread i's patterns whose exact
// score lies outside the bound (margin times margin_scale; 1 is the routes'), example[i] the
// last of them. bad, example: uint32 [threads], threads a multiple of 256.
int td_moe_route_score_bound(uint64_t start, uint64_t count, float margin_scale, uint32_t* bad, uint32_t* example,
                             int64_t threads, void* stream);

// exact_bf16's table of scores, checked for every bf16 bit pattern: bad[i] counts thread i's
// patterns whose looked-up score is not the exact score bit for bit, example[i] the last of them.
// bad, example: uint32 [256].
int td_moe_route_table_check(uint32_t* bad, uint32_t* example, void* stream);

// emb[rows[i]] = src[i] (converted to emb's dtype) for rows[i] in [0, n_emb); others skipped.
// emb: [n_emb, d]; src: [m, d]; rows: int64 [m].
int td_embed_scatter(void* emb, const int64_t* rows, const void* src, int64_t m, int64_t d,
                     int64_t n_emb, int emb_dtype, int src_dtype, void* stream);

#ifdef __cplusplus
}
#endif
