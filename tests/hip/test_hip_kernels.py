"""Every HIP kernel against the torch reference op, on the GPU, across shapes and dtypes.

Odd sizes, one row, grids whose sides are not multiples of 3, top-k up to 8, fp32 and bf16;
tolerances from the dtype. The hip result is computed first, into fresh memory, so a stale
buffer holding the reference cannot pass for an output. Skips without a GPU.
"""
from __future__ import annotations

import math

import pytest
import torch

from engine.backend import pad_columns
from engine.backend.hip_ops import ROUTER_ROUTES
from engine.backend.torch_ops import TorchBackend
import tensordiff.models.deepseek_v41_flash.faults as D

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a GPU and a CUDA or ROCm torch: the hip kernels are held to the torch ops on the GPU machine")

DTYPES = [torch.float32, torch.bfloat16]
ids_dt = {torch.float32: "f32", torch.bfloat16: "bf16"}


@pytest.fixture(scope="module")
def hip():
    from engine.backend.hip_ops import HipBackend

    return HipBackend()


@pytest.fixture(scope="module")
def ref():
    return TorchBackend()


@pytest.fixture
def gen():
    g = torch.Generator(device="cuda")
    g.manual_seed(1234)
    return g


def randn(*shape, gen, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(dtype)


def close(actual, expected):
    """Tolerances from the dtype (torch.testing's defaults for fp32 and bf16)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.isfinite(actual.float()).all(), "non-finite output (unwritten memory?)"
    torch.testing.assert_close(actual, expected)


# --- RMSNorm -------------------------------------------------------------------------------

# (rows, d): vector paths with 1..8 vectors per thread, the scalar path (odd d, d too long).
RMS_SHAPES = [(1, 1024), (9, 1024), (7, 1000), (5, 1023), (3, 1), (2, 4096), (4, 8192), (2, 8200), (33, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dt.get)
@pytest.mark.parametrize("rows,d", RMS_SHAPES)
def test_rms_norm(hip, ref, gen, dtype, rows, d):
    x = randn(rows, d, gen=gen, dtype=dtype, scale=3.0)
    w = randn(d, gen=gen) * 0.5 + 1.0
    close(hip.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dt.get)
def test_rms_norm_leading_dims_and_misaligned_rows(hip, ref, gen, dtype):
    x = randn(2, 3, 256, gen=gen, dtype=dtype)
    w = randn(256, gen=gen)
    close(hip.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5))
    # a view one element into its storage: the 16-byte vector path must step aside
    flat = randn(5 * 256 + 1, gen=gen, dtype=dtype)
    xm = flat[1:].view(5, 256)
    close(hip.rms_norm(xm, w, 1e-6), ref.rms_norm(xm, w, 1e-6))


def test_rms_norm_output_has_unit_rms(hip, gen):
    x = randn(17, 1024, gen=gen, scale=7.0)
    y = hip.rms_norm(x, torch.ones(1024, device="cuda"), 1e-6)
    torch.testing.assert_close(y.pow(2).mean(-1).sqrt(), torch.ones(17, device="cuda"))


# --- RoPE ----------------------------------------------------------------------------------

def rope_tables(n, width, gen):
    ang = torch.rand(n, width, generator=gen, device="cuda") * 40.0
    return ang.cos(), ang.sin()


# (x shape [..., N, H, hd]): DeepSeek's [N, 16, 64], Qwen3-VL's head of 72 (8-byte pieces), odd N and
# H, heads whose halves take 4-byte or single-element access,
# leading batch dims.
ROPE_SHAPES = [(1, 1, 64), (97, 16, 64), (7, 3, 64), (9, 16, 72), (5, 2, 12), (4, 3, 20), (11, 5, 8), (2, 9, 4, 32),
               (3, 1, 128), (6, 2, 2)]


@pytest.mark.parametrize("table", ["half", "full"])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dt.get)
@pytest.mark.parametrize("shape", ROPE_SHAPES, ids=str)
def test_rope_rotate_half(hip, ref, gen, dtype, shape, table):
    n, hd = shape[-3], shape[-1]
    cos, sin = rope_tables(n, hd // 2 if table == "half" else hd, gen)
    x = randn(*shape, gen=gen, dtype=dtype)
    close(hip.rope_rotate_half(x, cos, sin), ref.rope_rotate_half(x, cos, sin))


@pytest.mark.parametrize("access", [4, 8, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dt.get)
def test_rope_access_width_changes_no_number(hip, gen, dtype, access):
    from engine.backend.hip_ops import HipBackend

    cos, sin = rope_tables(13, 32, gen)
    x = randn(13, 5, 64, gen=gen, dtype=dtype)
    assert torch.equal(HipBackend(rope_access_bytes=access).rope_rotate_half(x, cos, sin),
                       hip.rope_rotate_half(x, cos, sin))


def test_rope_keeps_the_norm_of_each_pair(hip, gen):
    n, h, hd = 31, 4, 64
    cos, sin = rope_tables(n, hd // 2, gen)
    x = randn(n, h, hd, gen=gen)
    y = hip.rope_rotate_half(x, cos, sin)
    pair = lambda t: t[..., : hd // 2].pow(2) + t[..., hd // 2:].pow(2)  # noqa: E731
    torch.testing.assert_close(pair(y), pair(x))


def test_rope_rejects_a_table_that_does_not_fit(hip, gen):
    from engine.errors import EngineInputError

    cos, sin = rope_tables(5, 24, gen)
    with pytest.raises(EngineInputError, match="do not fit"):
        hip.rope_rotate_half(randn(5, 2, 64, gen=gen), cos, sin)


# --- patch projection ----------------------------------------------------------------------

def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dt.get)
@pytest.mark.parametrize("m,n,k", [(1, 1024, 592), (37, 65, 16), (130, 1024, 592), (64, 64, 32), (3, 1, 48)])
def test_patch_gemm(hip, ref, gen, dtype, m, n, k):
    x = randn(m, k, gen=gen, dtype=dtype)
    w = randn(n, k, gen=gen, dtype=dtype, scale=k ** -0.5)
    b = randn(n, gen=gen)
    got = hip.patch_linear(x, w, b.to(dtype))
    want = ref.patch_linear(x, w, b.to(dtype))
    assert got.dtype == dtype and got.shape == want.shape
    assert rel_err(got, want) < (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dt.get)
def test_patch_padding_588_to_592_is_exact_with_zeros(hip, gen, dtype):
    # The preparation boundary: zero columns change nothing; the kernel needs them.
    x = randn(50, 588, gen=gen, dtype=dtype)
    w = randn(1024, 588, gen=gen, dtype=dtype, scale=588 ** -0.5)
    b = randn(1024, gen=gen).to(dtype)
    want = torch.nn.functional.linear(x, w, b)
    xp, wp = pad_columns(x), pad_columns(w)
    assert xp.shape[-1] == wp.shape[-1] == 592
    got = hip.patch_linear(xp, wp, b)
    assert rel_err(got, want) < (1e-5 if dtype == torch.float32 else 1e-2)
    # ... and nonzero padding (the engine fault patch-pad-nonzero) does change it
    bad = hip.patch_linear(torch.nn.functional.pad(x, (0, 4), value=1.0), torch.nn.functional.pad(w, (0, 4), value=1.0), b)
    assert rel_err(bad, want) > 0.1


def test_patch_gemm_refuses_unpadded_operands(hip, gen):
    x = randn(4, 588, gen=gen)
    w = randn(8, 588, gen=gen)
    with pytest.raises(ValueError, match="K % 16"):
        hip.patch_linear(x, w, None)


def test_patch_gemm_vendor_path(gen):
    from engine.backend.hip_ops import HipBackend

    x, w = randn(9, 592, gen=gen), randn(33, 592, gen=gen)
    torch.testing.assert_close(HipBackend(patch_gemm="vendor").patch_linear(x, w, None),
                               torch.nn.functional.linear(x, w))


# --- aligner gather ------------------------------------------------------------------------

def aligner_index(n_h, n_w, device="cuda"):
    """[T, 9] int32 source rows of each 3x3 cell (row-major cells), -1 outside the grid."""
    gh, gw = -(-n_h // 3), -(-n_w // 3)
    ty = torch.arange(gh).view(gh, 1, 1, 1) * 3 + torch.arange(3).view(1, 1, 3, 1)
    tx = torch.arange(gw).view(1, gw, 1, 1) * 3 + torch.arange(3).view(1, 1, 1, 3)
    ty, tx = ty.expand(gh, gw, 3, 3), tx.expand(gh, gw, 3, 3)
    idx = torch.where((ty < n_h) & (tx < n_w), ty * n_w + tx, torch.full_like(ty, -1))
    return idx.reshape(gh * gw, 9).to(torch.int32).to(device)


def official_aligner_layout(x, n_h, n_w):
    """The official route: view, permute, zero-pad right/bottom, unfold 3x3 stride 3."""
    c = x.shape[-1]
    g = x.view(n_h, n_w, c).permute(2, 0, 1).unsqueeze(0)
    g = torch.nn.functional.pad(g, (0, -n_w % 3, 0, -n_h % 3))
    return torch.nn.functional.unfold(g.float(), 3, stride=3)[0].t().to(x.dtype)


GRIDS = [(1, 1), (2, 5), (4, 7), (6, 9), (10, 11), (3, 3), (51, 74)]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dt.get)
@pytest.mark.parametrize("c", [8, 13, 300, 1024])
@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_aligner_gather(hip, ref, gen, dtype, c, grid):
    n_h, n_w = grid
    x = randn(n_h * n_w, c, gen=gen, dtype=dtype)
    index = aligner_index(n_h, n_w)
    got = hip.aligner_gather(x, index)
    assert torch.equal(got, ref.aligner_gather(x, index))  # a copy: bit for bit
    if c <= 300:
        assert torch.equal(got, official_aligner_layout(x, n_h, n_w))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dt.get)
@pytest.mark.parametrize("c", [1100, 2048, 4])
def test_aligner_gather_several_slabs_and_narrow_rows(hip, ref, gen, dtype, c):
    x = randn(4 * 7, c, gen=gen, dtype=dtype)
    index = aligner_index(4, 7)
    assert torch.equal(hip.aligner_gather(x, index), ref.aligner_gather(x, index))


# --- MoE router ----------------------------------------------------------------------------

ROUTER_CASES = [(1, 8, 1), (5, 64, 2), (64, 100, 6), (257, 384, 6), (33, 384, 8), (16, 1000, 8), (3, 65, 7)]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids_dt.get)
@pytest.mark.parametrize("rows,experts,k", ROUTER_CASES, ids=str)
@pytest.mark.parametrize("mode", ["interleaved", "text-only", "no-bias-vl"])
def test_moe_route(hip, ref, gen, dtype, rows, experts, k, mode):
    logits = randn(rows, experts, gen=gen, dtype=dtype, scale=2.0)
    bias = randn(experts, gen=gen, scale=0.3)
    bias_vl = randn(experts, gen=gen, scale=0.3)
    image = torch.rand(rows, generator=gen, device="cuda") < 0.5
    if mode == "text-only":
        image = None
    args = (logits, bias, None if mode == "no-bias-vl" else bias_vl, image, k, 1.5)
    w, ids = hip.moe_route(*args)
    w_ref, ids_ref = ref.moe_route(*args)
    assert ids.dtype == torch.int64 and w.dtype == torch.float32
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w, w_ref)


@pytest.mark.parametrize("threads", [64, 128, 256])
@pytest.mark.parametrize("experts", [8, 384, 1000, 1024])
def test_moe_route_threads_per_row(ref, gen, threads, experts):
    from engine.backend.hip_ops import HipBackend

    logits = randn(37, experts, gen=gen)
    bias, bias_vl = randn(experts, gen=gen), randn(experts, gen=gen)
    image = torch.arange(37, device="cuda") % 2 == 0
    w, ids = HipBackend(router_threads=threads).moe_route(logits, bias, bias_vl, image, 8, 1.5)
    w_ref, ids_ref = ref.moe_route(logits, bias, bias_vl, image, 8, 1.5)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w, w_ref)


@pytest.mark.parametrize("route", list(ROUTER_ROUTES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("experts", [8, 100, 384, 1000, 1024])
def test_moe_route_every_named_route(ref, gen, route, dtype, experts):
    # each route the kernels bench measures (and kDefaultRoute may name), held to the reference;
    # 1,027 rows: partial blocks for every rows-per-block, text and image rows interleaved
    from engine.backend.hip_ops import HipBackend

    logits = randn(1027, experts, gen=gen, dtype=dtype, scale=2.0)
    bias, bias_vl = randn(experts, gen=gen, scale=0.3), randn(experts, gen=gen, scale=0.3)
    image = torch.arange(1027, device="cuda") % 2 == 1
    k = min(6, experts)
    be = HipBackend(router_threads=route)
    w, ids = be.moe_route(logits, bias, bias_vl, image, k, 1.5)
    w_ref, ids_ref = ref.moe_route(logits, bias, bias_vl, image, k, 1.5)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w, w_ref)
    # the planted fault trips on every route: image rows ranked with the text bias
    _, ids_f = be.with_faults({D.ROUTER_TEXT_BIAS_FOR_IMAGES}).moe_route(logits, bias, -bias_vl * 10, image, k, 1.5)
    _, ids_text = ref.moe_route(logits, bias, None, None, k, 1.5)
    assert torch.equal(ids_f, ids_text)


# exact_bf16 runs the filter's steps on exact keys (a table of bf16 scores): the same checks
FILTER_ROUTES = [r for r in ROUTER_ROUTES if r.startswith("filter")] + ["exact_bf16"]


def near_ties(rows, experts, group, gen):
    """Saturated logits (s = sqrt(l)) with `group` experts a row a few ulps apart (many equal after
    the root) and the rest far below: keys closer than the filter's fast functions can tell."""
    logits = 21.0 - torch.rand(rows, experts, generator=gen, device="cuda")
    cols = torch.rand(rows, experts, generator=gen, device="cuda").argsort(-1)[:, :group]
    ulps = torch.randint(0, 3 * group, (rows, group), generator=gen, device="cuda").float()
    return logits.scatter(1, cols, 30.0 + ulps * 2.0 ** -19)


@pytest.mark.parametrize("route", FILTER_ROUTES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_moe_route_filter_is_the_wave_route_bit_for_bit(gen, route, dtype):
    # the filter ranks only candidates exactly: its ids and weights must be the wave route's, which
    # ranks every expert exactly (and is held to torch above), bit for bit: random rows at the
    # bench's size, near ties (a few ulps apart), mass ties (the slow path), -inf and saturated
    # logits, 1,000 experts
    from engine.backend.hip_ops import HipBackend

    filt, wave = HipBackend(router_threads=route), HipBackend(router_threads="wave")
    rows = 65536
    logits = randn(rows, 384, gen=gen, dtype=dtype, scale=2.0)
    logits[:512] = near_ties(512, 384, 40, gen).to(dtype)
    logits[512:640] = torch.randint(21, 25, (128, 384), generator=gen, device="cuda").to(dtype)
    sat = torch.rand(rows, 384, generator=gen, device="cuda")
    sat[:640] = 0.5  # the tie rows stay as they are
    logits[sat < 0.05] = -float("inf")
    logits[sat > 0.97] = 40.0
    bias, bias_vl = randn(384, gen=gen, scale=0.3), randn(384, gen=gen, scale=0.3)
    image = torch.rand(rows, generator=gen, device="cuda") < 0.5
    image[:640] = True  # with a zero bias_vl (the first case) their keys stay tied
    for args in [(logits, bias, torch.zeros_like(bias_vl), image, 6, 1.5), (logits, bias, bias_vl, image, 8, 1.5),
                 (randn(257, 1000, gen=gen, dtype=dtype, scale=2.0), randn(1000, gen=gen), None, None, 8, 2.5)]:
        w, ids = filt.moe_route(*args)
        w_wave, ids_wave = wave.moe_route(*args)
        assert torch.equal(ids, ids_wave)
        assert torch.equal(w.view(torch.int32), w_wave.view(torch.int32))


# hip/moe_route.hip default_route: from these row counts on filter_g16 (f32) / exact_bf16 (bf16),
# filter_redux below
DEFAULT_FROM_ROWS = {torch.float32: 49152, torch.bfloat16: 6144}


@pytest.mark.parametrize("side", [-1, 0], ids=["below", "at"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_moe_route_default_by_rows_is_both_routes_bit_for_bit(hip, gen, dtype, side):
    # the default picks its route by row count: on each side of the threshold its ids and weights
    # are filter_redux's, filter_g16's and the wave route's, bit for bit (the CPU stand-in checks
    # which route it picked: tests/hip/test_hip_moe_route_simt.py)
    from engine.backend.hip_ops import HipBackend

    rows = DEFAULT_FROM_ROWS[dtype] + side
    logits = randn(rows, 384, gen=gen, dtype=dtype, scale=2.0)
    logits[:256] = near_ties(256, 384, 40, gen).to(dtype)
    bias, bias_vl = randn(384, gen=gen, scale=0.3), randn(384, gen=gen, scale=0.3)
    image = torch.rand(rows, generator=gen, device="cuda") < 0.5
    w, ids = hip.moe_route(logits, bias, bias_vl, image, 6, 1.5)
    for name in ("filter_redux", "filter_g16", "exact_bf16", "wave"):
        w_r, ids_r = HipBackend(router_threads=name).moe_route(logits, bias, bias_vl, image, 6, 1.5)
        assert torch.equal(ids, ids_r), name
        assert torch.equal(w.view(torch.int32), w_r.view(torch.int32)), name


def test_router_score_bound_holds_for_every_fp32_bit_pattern():
    # the filters' bound on sqrt(softplus(l)) (fast functions and a margin) against the exact
    # score on this GPU, for all 2^32 logits: none outside; with no margin, many: the check has teeth
    from engine.backend.hip_ops import HipBackend

    be = HipBackend()
    n, example = be.router_score_bound_violations()
    assert n == 0, f"{n} logits outside the bound, e.g. bits {example:#010x}"
    n_tight, _ = be.router_score_bound_violations(margin_scale=0.0)
    assert n_tight > 1000


def test_router_table_is_exact_for_every_bf16_value():
    # exact_bf16's table (filled on this GPU by the exact score itself) and its window: every bf16
    # bit pattern's looked-up score is the exact score bit for bit (the CPU stand-in plants a wrong
    # entry and a wrong edge and sees this check fail)
    from engine.backend.hip_ops import HipBackend

    n, example = HipBackend().router_table_mismatches()
    assert n == 0, f"{n} bf16 logits whose table score is not exact, e.g. bits {example:#06x}"


@pytest.mark.parametrize("offset", [1, 2, 4])
def test_moe_route_exact_bf16_takes_unaligned_rows_elsewhere(gen, offset):
    # exact_bf16 loads 4 logits (8 bytes) and 4 biases (16 bytes) at once: logits or biases not so
    # aligned (a view into a larger buffer) go to filter_g16, the same numbers, no fault
    from engine.backend.hip_ops import HipBackend

    rows = 1027
    logits = randn(rows, 384, gen=gen, dtype=torch.bfloat16, scale=2.0)
    buf = torch.zeros(rows * 384 + 8, dtype=torch.bfloat16, device="cuda")
    buf[offset:offset + rows * 384] = logits.reshape(-1)
    shifted = buf[offset:offset + rows * 384].view(rows, 384)
    bias, bias_vl = randn(384, gen=gen, scale=0.3), randn(384, gen=gen, scale=0.3)
    bbuf = torch.zeros(384 + 4, device="cuda")
    bbuf[offset:offset + 384] = bias_vl
    image = torch.arange(rows, device="cuda") % 2 == 1
    w_wave, ids_wave = HipBackend(router_threads="wave").moe_route(logits, bias, bias_vl, image, 6, 1.5)
    exact = HipBackend(router_threads="exact_bf16")
    for args in [(shifted, bias, bias_vl), (logits, bias, bbuf[offset:offset + 384])]:
        w, ids = exact.moe_route(*args, image, 6, 1.5)
        assert torch.equal(ids, ids_wave)
        assert torch.equal(w.view(torch.int32), w_wave.view(torch.int32))


def test_moe_route_unknown_route_is_refused():
    from engine.backend.hip_ops import HipBackend
    from engine.errors import EngineInputError

    with pytest.raises(EngineInputError, match="the routes are wave, wave_lb"):
        HipBackend(router_threads="group8")


def test_moe_route_saturated_softplus(hip, ref, gen):
    # logits past the softplus threshold (20) take the identity branch, as in torch
    logits = randn(9, 384, gen=gen, scale=30.0)
    bias = randn(384, gen=gen)
    w, ids = hip.moe_route(logits, bias, None, None, 6, 2.5)
    w_ref, ids_ref = ref.moe_route(logits, bias, None, None, 6, 2.5)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w, w_ref)


def test_router_fault_uses_the_text_bias_on_image_rows_only(hip, ref, gen):
    rows, experts = 64, 384
    logits = randn(rows, experts, gen=gen)
    bias = randn(experts, gen=gen)
    bias_vl = -bias + randn(experts, gen=gen)  # far from the text bias: other experts win
    image = torch.arange(rows, device="cuda") % 3 == 0
    faulty = hip.with_faults({D.ROUTER_TEXT_BIAS_FOR_IMAGES})
    w, ids = faulty.moe_route(logits, bias, bias_vl, image, 6, 1.5)
    _, ids_ok = ref.moe_route(logits, bias, bias_vl, image, 6, 1.5)
    _, ids_text = ref.moe_route(logits, bias, None, None, 6, 1.5)
    assert torch.equal(ids, ids_text)  # what the fault computes, for every row
    assert torch.equal(ids[~image], ids_ok[~image])  # text rows unaffected
    assert not torch.equal(ids[image], ids_ok[image])  # image rows wrong
    clean_w, clean_ids = hip.moe_route(logits, bias, bias_vl, image, 6, 1.5)
    assert torch.equal(clean_ids, ids_ok)


def test_moe_route_rejects_topk_over_8(hip, gen):
    from engine.errors import EngineInputError

    with pytest.raises(EngineInputError, match="top-k"):
        hip.moe_route(randn(2, 64, gen=gen), torch.zeros(64, device="cuda"), None, None, 9, 1.0)


# --- embedding scatter ---------------------------------------------------------------------

@pytest.mark.parametrize("emb_dtype", DTYPES, ids=ids_dt.get)
@pytest.mark.parametrize("src_dtype", DTYPES, ids=ids_dt.get)
@pytest.mark.parametrize("d", [1, 7, 64, 5120])
def test_embed_scatter(hip, ref, gen, emb_dtype, src_dtype, d):
    n, m = 50, 23
    emb = randn(n, d, gen=gen, dtype=emb_dtype)
    rows = torch.randperm(n, generator=gen, device="cuda")[:m]
    rows[::4] = -1  # source rows with no place
    src = randn(m, d, gen=gen, dtype=src_dtype)
    got = hip.embed_scatter(emb.clone(), rows, src)
    want = ref.embed_scatter(emb.clone(), rows, src)
    assert torch.equal(got, want)
    untouched = torch.ones(n, dtype=torch.bool, device="cuda")
    untouched[rows[rows >= 0]] = False
    assert torch.equal(got[untouched], emb[untouched])


def test_embed_scatter_is_in_place(hip, gen):
    emb = randn(10, 64, gen=gen, dtype=torch.bfloat16)
    src = randn(2, 64, gen=gen, dtype=torch.bfloat16)
    out = hip.embed_scatter(emb, torch.tensor([3, 7], device="cuda"), src)
    assert out.data_ptr() == emb.data_ptr() and torch.equal(emb[7], src[1])


# --- the whole backend at the real sizes, once ----------------------------------------------

def test_real_sizes_match(hip, ref, gen):
    x = randn(9000, 1024, gen=gen, dtype=torch.bfloat16)
    w = randn(1024, gen=gen)
    close(hip.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6))
    q = x.view(9000, 16, 64)
    cos, sin = rope_tables(9000, 32, gen)
    close(hip.rope_rotate_half(q, cos, sin), ref.rope_rotate_half(q, cos, sin))
    g = randn(90 * 99, 1024, gen=gen, dtype=torch.bfloat16)
    idx = aligner_index(90, 99)
    assert idx.shape[0] == 30 * 33 and torch.equal(hip.aligner_gather(g, idx), ref.aligner_gather(g, idx))
    logits = randn(1024, 384, gen=gen)
    image = torch.arange(1024, device="cuda") % 2 == 1
    b, bvl = randn(384, gen=gen), randn(384, gen=gen)
    w1, i1 = hip.moe_route(logits, b, bvl, image, 6, 1.5)
    w2, i2 = ref.moe_route(logits, b, bvl, image, 6, 1.5)
    assert torch.equal(i1, i2)
    torch.testing.assert_close(w1, w2)
    assert math.isclose(w1.sum(-1).mean().item(), 1.5, rel_tol=1e-5)
