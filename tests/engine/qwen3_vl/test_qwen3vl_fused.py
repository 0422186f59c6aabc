"""Qwen3-VL's compiled block (its CUDA speed path) holds the eager tower's numbers, boundary by
boundary: forced on here on the CPU through Inductor's C++ backend, so CI checks the same pieces
the GPU compiles (there through Triton; `bash bench/gpu.sh OUT engines` runs it on a GPU with
its CUDA graphs). The compiled route carries the planted faults (it is the block's own code) and a
compile that fails falls back to the same numbers, saying why."""
from __future__ import annotations

import pytest
import torch

import engine.qwen3_vl.runner as runner
import engine.runtime.fused as fused
from engine.qwen3_vl.config import load_config
from engine.qwen3_vl.vision import QwenBlock
from tensordiff.format.capture import MemoryRecorder
import tensordiff.models.qwen3_vl.faults as Q
from tensordiff.pipeline.runs import make_request

BOUNDARIES = {"pos_embed", "rope.cos", "rope.sin", "block0", "final_norm", "aligner"}


def _run(**kw):
    ad, req = make_request("qwen3-vl", **kw)
    rec = MemoryRecorder()
    ad.runner("engine")(req, rec)
    return rec


@pytest.fixture(scope="module")
def eager():
    return _run(fuse="off")


def _compiled(**kw):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "compile_unavailable", lambda device: None)  # Inductor's C++ backend on the CPU
        return _run(fuse="on", **kw)


@pytest.fixture(scope="module")
def compiled_run():
    return _compiled


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # fp32 on both routes; Inductor reorders the LayerNorm and GELU sums: a few ULP, never more
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_compiled_tower_matches_the_eager_one_boundary_by_boundary(eager, compiled_run):
    rec = compiled_run()
    assert rec.run["speed_path"]["vision"]["block"] == {"asked": "on", "policy": "on", "ran": "compiled"}
    assert rec.run["speed_path"]["fallbacks"] == []
    names = set(rec.tensors)
    assert BOUNDARIES | {"deepstack.0"} <= names and names == set(eager.tensors)
    for name in sorted(names):
        a, b = eager.tensors[name], rec.tensors[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert _close(a.float(), b.float()) if a.is_floating_point() else torch.equal(a, b), name
    # the tables ahead of the blocks are not compiled at all: bit for bit
    for name in ("pos_embed", "rope.cos", "rope.sin", "positions.ids"):
        assert torch.equal(eager.tensors[name], rec.tensors[name]), name


def test_the_compiled_route_carries_a_planted_block_fault(eager, compiled_run):
    faulty = compiled_run(fault=Q.VISION_GELU_ERF)  # the blocks' activation: inside the compiled pieces
    assert faulty.run["speed_path"]["vision"]["block"]["ran"] == "compiled"
    assert torch.equal(faulty.tensors["pos_embed"], eager.tensors["pos_embed"])
    assert not _close(faulty.tensors["block0"], eager.tensors["block0"])


def test_a_compile_that_fails_falls_back_to_the_eager_numbers_and_says_why(eager, monkeypatch):
    def broken(fn):
        def call(*args, **kwargs):
            raise RuntimeError("inductor: no working C++ compiler")
        return call

    monkeypatch.setattr(runner, "compile_unavailable", lambda device: None)
    monkeypatch.setattr(fused, "_compile", broken)
    rec = _run(fuse="on")
    sp = rec.run["speed_path"]
    assert sp["vision"]["block"] == {"asked": "on", "policy": "on", "ran": "eager"}
    assert sp["fallbacks"] == [{"what": "vision block compiled -> eager",
                                "why": "RuntimeError: inductor: no working C++ compiler"}]
    for name, t in eager.tensors.items():
        assert torch.equal(t, rec.tensors[name]), name


def test_speed_paths_asked_for_on_the_cpu_are_recorded_fallbacks():
    sp = _run(fuse="on", graphs="on").run["speed_path"]
    assert sp["vision"]["block"] == {"asked": "on", "policy": "off", "ran": "eager"}
    assert sp["vision"]["cuda_graphs"] == {"asked": "on", "policy": "off", "captured": 0, "replayed": 0}
    assert [f["what"] for f in sp["fallbacks"]] == ["vision block compiled -> eager", "CUDA graphs -> eager"]
    # 'auto' on the CPU is the documented route, not a fallback
    assert _run().run["speed_path"]["fallbacks"] == []


def test_the_compiled_route_compiles_the_blocks_own_pieces(monkeypatch):
    seen = []
    monkeypatch.setattr(fused, "_compile", lambda fn: seen.append(fn) or fn)  # an identity "compiler"
    _, req = make_request("qwen3-vl")
    cfg = load_config(req.weights_dir).vision
    tower = runner.load_tower(req, load_config(req.weights_dir))
    block = tower.eager
    assert isinstance(block, QwenBlock)
    fb = fused.FusedBlock(block)
    assert seen == [block.attn_in, block.out]  # the eager block's own bound methods, nothing re-typed
    n = 16
    x = torch.randn(n, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    cos, sin = tower.tables((1, 4, 4), "cpu")[1:]
    tower._cu = [0, n]
    assert torch.equal(fb(x, tower.blocks[0], cos, sin), block(x, tower.blocks[0], cos, sin))
    assert fb.ok and fb.error is None


class _CpuGraph:
    """A stand-in for a captured CUDA graph on the CPU: replay recomputes the captured function on
    the captured input buffer and writes the captured output buffers in place, as a replay does."""

    def __init__(self, fn, static_in, static_out):
        self.fn, self.static_in, self.static_out = fn, static_in, static_out

    def replay(self):
        for buf, new in zip(self.static_out, self.fn(self.static_in)):
            buf.copy_(new)


class _CpuGraphCache(fused.GraphCache):
    def _capture(self, key, x):
        static_in = x.clone()
        fn = self.fn  # the pass as it stood at capture (a replay must not see a later fn)
        static_out = fn(static_in)
        self.graphs[key] = (_CpuGraph(fn, static_in, static_out), static_in, static_out)
        self.captures += 1
        return fused._clone(static_out)


def test_graph_route_replays_per_grid_and_never_on_a_tapped_pass(monkeypatch):
    import engine.qwen3_vl.vision as vision
    from engine.qwen3_vl.preprocess import preprocess
    from tensordiff.format.capture import NullRecorder

    monkeypatch.setattr(vision, "GraphCache", _CpuGraphCache)
    _, req = make_request("qwen3-vl")
    cfg = load_config(req.weights_dir)
    graphed = runner.load_tower(req, cfg, graphs="on")
    eager = runner.load_tower(req, cfg)
    g = torch.Generator().manual_seed(0)

    def pixels(h, w):
        import numpy as np

        img = (torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8).numpy().astype(np.uint8)
        px = preprocess(img, cfg.processor, "pil")
        return px.pixel_values, tuple(int(v) for v in px.grid_thw)

    def same(a, b):
        return torch.equal(a.embeds, b.embeds) and all(torch.equal(x, y) for x, y in zip(a.deepstack, b.deepstack))

    with torch.inference_mode():
        (p1, grid), (p2, grid2), (p3, other) = pixels(64, 96), pixels(64, 96), pixels(96, 64)
        assert grid == grid2 != other
        first = graphed(p1, grid, NullRecorder())  # captured at the first pass ('on')
        assert graphed.graphs.captures == 1 and same(first, eager(p1, grid, NullRecorder()))
        again = graphed(p2, grid, NullRecorder())  # replayed on new pixels of the same grid
        assert graphed.graphs.replays == 1 and same(again, eager(p2, grid, NullRecorder()))
        assert not same(again, first)
        rec = MemoryRecorder()
        tapped = graphed(p1, grid, rec)  # a tapped pass runs the code, with its taps
        assert graphed.graphs.replays == 1 and {"block0", "aligner"} <= set(rec.tensors)
        assert same(tapped, first)
        graphed(p3, other, NullRecorder())  # another grid: its own graph
        assert graphed.graphs.captures == 2


def test_one_compiled_graph_serves_every_layer(monkeypatch):
    """The weights are an argument, not a guard: 12 layers' distinct tensors compile each piece
    once (past torch's recompile limit of 8 a per-layer guard would silently run eager)."""
    import dataclasses

    import torch._dynamo
    from torch._dynamo.utils import counters

    from engine.qwen3_vl.vision import BlockWeights

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(fused, "_compile", lambda fn: torch.compile(fn, backend="eager", dynamic=False,
                                                                    fullgraph=True))
    _, req = make_request("qwen3-vl")
    tower = runner.load_tower(req, load_config(req.weights_dir))
    fb = fused.FusedBlock(tower.eager)
    x = torch.randn(16, tower.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    cos, sin = tower.tables((1, 4, 4), "cpu")[1:]
    tower._cu = [0, 16]
    layers = [BlockWeights(*(t.clone() for t in dataclasses.astuple(tower.blocks[i % len(tower.blocks)])))
              for i in range(12)]
    with torch.inference_mode():
        for blk in layers:
            assert torch.equal(fb(x, blk, cos, sin), tower.eager(x, blk, cos, sin))
    assert fb.ok and counters["stats"]["unique_graphs"] == 2  # attn_in and out, once each
