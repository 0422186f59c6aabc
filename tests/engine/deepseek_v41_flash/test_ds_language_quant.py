"""The engine's reading of quantised checkpoints (`engine/deepseek_v41_flash/quant.py`):
FP4 decoding by its bit fields, block scales laid out per output row, the dequantising matmul,
and refusals naming the tensor."""
import pytest
import torch

from engine.deepseek_v41_flash.config import Config
from engine.deepseek_v41_flash import quant as Q
from engine.errors import EngineInputError
from tensordiff.models.deepseek_v41_flash.synthetic_language import quantise, synth

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_fp4_codes_decode_to_the_e2m1_grid_low_nibble_first():
    codes = torch.arange(16, dtype=torch.uint8)
    packed = codes[0::2] | (codes[1::2] << 4)  # element 2i in the low nibble
    assert Q._fp4_values(packed).tolist() == E2M1 + [-v for v in E2M1]


def _stored(fmt, name, shape):
    return quantise(fmt, name, synth(name, shape, "bfloat16"))


@pytest.mark.parametrize("fmt,shape", [("fp8", (70, 96)), ("fp4", (16, 64))])
def test_dense_is_each_value_times_its_own_block_scale(fmt, shape):
    name = "layers.0.attn.wq_a.weight"
    t = _stored(fmt, name, shape)
    w = Q.prepare(t, name, fmt, "cpu")
    raw = t[name].view(torch.uint8) if fmt == "fp4" else t[name]
    scale = t[Q.scale_name(name)].float()
    dense = w.dense()
    rows = 32 if fmt == "fp8" else 1
    for r in (0, shape[0] - 1):  # first and last row (a partial block row for fp8)
        for b in range(shape[1] // 32):
            vals = Q._fp4_values(raw[r])[b * 32:(b + 1) * 32] if fmt == "fp4" else raw[r, b * 32:(b + 1) * 32].float()
            torch.testing.assert_close(dense[r, b * 32:(b + 1) * 32], vals * scale[r // rows, b], rtol=0, atol=0)


def test_matmul_rounds_the_input_to_fp8_only_with_kernel_quantisation():
    name = "layers.0.ffn.shared_experts.w2.weight"
    w = Q.prepare(_stored("fp8", name, (64, 32)), name, "fp8", "cpu")
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    exact = torch.nn.functional.linear(x, w.dense().to(torch.bfloat16))
    torch.testing.assert_close(w.matmul(x, kernel_quant=False), exact, rtol=0, atol=0)
    kernel = w.matmul(x, kernel_quant=True)
    assert kernel.dtype == torch.bfloat16
    want = (Q.fp8(x).float() @ w.dense().T).to(torch.bfloat16)
    torch.testing.assert_close(kernel, want, rtol=0, atol=0)
    assert not torch.equal(kernel, exact)


def test_stacked_experts_index_like_the_dense_stack():
    names = [f"layers.0.ffn.experts.{e}.w1.weight" for e in range(3)]
    ws = [Q.prepare(_stored("fp4", n, (32, 64)), n, "fp4", "cpu") for n in names]
    bank = Q.QuantWeight.stack(ws)
    assert bank.shape[0] == 3
    torch.testing.assert_close(bank[1].dense(), ws[1].dense(), rtol=0, atol=0)


def test_backend_wrapper_routes_only_quantised_weights():
    class Plain:
        calls = 0

        def linear(self, x, w, b):
            Plain.calls += 1
            return x @ w.T

        def rms_norm(self, *a):
            return "inner"

    be = Q.QuantBackend(Plain(), kernel_quant=False)
    name = "layers.0.attn.wkv.weight"
    w = Q.prepare(_stored("fp8", name, (32, 64)), name, "fp8", "cpu")
    x = torch.randn(2, 64)
    be.linear(x, w, None)
    assert Plain.calls == 0
    be.linear(x, torch.randn(8, 64), None)
    assert Plain.calls == 1 and be.rms_norm() == "inner"


def test_formats_follow_the_config():
    fp8 = Config(dtype="fp8", expert_dtype="fp4")
    assert Q.weight_format(fp8, "layers.3.attn.wq_b.weight") == "fp8"
    assert Q.weight_format(fp8, "layers.3.attn.wo_a.weight") is None  # bf16 in the release
    assert Q.weight_format(fp8, "layers.3.attn.indexer.weights_proj.weight") is None
    assert Q.weight_format(fp8, "layers.3.ffn.experts.7.w2.weight") == "fp4"
    assert Q.weight_format(fp8, "layers.3.ffn.shared_experts.w2.weight") == "fp8"
    assert Q.weight_format(fp8, "layers.1.engram.embed.weight") == "fp8-rows"
    assert Q.weight_format(fp8, "layers.3.ffn.gate.weight") is None
    assert Q.weight_format(Config(dtype="fp8", expert_dtype=None), "layers.3.ffn.experts.7.w2.weight") == "fp8"
    assert Q.weight_format(Config(dtype="bf16", expert_dtype=None), "layers.3.attn.wq_b.weight") is None


@pytest.mark.parametrize("edit,match", [
    (lambda t, n: t.update({n: t[n].to(torch.bfloat16)}), r"layers\.0\.attn\.wq_a\.weight: stored as bfloat16"),
    (lambda t, n: t.update({Q.scale_name(n): t[Q.scale_name(n)].float()}), r"wq_a\.scale: scale stored as float32"),
    (lambda t, n: t.update({Q.scale_name(n): t[Q.scale_name(n)][:, :1]}), r"wq_a\.scale: scale has shape \[1, 1\]"),
])
def test_prepare_refuses_what_it_does_not_understand(edit, match):
    name = "layers.0.attn.wq_a.weight"
    t = _stored("fp8", name, (32, 64))
    edit(t, name)
    with pytest.raises(EngineInputError, match=match):
        Q.prepare(t, name, "fp8", "cpu")


def test_a_quantised_tensor_where_a_plain_one_is_declared_is_refused():
    name = "layers.0.attn.wq_a.weight"
    t = _stored("fp8", name, (32, 64))
    with pytest.raises(EngineInputError, match="not cast silently"):
        Q.weight(t, name, Config(dtype="bf16", expert_dtype=None), torch.float32, "cpu")
