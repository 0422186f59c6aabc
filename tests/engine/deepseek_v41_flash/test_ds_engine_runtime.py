"""The shared runtime pieces (decode, normalisation table, patchify, attention, overlay) and the
DeepSeek aligner index map and image span."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from engine.backend import get
from engine.deepseek_v41_flash.aligner import cell_index
from engine.deepseek_v41_flash.span import IMAGE, IMAGE_END, IMAGE_NEW_LINE, IMAGE_START, image_span, span_types
from engine.errors import EngineInputError
from engine.runtime import image as rimage
from engine.runtime import patches as rpatches
from engine.runtime.attention import attention
from engine.runtime.embedding import Span, intersect, overlay
from engine.runtime.speed_path import SpeedPath

BE = get("torch")


def test_normalize_table_is_bit_identical_to_the_float_pipeline():
    v = torch.arange(256, dtype=torch.float32)
    want = ((v / 255 - 0.5) / 0.5).to(torch.bfloat16)
    table = rpatches.normalize_table((0.5,) * 3, (0.5,) * 3, 1 / 255, torch.bfloat16)
    assert all(torch.equal(table[c], want) for c in range(3))
    fp32 = rpatches.normalize_table((0.5,) * 3, (0.5,) * 3, 1 / 255, torch.float32)
    assert torch.equal(fp32[0], (v / 255 - 0.5) / 0.5)


def test_patchify_raster_and_merge_orders():
    h, w, p = 4, 6, 2
    px = torch.arange(h * w * 3).view(h, w, 3)
    rows = rpatches.patchify(px, p)
    assert rows.shape == (6, 12)
    assert torch.equal(rows[4], px[2:4, 2:4].permute(2, 0, 1).reshape(-1))  # patch (1, 1), (c, y, x)
    merged = rpatches.patchify(px[:4, :4], p, merge=2)
    assert torch.equal(merged, rpatches.patchify(px[:4, :4], p)[[0, 1, 2, 3]])
    tab = torch.arange(3 * 256, dtype=torch.float32).view(3, 256)
    vals = rpatches.apply_table(rows.to(torch.uint8), tab, 3)
    assert vals[4, 0] == rows[4, 0] and vals[4, 4] == 256 + rows[4, 4]


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "I;16", "LA", "CMYK"])
def test_decode_matches_pillow_convert(mode, tmp_path):
    rng = np.random.default_rng(1)
    base = Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8))
    if mode == "P":
        im = base.quantize(16)
    elif mode == "I;16":
        im = Image.fromarray((rng.integers(0, 65536, (30, 40))).astype(np.uint16))
    else:
        im = base.convert(mode)
    path = tmp_path / ("x.tif" if mode == "CMYK" else "x.png")
    im.save(path)
    got = rimage.to_array(rimage.open_rgb(path))
    with Image.open(path) as ref:
        assert np.array_equal(got, np.asarray(ref.convert("RGB")))


def test_decode_errors_are_engine_input_errors(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(EngineInputError):
        rimage.open_rgb(tmp_path / "bad.png")
    with pytest.raises(EngineInputError):
        rimage.open_rgb(tmp_path / "absent.png")


def naive_attention(q, k, v):
    s = torch.einsum("nhd,mhd->hnm", q, k) / q.shape[-1] ** 0.5
    return torch.einsum("hnm,mhd->nhd", s.softmax(-1), v)


def test_attention_matches_naive_and_respects_sequences():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(10, 2, 8, generator=g) for _ in range(3))
    assert torch.allclose(attention(q, k, v), naive_attention(q, k, v), atol=1e-5)
    out = attention(q, k, v, cu_seqlens=[0, 4, 10])
    assert torch.allclose(out[:4], naive_attention(q[:4], k[:4], v[:4]), atol=1e-5)
    assert torch.allclose(out[4:], naive_attention(q[4:], k[4:], v[4:]), atol=1e-5)


@pytest.mark.parametrize("gh,gw", [(4, 5), (6, 6), (7, 3), (1, 1)])
def test_cell_index_equals_pad_and_unfold(gh, gw):
    c = 3
    x = torch.randn(gh * gw, c)
    ref = F.unfold(F.pad(x.view(gh, gw, c).permute(2, 0, 1), (0, -gw % 3, 0, -gh % 3))[None], 3, stride=3)[0].T
    got = BE.aligner_gather(x, cell_index(gh, gw))
    assert torch.equal(got, ref)


def test_flat_pad_index_differs_only_when_width_is_not_a_multiple_of_3():
    assert torch.equal(cell_index(6, 6, flat_pad=True), cell_index(6, 6))
    assert not torch.equal(cell_index(6, 5, flat_pad=True), cell_index(6, 5))


def test_span_types_and_rows():
    assert span_types(2, 2).tolist() == [IMAGE_START, IMAGE, IMAGE, IMAGE_NEW_LINE, IMAGE, IMAGE,
                                         IMAGE_NEW_LINE, IMAGE_END]
    aligned = torch.arange(4.0).view(4, 1).expand(4, 3).contiguous()  # T=4 rows, dim 3
    markers = {"image_start": torch.full((3,), -1.0), "image_end": torch.full((3,), -2.0),
               "image_newline": torch.full((3,), -3.0)}
    span = image_span(5, aligned, markers, (2, 2))
    assert span.start == 5 and span.length == 8
    assert span.rows[:, 0].tolist() == [-1, 0, 1, -3, 2, 3, -3, -2]


def test_intersect():
    assert intersect(10, 5, 0, 12) == (0, 2)
    assert intersect(10, 5, 12, 100) == (2, 5)
    assert intersect(10, 5, 0, 10) == (0, 0) and intersect(10, 5, 15, 3) == (0, 0)


@pytest.mark.parametrize("chunk", [1, 3, 7, 16, 64])
def test_chunked_overlay_equals_one_chunk(chunk):
    """A span (positions 5..21) crossing chunk boundaries, plus a second one: the overlay of each
    chunk, concatenated, equals the overlay of the whole sequence in one chunk."""
    g = torch.Generator().manual_seed(0)
    length, dim = 40, 6
    text = torch.randn(length, dim, generator=g)
    spans = [Span(5, torch.randn(17, dim, generator=g)), Span(30, torch.randn(4, dim, generator=g))]
    whole = overlay(text.clone(), 0, spans, BE)
    parts = [overlay(text[s:s + chunk].clone(), s, spans, BE) for s in range(0, length, chunk)]
    assert torch.equal(torch.cat(parts), whole)
    assert torch.equal(whole[5:22], spans[0].rows) and torch.equal(whole[:5], text[:5])
    assert torch.equal(whole[22:30], text[22:30]) and torch.equal(whole[34:], text[34:])


def test_cuda_kernel_order_and_fallback(monkeypatch):
    """On CUDA, the kernels are offered in order; one that fails at run time is dropped."""
    import types

    import engine.runtime.attention as A

    calls = []

    def fake_sdpa(q, k, v, scale=None):
        names = tuple(calls[-1])
        if names[0] == "cudnn":
            raise RuntimeError("cuDNN graph build failed")
        return "ran with " + names[0]

    class Ctx:
        def __init__(self, backends, set_priority=False):
            calls.append([b.name.split("_")[0].lower() for b in backends])

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(A, "sdpa_kernel", Ctx)
    monkeypatch.setattr(A.F, "scaled_dot_product_attention", fake_sdpa)
    monkeypatch.setattr(A, "_BROKEN", {})
    q4 = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"))
    log = SpeedPath()
    assert A._sdpa(q4, q4, q4, None, None, log) == "ran with flash"
    assert calls[0] == ["cudnn", "flash", "efficient", "math"] and "cudnn" in A._BROKEN
    # the dropped kernel is a fallback the speed path names, with the error that dropped it
    assert log.fallbacks == [{"what": "sdpa cudnn skipped",
                              "why": "it raised earlier in this process: RuntimeError: cuDNN graph build failed"}]
    assert A._sdpa(q4, q4, q4, None, ["cudnn", "efficient"]) == "ran with efficient"
