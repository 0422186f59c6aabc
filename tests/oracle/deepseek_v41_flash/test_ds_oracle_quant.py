"""The oracle's reading of the official low-precision formats (`oracle/deepseek_v41_flash/quant.py`)
and its refusals: a quantised weight without its scale, or stored in a format the config does not
declare, is bad input naming the tensor (nothing is cast silently)."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from oracle.deepseek_v41_flash import quant as Q
from tensordiff.errors import BadInput
from tensordiff.models.deepseek_v41_flash.synthetic_language import quantise, synth, tiny_language_checkpoint


def test_kernel_quantisation_round_trips():
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 0.26])
    assert Q._e2m1(v).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 0.5]
    x = torch.zeros(64)
    x[0], x[1] = 6.0, 2.9  # block scale 1: 2.9 -> 3
    assert Q.fp4_round_trip(x, 32)[:2].tolist() == [6.0, 3.0]
    x[0], x[1] = 448.0, 1.0 + 2 ** -6
    assert Q.fp8_round_trip(x)[:2].tolist() == [448.0, 1.0]


def test_act_quant_scales_are_powers_of_two_from_the_block_max():
    x = torch.zeros(2, 64)
    x[0, 0], x[0, 40], x[1, 3] = 448.0, 449.0, 1e-9  # 449/448 rounds the scale up to 2; a near-zero block clamps
    q, s = Q.act_quant(x)
    assert s.tolist() == [[1.0, 2.0], [2.0 ** -22, 2.0 ** -22]]  # amax clamps at 1e-4: 1e-4 / 448 = 2^-22.09
    assert q.float()[0, 40].item() == 224.0  # 449 / 2 -> nearest e4m3 (224, spacing 16 there)


def test_fp4_unpacking_low_nibble_first_and_sign_bit():
    packed = torch.tensor([[0x21, 0x9F]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    # 0x21: low 1 -> 0.5, high 2 -> 1.0; 0x9F: low 0xF -> -6, high 0x9 -> -0.5
    assert Q.unpack_fp4(packed).tolist() == [[0.5, 1.0, -6.0, -0.5]]


@pytest.mark.parametrize("fmt,shape", [("fp8", (80, 96)), ("fp4", (8, 64))])
def test_dequantise_inverts_the_checkpoint_writer(fmt, shape):
    """The writer (harness) and the oracle's reader are independent code: every dequantised value
    over its block's scale is a grid value within range, and the scales differ between blocks."""
    name = "layers.0.attn.wq_b.weight"
    stored = quantise(fmt, name, synth(name, shape, "bfloat16"))
    w, s = stored[name], stored["layers.0.attn.wq_b.scale"]
    assert w.dtype == (Q.FP4 if fmt == "fp4" else Q.FP8) and s.dtype == Q.SCALE
    deq = Q.dequantise(w, s)
    assert deq.shape == shape
    # each value within half a grid step of the gained master: relative to its block's scale
    scales = Q.row_scales(w, s).repeat_interleave(32, dim=1)
    values = deq / scales
    assert (values.abs() <= (6.0 if fmt == "fp4" else 448.0)).all()
    assert torch.equal(values, Q.weight_values(w))
    # and it is the writer's master (times its per-block gain) within the format's rounding
    from tensordiff.models.deepseek_v41_flash.synthetic_language import _block_gains

    gained = synth(name, shape, "bfloat16").float() * _block_gains(name, *shape, 32 if fmt == "fp8" else 1)
    err = (deq - gained).abs()
    bound = scales * 1.0 if fmt == "fp4" else gained.abs() * 2 ** -4 + scales * 2 ** -9
    assert (err <= bound).all()
    assert len(set(s.float().flatten().tolist())) > 1  # the blocks' scales differ (the layout matters)


def test_block_scaled_gemm_is_the_fp8_input_times_the_exact_weight():
    g = torch.Generator().manual_seed(0)
    name = "layers.0.ffn.shared_experts.w1.weight"
    stored = quantise("fp8", name, synth(name, (64, 96), "bfloat16"))
    w, s = stored[name], stored["layers.0.ffn.shared_experts.w1.scale"]
    x = torch.randn(5, 96, generator=g).to(torch.bfloat16)
    got = Q.block_scaled_gemm(x, w, s)
    ref = Q.fp8_round_trip(x).float() @ Q.dequantise(w, s).T
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7)  # one sum, another order
    plain = x.float() @ Q.dequantise(w, s).T
    assert (got - plain).abs().max() > 1e-3  # the input rounding is live


def test_quant_linear_semantic_mode_is_exact_dequantisation():
    lin = Q.QuantLinear(64, 32, "fp4")
    name = "layers.0.ffn.experts.1.w2.weight"
    stored = quantise("fp4", name, synth(name, (32, 64), "bfloat16"))
    lin.weight = torch.nn.Parameter(stored[name], requires_grad=False)
    lin.scale = torch.nn.Parameter(stored["layers.0.ffn.experts.1.w2.scale"], requires_grad=False)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    exact = x @ Q.dequantise(lin.weight, lin.scale).T
    lin.kernel = False
    torch.testing.assert_close(lin(x), exact, rtol=0, atol=0)
    lin.kernel = True
    assert (lin(x) - exact).abs().max() > 1e-3  # the kernels' FP8 input


# ----------------------------------------------------------------------------- refusals


def _tampered(tmp_path, edit):
    """A copy of the quantised tiny checkpoint with `edit(tensors, config, weight_map)` applied."""
    src = tiny_language_checkpoint(quantised=True)
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    shard = dst / "model-00001-of-00001.safetensors"
    tensors = load_file(str(shard))
    cfg = json.loads((dst / "config.json").read_text())
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    edit(tensors, cfg, index["weight_map"])
    save_file(tensors, str(shard))
    (dst / "config.json").write_text(json.dumps(cfg))
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def _build(path):
    from oracle.deepseek_v41_flash.config import ModelArgs
    from oracle.deepseek_v41_flash.model import build

    return build(ModelArgs.from_dir(path), path, torch.bfloat16, kernel_quant=True)


def test_the_quantised_checkpoint_loads_with_its_formats():
    model = _build(tiny_language_checkpoint(quantised=True))
    attn, ffn = model.layers["0"].attn, model.layers["0"].ffn
    assert attn.wq_a.weight.dtype == Q.FP8 and attn.wq_a.scale.dtype == Q.SCALE
    assert attn.wo_a.weight.dtype == torch.bfloat16  # declared bf16 in the official model
    assert ffn.experts[0].w1.weight.dtype == Q.FP4 and ffn.shared_experts.w1.weight.dtype == Q.FP8
    assert model.layers["1"].engram.embed.weight.dtype == Q.FP8


def _drop_scale(t, cfg, wmap):
    del t["layers.0.attn.wkv.scale"], wmap["layers.0.attn.wkv.scale"]


def _scale_fp32(t, cfg, wmap):
    t["layers.0.attn.wkv.scale"] = t["layers.0.attn.wkv.scale"].float()


def _fp8_under_bf16_config(t, cfg, wmap):
    cfg.update(dtype="bf16", expert_dtype=None)


def _bf16_where_fp8(t, cfg, wmap):
    t["layers.0.attn.wq_a.weight"] = t["layers.0.attn.wq_a.weight"].to(torch.bfloat16)


def _engram_table_without_scale(t, cfg, wmap):
    del t["layers.1.engram.embed.scale"], wmap["layers.1.engram.embed.scale"]


@pytest.mark.parametrize("edit,match", [
    (_drop_scale, r"lacks layers\.0\.attn\.wkv\.scale"),
    (_scale_fp32, r"layers\.0\.attn\.wkv\.scale .*stored as float32"),
    (_fp8_under_bf16_config, r"stored as float8_e4m3fn, but the config makes it a plain"),
    (_bf16_where_fp8, r"layers\.0\.attn\.wq_a\.weight .*stored as bfloat16.*float8_e4m3fn"),
    (_engram_table_without_scale, r"lacks layers\.1\.engram\.embed\.scale"),
])
def test_format_errors_name_the_tensor(tmp_path, edit, match):
    with pytest.raises(BadInput, match=match):
        _build(_tampered(tmp_path, edit))
