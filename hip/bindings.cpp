// torch binding of the kernel launchers: plain C++, no GPU headers, so the same file builds
// beside nvcc objects (CUDA torch) and hipcc objects (ROCm torch). The Python side
// (engine/backend/hip_ops.py) validates user-facing input and passes the current stream as an
// integer; the checks here guard the raw pointers.
#include <torch/extension.h>

#include "kernels.h"

namespace {

int dtype_code(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat) return TD_F32;
  if (t.scalar_type() == at::kBFloat16) return TD_BF16;
  TORCH_CHECK(false, "tensordiff hip kernels take float32 or bfloat16, not ", t.scalar_type());
  return -1;
}

void require(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be on the GPU");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void require(const at::Tensor& t, const char* name, at::ScalarType st) {
  require(t, name);
  TORCH_CHECK(t.scalar_type() == st, name, " must be ", st, ", not ", t.scalar_type());
}

void check(int rc, const char* what) { TORCH_CHECK(rc == 0, what, ": ", td_error_string(rc)); }

void* as_stream(int64_t s) { return reinterpret_cast<void*>(static_cast<intptr_t>(s)); }

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, int64_t stream) {
  require(x, "x");
  require(w, "weight", at::kFloat);
  const int64_t d = x.size(-1);
  TORCH_CHECK(w.numel() == d, "weight has ", w.numel(), " elements, x rows ", d);
  at::Tensor y = at::empty_like(x);
  check(td_rms_norm(x.data_ptr(), w.data_ptr<float>(), y.data_ptr(), x.numel() / d, d, (float)eps, dtype_code(x),
                    as_stream(stream)),
        "rms_norm");
  return y;
}

at::Tensor rope_rotate_half(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t n_pos,
                            int64_t heads, int64_t max_access_bytes, int64_t stream) {
  require(x, "x");
  require(cos, "cos", at::kFloat);
  require(sin, "sin", at::kFloat);
  const int64_t hd = x.size(-1), table_w = cos.size(-1);
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.numel() == n_pos * table_w, "cos/sin must be [n_pos, w]");
  at::Tensor y = at::empty_like(x);
  check(td_rope_rotate_half(x.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(), y.data_ptr(),
                            x.numel() / hd, heads, n_pos, hd, table_w, (int)max_access_bytes, dtype_code(x),
                            as_stream(stream)),
        "rope_rotate_half");
  return y;
}

at::Tensor patch_gemm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                      int64_t stream) {
  require(x, "x");
  require(w, "weight", x.scalar_type());
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x [m, k] and weight [n, k]");
  const float* b = nullptr;
  if (bias.has_value()) {
    require(*bias, "bias", at::kFloat);
    TORCH_CHECK(bias->numel() == w.size(0), "bias must be [n]");
    b = bias->data_ptr<float>();
  }
  at::Tensor y = at::empty({x.size(0), w.size(0)}, x.options());
  check(td_patch_gemm(x.data_ptr(), w.data_ptr(), b, y.data_ptr(), x.size(0), w.size(0), x.size(1), dtype_code(x),
                      as_stream(stream)),
        "patch_gemm");
  return y;
}

at::Tensor aligner_gather(const at::Tensor& x, const at::Tensor& index, int64_t stream) {
  require(x, "x");
  require(index, "index", at::kInt);
  TORCH_CHECK(x.dim() == 2 && index.dim() == 2 && index.size(1) == 9, "x [n, c] and index [t, 9]");
  const int64_t t = index.size(0), c = x.size(1);
  at::Tensor y = at::empty({t, c * 9}, x.options());
  check(td_aligner_gather(x.data_ptr(), index.data_ptr<int32_t>(), y.data_ptr(), t, c, x.size(0),
                          (int)x.element_size(), as_stream(stream)),
        "aligner_gather");
  return y;
}

std::vector<at::Tensor> moe_route(const at::Tensor& logits, const at::Tensor& bias,
                                  const c10::optional<at::Tensor>& bias_vl,
                                  const c10::optional<at::Tensor>& image_rows, int64_t topk, double route_scale,
                                  bool fault_text_bias_for_images, int64_t threads_per_row, int64_t stream) {
  require(logits, "logits");
  TORCH_CHECK(logits.dim() == 2, "logits must be [rows, experts]");
  const int64_t rows = logits.size(0), experts = logits.size(1);
  require(bias, "bias", at::kFloat);
  TORCH_CHECK(bias.numel() == experts, "bias must be [experts]");
  const float* bvl = nullptr;
  const uint8_t* img = nullptr;
  if (bias_vl.has_value()) {
    require(*bias_vl, "bias_vl", at::kFloat);
    TORCH_CHECK(bias_vl->numel() == experts, "bias_vl must be [experts]");
    bvl = bias_vl->data_ptr<float>();
  }
  if (image_rows.has_value()) {
    require(*image_rows, "image_rows", at::kByte);
    TORCH_CHECK(image_rows->numel() == rows, "image_rows must be [rows]");
    img = image_rows->data_ptr<uint8_t>();
  }
  at::Tensor w = at::empty({rows, topk}, logits.options().dtype(at::kFloat));
  at::Tensor ids = at::empty({rows, topk}, logits.options().dtype(at::kLong));
  check(td_moe_route(logits.data_ptr(), bias.data_ptr<float>(), bvl, img, w.data_ptr<float>(), ids.data_ptr<int64_t>(),
                     rows, experts, (int)topk, (float)route_scale, dtype_code(logits), fault_text_bias_for_images ? 1 : 0,
                     (int)threads_per_row, as_stream(stream)),
        "moe_route");
  return {w, ids};
}

std::vector<at::Tensor> moe_route_score_bound(int64_t start, int64_t count, double margin_scale, int64_t threads,
                                              int64_t stream) {
  TORCH_CHECK(start >= 0 && count > 0 && start + count <= (int64_t)1 << 32, "bit patterns outside 0..2^32-1");
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kInt);
  at::Tensor bad = at::empty({threads}, opts), example = at::empty({threads}, opts);
  check(td_moe_route_score_bound((uint64_t)start, (uint64_t)count, (float)margin_scale,
                                 reinterpret_cast<uint32_t*>(bad.data_ptr<int32_t>()),
                                 reinterpret_cast<uint32_t*>(example.data_ptr<int32_t>()), threads, as_stream(stream)),
        "moe_route_score_bound");
  return {bad, example};
}

std::vector<at::Tensor> moe_route_table_check(int64_t stream) {
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kInt);
  at::Tensor bad = at::empty({256}, opts), example = at::empty({256}, opts);
  check(td_moe_route_table_check(reinterpret_cast<uint32_t*>(bad.data_ptr<int32_t>()),
                                 reinterpret_cast<uint32_t*>(example.data_ptr<int32_t>()), as_stream(stream)),
        "moe_route_table_check");
  return {bad, example};
}

at::Tensor embed_scatter(at::Tensor emb, const at::Tensor& rows, const at::Tensor& src, int64_t stream) {
  require(emb, "emb");
  require(rows, "rows", at::kLong);
  require(src, "src");
  TORCH_CHECK(emb.dim() == 2 && src.dim() == 2 && src.size(1) == emb.size(1) && rows.numel() == src.size(0),
              "emb [n, d], src [m, d], rows [m]");
  check(td_embed_scatter(emb.data_ptr(), rows.data_ptr<int64_t>(), src.data_ptr(), src.size(0), emb.size(1),
                         emb.size(0), dtype_code(emb), dtype_code(src), as_stream(stream)),
        "embed_scatter");
  return emb;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tensordiff HIP kernels (one source for AMD and NVIDIA)";
  m.def("rms_norm", &rms_norm);
  m.def("rope_rotate_half", &rope_rotate_half);
  m.def("patch_gemm", &patch_gemm);
  m.def("aligner_gather", &aligner_gather);
  m.def("moe_route", &moe_route);
  m.def("moe_route_score_bound", &moe_route_score_bound);
  m.def("moe_route_table_check", &moe_route_table_check);
  m.def("embed_scatter", &embed_scatter);
}
