"""A fault inside a kernel is caught by the same comparator that checks whole models.

Both sides route the same logits (text and image rows interleaved, as in a prompt around an image
span) and dump `router.0.ids` / `router.0.weights` the way the DeepSeek language engine does
(ids ascending, weights aligned to them). The torch reference op is the oracle side; the HIP
kernel is the engine side. Clean, the dumps match; with the kernel fault
`router-text-bias-for-images` the comparator names `router.0.ids` as the earliest divergence.
"""
from __future__ import annotations

import pytest
import torch

from tensordiff.format.capture import Recorder
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.judge.contract import Contract
import tensordiff.models.deepseek_v41_flash.contract as C
import tensordiff.models.deepseek_v41_flash.faults as D

CONTRACT = Contract("deepseek-v4.1-flash", (), C.RULES, resolver=C.make_resolver(()), boundary_of=C.boundary_of)
ROWS, DIM, EXPERTS, TOPK = 48, 64, 384, 6


def inputs(device):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(ROWS, DIM, generator=g)
    gate = torch.randn(EXPERTS, DIM, generator=g) * DIM ** -0.5
    bias = torch.randn(EXPERTS, generator=g) * 0.5
    bias_vl = -bias + torch.randn(EXPERTS, generator=g) * 0.5  # image rows prefer other experts
    image = torch.zeros(ROWS, dtype=torch.bool)
    image[10:40] = True  # a span of image rows between text rows
    return [t.to(device) for t in (x, gate, bias, bias_vl, image)]


def route_dump(backend, path, device):
    x, gate, bias, bias_vl, image = inputs(device)
    logits = x @ gate.T
    w, ids = backend.moe_route(logits, bias, bias_vl, image, TOPK, 1.5)
    order = ids.argsort(-1)
    rec = Recorder(path, model="deepseek-v4.1-flash", producer={"name": backend.name})
    rec.record("embeddings", x)
    rec.record("attn.0", logits)
    rec.record("router.0.ids", ids.gather(-1, order))
    rec.record("router.0.weights", w.gather(-1, order))
    return rec.close()


def test_comparator_sees_a_reference_side_bias_mixup(tmp_path):
    # CPU proof that this wiring has teeth: the text bias for every row (what the kernel fault
    # computes) diverges at router.0.ids against the reference.
    from engine.backend.torch_ops import TorchBackend

    class TextBiasOnly(TorchBackend):
        def moe_route(self, logits, bias, bias_vl, image_rows, topk, route_scale):
            return super().moe_route(logits, bias, None, None, topk, route_scale)

    ref = route_dump(TorchBackend(), tmp_path / "ref", "cpu")
    assert compare_dumps(ref, route_dump(TorchBackend(), tmp_path / "same", "cpu"), contract=CONTRACT).verdict == "match"
    report = compare_dumps(ref, route_dump(TextBiasOnly(), tmp_path / "bad", "cpu"), contract=CONTRACT)
    assert report.verdict == "diverged" and report.earliest == ["router.0.ids"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the HIP router kernel runs there")
def test_kernel_fault_is_caught_by_the_comparator(tmp_path):
    from engine.backend.hip_ops import HipBackend
    from engine.backend.torch_ops import TorchBackend

    ref = route_dump(TorchBackend(), tmp_path / "oracle", "cuda")
    clean = compare_dumps(ref, route_dump(HipBackend(), tmp_path / "hip", "cuda"), contract=CONTRACT)
    assert clean.verdict == "match", str(clean)
    faulty = HipBackend(faults={D.ROUTER_TEXT_BIAS_FOR_IMAGES})
    report = compare_dumps(ref, route_dump(faulty, tmp_path / "hip-fault", "cuda"), contract=CONTRACT)
    assert report.verdict == "diverged", str(report)
    assert report.earliest == ["router.0.ids"], report.earliest
