"""DeepSeek V4.1 Flash read as the released shards store it (`synthetic:tiny-fp8`): `wo_a` FP8 (e4m3)
with an e8m0 block scale, dequantised to bf16 on load; routed experts' packed FP4 in int8 tensors.

- Both sides' reading equals an independent reading of the same bytes by the official rule,
  written here from the facts (safetensors header parsed by hand, e4m3 / e2m1 / e8m0 decoded from
  their bits, bf16 rounded to nearest even), and the converted layout (`tiny-fp8-converted`:
  float4 experts, bf16 `wo_a`) gives both sides the same tensors.
- `tensordiff check` passes the clean engine on both layouts, and names each planted fault of
  the release's conversions at its boundary.
- Anything else is exit 2 naming the tensor, its stored dtype and what was expected.
"""
from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from cli_runner import run_cli
from tensordiff.errors import BadInput
from tensordiff.models.deepseek_v41_flash import faults as D
from tensordiff.models.deepseek_v41_flash.checkpoint import describe
from tensordiff.models.deepseek_v41_flash.synthetic import CONFIGS, _layers_writer, _vision_values, _write, resolve
from tensordiff.models.deepseek_v41_flash.synthetic_language import tiny_language_checkpoint

INDEX = "model.safetensors.index.json"
PROMPT = "A picture: <image> What does it show?"
RELEASE_FAULTS = (D.WO_A_SCALE_DROPPED, D.WO_A_BLOCK_128, D.FP4_INT8_SIGN_EXTENDED)


# ----------------------------------------------------------------------------- the official rule, by hand


def _raw(ckpt: Path, name: str) -> tuple[str, tuple[int, ...], bytes]:
    """(safetensors dtype, shape, bytes) of one tensor, from the shard's header read by hand."""
    shard = ckpt / json.loads((ckpt / INDEX).read_text())["weight_map"][name]
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    entry = json.loads(data[8:8 + n])[name]
    b, e = entry["data_offsets"]
    return entry["dtype"], tuple(entry["shape"]), data[8 + n + b: 8 + n + e]


def _e4m3(codes: np.ndarray) -> np.ndarray:
    """float8 e4m3fn bytes -> float64: sign, 4 exponent bits (bias 7), 3 mantissa bits;
    exponent 0 is subnormal (m/8 * 2^-6); 0x7f / 0xff are NaN."""
    c = codes.astype(np.int64)
    sign = np.where(c >> 7, -1.0, 1.0)
    e, m = (c >> 3) & 0xF, c & 0x7
    mag = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
    mag = np.where((c & 0x7F) == 0x7F, np.nan, mag)
    return sign * mag


def _e8m0(codes: np.ndarray) -> np.ndarray:
    """e8m0 bytes -> 2^(byte - 127) (0xff is NaN)."""
    c = codes.astype(np.int64)
    return np.where(c == 0xFF, np.nan, 2.0 ** (c - 127))


def _e2m1(codes: np.ndarray) -> np.ndarray:
    """4-bit e2m1 codes -> float64: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0;
    exponent 0 is the subnormal m/2."""
    c = codes.astype(np.int64)
    e, m = (c >> 1) & 0x3, c & 0x1
    mag = np.where(e == 0, m * 0.5, 2.0 ** (e - 1) * (1 + m / 2))
    return np.where(c & 0x8, -mag, mag)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even (no NaN here)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def official_wo_a(ckpt: Path, layer: int) -> np.ndarray:
    """bf16 bits of the release's `wo_a` converted by the official rule: blocks of (rows / scale
    rows) x (columns / scale columns), each value times its block's scale in fp32, then bf16."""
    wd, wshape, wb = _raw(ckpt, f"layers.{layer}.attn.wo_a.weight")
    sd, sshape, sb = _raw(ckpt, f"layers.{layer}.attn.wo_a.scale")
    assert (wd, sd) == ("F8_E4M3", "F8_E8M0")
    w = _e4m3(np.frombuffer(wb, np.uint8).reshape(wshape))
    s = _e8m0(np.frombuffer(sb, np.uint8).reshape(sshape))
    br, bc = wshape[0] // sshape[0], wshape[1] // sshape[1]
    out = np.empty(wshape, np.float32)
    for i in range(sshape[0]):
        for j in range(sshape[1]):
            block = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc].astype(np.float32)
            out[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = block * np.float32(s[i, j])  # fp32 product
    return _bf16_bits(out)


def official_expert(ckpt: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(the stored bytes, the dequantised fp32 values [out, in]) of an int8-stored FP4 expert:
    two e2m1 codes a byte, the even element in the low nibble, an e8m0 scale per row and 32."""
    wd, wshape, wb = _raw(ckpt, name)
    sd, sshape, sb = _raw(ckpt, name[: -len("weight")] + "scale")
    assert (wd, sd) == ("I8", "F8_E8M0")
    packed = np.frombuffer(wb, np.uint8).reshape(wshape)
    codes = np.empty((wshape[0], wshape[1] * 2), np.uint8)
    codes[:, 0::2], codes[:, 1::2] = packed & 0xF, packed >> 4
    scale = np.repeat(_e8m0(np.frombuffer(sb, np.uint8).reshape(sshape)), 32, axis=1)
    return packed, (_e2m1(codes) * scale).astype(np.float32)


# ----------------------------------------------------------------------------- both sides' readings


@pytest.fixture(scope="module")
def release() -> Path:
    return tiny_language_checkpoint(quantised=True)


@pytest.fixture(scope="module")
def converted() -> Path:
    return tiny_language_checkpoint(quantised=True, storage="converted")


def _oracle(ckpt: Path, dtype=torch.bfloat16):
    from oracle.deepseek_v41_flash.config import ModelArgs
    from oracle.deepseek_v41_flash.model import build

    return build(ModelArgs.from_dir(ckpt), ckpt, dtype)


def _engine(ckpt: Path, dtype=torch.bfloat16):
    import engine.backend as backends
    from engine.deepseek_v41_flash.model import LanguageModel

    return LanguageModel.load(ckpt, dtype=dtype, backend=backends.get("torch"))


def _bits(t: torch.Tensor) -> np.ndarray:
    """bf16 bit patterns of a tensor that must hold bf16 values (a float32 one only if exactly so)."""
    b = t.to(torch.bfloat16)
    assert torch.equal(b.to(t.dtype), t)  # the bf16 rounding is the conversion's, in every run dtype
    return b.view(torch.int16).numpy().view(np.uint16)


def _experts(ckpt: Path) -> list[str]:
    wmap = json.loads((ckpt / INDEX).read_text())["weight_map"]
    return sorted(n for n in wmap if re.fullmatch(r"layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight", n))


def test_the_synthetic_release_stores_what_the_release_stores(release, converted):
    assert _raw(release, "layers.0.attn.wo_a.weight")[0] == "F8_E4M3"
    assert _raw(release, "layers.0.attn.wo_a.scale")[0] == "F8_E8M0"
    assert {_raw(release, n)[0] for n in _experts(release)} == {"I8"}
    assert _raw(release, "layers.0.ffn.shared_experts.w1.weight")[0] == "F8_E4M3"  # not a routed expert
    assert _raw(converted, "layers.0.attn.wo_a.weight")[0] == "BF16"
    assert "layers.0.attn.wo_a.scale" not in json.loads((converted / INDEX).read_text())["weight_map"]
    assert {_raw(converted, n)[0] for n in _experts(converted)} == {"F4"}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_oracle_reads_the_release_by_the_official_rule(release, dtype):
    from oracle.deepseek_v41_flash import quant as Q

    model = _oracle(release, dtype)
    for i, layer in model.layers.items():
        got = layer.attn.wo_a.weight
        assert got.dtype == dtype
        assert np.array_equal(_bits(got), official_wo_a(release, int(i))), i
    for name in _experts(release):
        _, i, _, _, e, w, _ = name.split(".")
        lin = getattr(model.layers[i].ffn.experts[int(e)], w)
        packed, values = official_expert(release, name)
        assert lin.weight.dtype == torch.float4_e2m1fn_x2
        assert np.array_equal(lin.weight.view(torch.uint8).numpy(), packed), name
        assert np.array_equal(Q.dequantise(lin.weight, lin.scale).numpy(), values), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_engine_reads_the_release_by_the_official_rule(release, dtype):
    lm = _engine(release, dtype)
    for i, attn in lm.attn.items():
        got = attn.w.wo_a
        assert got.dtype == dtype
        assert np.array_equal(_bits(got), official_wo_a(release, i)), i
    for name in _experts(release):
        _, i, _, _, e, w, _ = name.split(".")
        stack = getattr(lm.moe[int(i)].experts, w)[int(e)]
        packed, values = official_expert(release, name)
        assert np.array_equal(stack.data.numpy(), packed), name
        assert np.array_equal(stack.dense().numpy(), values), name


@pytest.mark.parametrize("side", ["oracle", "engine"])
def test_the_converted_layout_reads_to_the_same_tensors(release, converted, side):
    if side == "oracle":
        a, b = (dict(_oracle(c).named_parameters()) for c in (release, converted))
        assert a.keys() == b.keys()
        for n in a:
            assert torch.equal(a[n].view(torch.uint8) if a[n].element_size() == 1 else a[n],
                               b[n].view(torch.uint8) if b[n].element_size() == 1 else b[n]), n
    else:
        a, b = _engine(release), _engine(converted)
        for i in a.attn:
            assert torch.equal(a.attn[i].w.wo_a, b.attn[i].w.wo_a), i
            for w in ("w1", "w2", "w3"):
                x, y = getattr(a.moe[i].experts, w), getattr(b.moe[i].experts, w)
                assert torch.equal(x.data, y.data) and torch.equal(x.scale, y.scale), (i, w)


# ----------------------------------------------------------------------------- tensordiff check


def _check(capsys, tmp_path, weights: str, *more) -> tuple[int, dict]:
    code, _, err = run_cli(["check", "deepseek-v4.1-flash", "--weights", weights, "--prompt", PROMPT,
                            "--json", tmp_path / "r.json", *more], capsys)
    assert code in (0, 1), err
    return code, json.loads((tmp_path / "r.json").read_text())


@pytest.mark.parametrize("weights", ["synthetic:tiny-fp8", "synthetic:tiny-fp8-converted"])
def test_check_passes_the_clean_engine_on_both_layouts(capsys, tmp_path, weights):
    code, report = _check(capsys, tmp_path, weights)
    assert code == 0 and report["verdict"] == "match", report["earliest"]
    assert any(b["name"] == "attn.0" for b in report["boundaries"])


@pytest.mark.parametrize("fault", RELEASE_FAULTS)
def test_check_names_each_release_conversion_fault_at_its_boundary(capsys, tmp_path, fault):
    code, report = _check(capsys, tmp_path, "synthetic:tiny-fp8", "--fault", fault)
    want = next(f.boundary for f in D.LANGUAGE_FAULTS if f.name == fault)
    assert code == 1 and report["earliest"] == [want]


@pytest.mark.parametrize("fault", RELEASE_FAULTS)
def test_the_release_faults_need_the_release_storage(capsys, tmp_path, fault):
    """On the converted layout there is no FP8 wo_a or int8 byte to misread: a clean match."""
    code, report = _check(capsys, tmp_path, "synthetic:tiny-fp8-converted", "--fault", fault)
    assert code == 0 and report["verdict"] == "match", report["earliest"]


# ----------------------------------------------------------------------------- refusals


def _tampered(tmp_path: Path, src: Path, edit) -> Path:
    """A copy of a whole-model checkpoint with `edit(tensors of a shard, weight map, shard name)`
    applied to the shard holding layer 0's attention."""
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    index = json.loads((dst / INDEX).read_text())
    name = index["weight_map"]["layers.0.attn.wo_a.weight"]
    assert index["weight_map"]["layers.0.ffn.experts.2.w1.weight"] == name  # one shard holds every victim
    tensors = load_file(str(dst / name))
    edit(tensors, index["weight_map"], name)
    save_file(tensors, str(dst / name))
    (dst / INDEX).write_text(json.dumps(index))
    return dst


def _drop(name):
    def edit(t, wmap, shard):
        del t[name], wmap[name]
    return edit


def _set(name, make):
    def edit(t, wmap, shard):
        t[name] = make(t.get(name))
        wmap[name] = shard
    return edit


REFUSALS = [
    # (which layout, edit, the tensor named, its stored dtype, what was expected)
    ("release", _drop("layers.0.attn.wo_a.scale"), "layers.0.attn.wo_a.weight", "float8_e4m3fn", "scale"),
    ("converted", _set("layers.0.attn.wo_a.scale", lambda _: torch.ones(1, 2).to(torch.float8_e8m0fnu)),
     "layers.0.attn.wo_a.weight", "bfloat16", "float8_e4m3fn"),
    ("release", _set("layers.0.attn.wo_a.scale", lambda s: s.float()), "layers.0.attn.wo_a.scale", "float32",
     "float8_e8m0fnu"),
    ("release", _set("layers.0.attn.wo_a.scale", lambda s: torch.cat([s, s[:, :1]], 1).contiguous()),
     "layers.0.attn.wo_a.scale", "[1, 3]", "whole blocks"),
    ("release", _set("layers.0.ffn.shared_experts.w1.weight", lambda w: w.view(torch.int8)),
     "layers.0.ffn.shared_experts.w1.weight", "int8", "float8_e4m3fn"),
    ("release", _set("layers.0.ffn.experts.2.w1.weight", lambda w: w.view(torch.uint8)),
     "layers.0.ffn.experts.2.w1.weight", "uint8", "float4_e2m1fn_x2"),
    ("release", _set("layers.0.attn.wo_b.weight", lambda w: w.view(torch.int8)), "layers.0.attn.wo_b.weight",
     "int8", "float8_e4m3fn"),
]


@pytest.mark.parametrize("side", ["oracle", "engine"])
@pytest.mark.parametrize("layout, edit, tensor, stored, expected", REFUSALS)
def test_anything_else_is_exit_2_naming_tensor_dtype_and_expectation(tmp_path, capsys, side, layout, edit, tensor,
                                                                      stored, expected):
    ck = _tampered(tmp_path, resolve("synthetic:tiny-fp8" if layout == "release" else "synthetic:tiny-fp8-converted"),
                   edit)
    code, _, err = run_cli(["dump", "deepseek-v4.1-flash", "--side", side, "--weights", ck, "--out", tmp_path / "d",
                            "--prompt", "Look: <image> now"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert tensor in err and stored in err and expected in err, err
    assert "torch." not in err  # dtypes in plain words
    assert not (tmp_path / "d").exists()


# ----------------------------------------------------------------------------- a partial download


def test_a_partial_release_with_drawn_experts_runs_its_layers(tmp_path, capsys):
    """What `synthetic:full-layers-IDS` writes (the vision path, embedding, head and only the named
    layers, routed experts drawn in their stored form), here at the tiny config's dimensions:
    `inspect` sees the layers present, and check on those layers passes the clean engine."""
    ck = tmp_path / "partial"
    _write(ck, CONFIGS["tiny-fp8"](), [_vision_values, _layers_writer((0, 2))])
    view = describe(ck, "0,2")
    assert view.present_layers == (0, 2) and view.problems == []
    assert view.groups["routed experts"] == {"FP4 in int8 + scale": 2 * 8 * 3}
    code, report = _check(capsys, tmp_path, str(ck), "--layers", "0,2")
    assert code == 0 and report["verdict"] == "match", report["earliest"]
    assert {b["name"] for b in report["boundaries"]} >= {"attn.0", "index.2.ids", "hidden.2"}
    assert not any(b["name"].startswith(("attn.1", "hidden.1")) for b in report["boundaries"])
    code, _, err = run_cli(["check", "deepseek-v4.1-flash", "--weights", ck, "--prompt", PROMPT, "--layers", "0-2"],
                           capsys)
    assert code == 2 and "layers.1." in err and err.count("\n") == 1  # a layer the download lacks


@pytest.mark.parametrize("size, why", [("full-layers-1", "Engram"), ("full-layers-40", "0-39"),
                                       ("full-layers-x", "ids and ranges")])
def test_a_full_layers_spec_without_a_writable_layer_is_refused(size, why):
    with pytest.raises(BadInput, match=why):
        resolve(f"synthetic:{size}")
