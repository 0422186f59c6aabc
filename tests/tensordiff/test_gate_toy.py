"""A toy model adapter for the gate, calibration, local-error and report tests (and its own tests).

The toy pipeline has the five boundaries on a 4x6 patch grid (56x84 px, 14 px patches):

    patches ──┐
              ├─> block0 -> final_norm -> aligner (2x2 token cells of 3x3 patches)
    rope ─────┘

`final_norm` multiplies by GAIN (it amplifies absolute differences, like a deep tower does), so
an upstream drift that is within tolerance at `block0` can exceed it at `final_norm`. The engine
exposes its stages (`ADAPTER.stages`) for local error. Faults:
    patches-shift          -> patches     (the picture shifted one pixel right)
    rope-flip              -> rope        (sin negated)
    aligner-bias           -> aligner     (a bias added in the aligner)
    drift-and-aligner-bias -> aligner     (block0 drifts within tolerance, which end to end blames
                                           final_norm, AND the aligner carries the bias)
    oracle-like-drift      -> final_norm  (only the drift: no stage is wrong by itself)
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from tensordiff.pipeline.adapter import Fault, ModelAdapter
from tensordiff.judge.contract import Boundary, Contract

NAME = "toy-vision"
GRID = (4, 6)
CELLS = (2, 2)
P = 14
GAIN = 300.0
DRIFT = 3e-5  # under the fp32 atol (1e-4) at block0, over it after GAIN at final_norm
BIAS = 25.0  # the aligner fault: far outside fp32 tolerances and outside 10x the bf16 noise floor

CONTRACT = Contract(NAME, (
    Boundary("patches", (), "pixel rows [24, 588], (c, y, x) per patch", layout="grid", probes=("within-unit",)),
    Boundary("rope", (), "rope.cos / rope.sin [24, 8]", layout="grid", probes=("unit-circle",)),
    Boundary("block0", ("patches", "rope"), "projected, rotated patches [24, 16]", layout="grid"),
    Boundary("final_norm", ("block0",), "GAIN x block0 [24, 16]", layout="grid"),
    Boundary("aligner", ("final_norm",), "3x3 cell means @ W [4, 8]", layout="cells"),
))

FAULTS = (
    Fault("patches-shift", "patches", "the picture shifted one pixel right"),
    Fault("rope-flip", "rope", "sin negated"),
    Fault("aligner-bias", "aligner", "a bias added in the aligner"),
    Fault("drift-and-aligner-bias", "aligner", "block0 drifts within tolerance, and the aligner carries a bias"),
    Fault("oracle-like-drift", "final_norm", "block0 drifts within tolerance; nothing else is wrong"),
)


def weights() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(588, 16, generator=g) / 24, torch.randn(16, 8, generator=g) / 4


def patches_of(image: Path, shift: bool = False) -> torch.Tensor:
    from PIL import Image

    with Image.open(image) as im:
        x = np.asarray(im.convert("RGB").resize((GRID[1] * P, GRID[0] * P), Image.Resampling.BILINEAR), np.float32)
    if shift:
        x = np.concatenate([x[:, :1], x[:, :-1]], axis=1)
    t = torch.from_numpy(x).permute(2, 0, 1) / 255 * 2 - 1  # [3, H, W]
    t = t.reshape(3, GRID[0], P, GRID[1], P).permute(1, 3, 0, 2, 4).reshape(GRID[0] * GRID[1], 3 * P * P)
    return t.to(torch.bfloat16)


def rope(flip: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    ys, xs = torch.meshgrid(torch.arange(GRID[0]), torch.arange(GRID[1]), indexing="ij")
    inv = 1.0 / 100 ** (torch.arange(4) / 4)
    ang = torch.cat([ys.reshape(-1, 1) * inv, xs.reshape(-1, 1) * inv], -1).float()  # [24, 8]
    return ang.cos(), (-ang.sin() if flip else ang.sin())


def block0(patches, cos, sin, drift: bool = False, dtype=torch.float32):
    w1, _ = weights()
    x = (patches.to(dtype) @ w1.to(dtype)).float()  # [24, 16]
    a, b = x[:, :8], x[:, 8:]
    out = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    return (out + DRIFT if drift else out).to(dtype)  # the run's dtype, like a tower's output


def final_norm(b0):
    return (b0.float() * GAIN).to(b0.dtype)


def aligner(fn, bias: bool = False):
    _, w2 = weights()
    g = fn.reshape(GRID[0], GRID[1], 16)
    g = torch.nn.functional.pad(g.permute(2, 0, 1), (0, 3 * CELLS[1] - GRID[1], 0, 3 * CELLS[0] - GRID[0]))
    cells = torch.nn.functional.avg_pool2d(g[None], 3)[0].permute(1, 2, 0).reshape(-1, 16)  # [4, 16]
    out = cells.float() @ w2
    return (out + BIAS if bias else out).to(fn.dtype)


def _record_all(rec, t: dict, grid=GRID) -> None:
    rec.update_run(inputs={"image": "toy", "grid": list(grid), "cells": list(CELLS)})
    for k, v in t.items():
        rec.record(k, v)


def _dtype(req):
    return torch.bfloat16 if req.dtype == "bfloat16" else torch.float32


def oracle_run(req, rec):
    p = patches_of(req.image)
    cos, sin = rope()
    b0 = block0(p, cos, sin, dtype=_dtype(req))
    fn = final_norm(b0)
    _record_all(rec, {"patches": p, "rope.cos": cos, "rope.sin": sin, "block0": b0, "final_norm": fn,
                      "aligner": aligner(fn)})


def _drift(req) -> bool:
    return req.fault in ("drift-and-aligner-bias", "oracle-like-drift")


def engine_run(req, rec):
    p = patches_of(req.image, shift=req.fault == "patches-shift")
    cos, sin = rope(flip=req.fault == "rope-flip")
    b0 = block0(p, cos, sin, drift=_drift(req), dtype=_dtype(req))
    fn = final_norm(b0)
    al = aligner(fn, bias=req.fault in ("aligner-bias", "drift-and-aligner-bias"))
    _record_all(rec, {"patches": p, "rope.cos": cos, "rope.sin": sin, "block0": b0, "final_norm": fn, "aligner": al})


def engine_stages(req, run):
    """The engine's stages, on the oracle's tensors (the local-error hook)."""
    assert run["inputs"]["grid"] == list(GRID)
    return {
        "block0": lambda i: {"block0": block0(i["patches"], i["rope.cos"], i["rope.sin"], drift=_drift(req),
                                             dtype=_dtype(req))},
        "final_norm": lambda i: {"final_norm": final_norm(i["block0"])},
        "aligner": lambda i: {"aligner": aligner(i["final_norm"],
                                                 bias=req.fault in ("aligner-bias", "drift-and-aligner-bias"))},
    }


def weights_dir(spec: str) -> Path:
    from tensordiff.errors import BadInput
    from tensordiff.cache import cache_root

    if spec != "synthetic:tiny":
        raise BadInput(f"the toy model only has synthetic:tiny weights, not {spec!r}")
    d = cache_root() / "toy-weights"
    d.mkdir(parents=True, exist_ok=True)
    cfg, text = d / "config.json", json.dumps({"seed": 7})
    if not cfg.is_file() or cfg.read_text() != text:
        # written whole under a unique name, then renamed: tests in parallel processes share the
        # cache, and one must never read another's half-written file
        import os
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix=".config.json.", dir=d)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, cfg)
    return d


ADAPTER = ModelAdapter(NAME, CONTRACT, FAULTS, oracle=lambda: oracle_run, engine=lambda: engine_run,
                       weights=weights_dir, description="toy", stages=lambda: engine_stages, sources=(__file__,))
# The same model from a third party that does not expose stages.
NO_STAGES = ModelAdapter("toy-nostages", Contract("toy-nostages", CONTRACT.boundaries), FAULTS,
                         oracle=lambda: oracle_run, engine=lambda: engine_run, weights=weights_dir, sources=(__file__,))
TOYS = {ADAPTER.name: ADAPTER, NO_STAGES.name: NO_STAGES}


def install(monkeypatch) -> None:
    """Make the registry see the toy adapters (beside the installed ones)."""
    from tensordiff.pipeline import registry

    real_adapter, real_names, real_contract = registry.adapter, registry.names, registry.contract
    monkeypatch.setattr(registry, "adapter", lambda n: TOYS[n] if n in TOYS else real_adapter(n))
    monkeypatch.setattr(registry, "names", lambda: sorted(set(real_names()) | set(TOYS)))
    monkeypatch.setattr(registry, "contract", lambda m: TOYS[m].contract if m in TOYS else real_contract(m))


def write_gate(tmp_path: Path, body: str = "", name: str = "gate.toml", model: str = NAME) -> Path:
    p = tmp_path / name
    p.write_text(f'[gate]\nname = "toy gate"\n\n[[model]]\nname = "{model}"\n{body}')
    return p


# ----------------------------------------------------------------------------- the toy's own tests

def test_toy_engine_matches_oracle_when_clean():
    from tensordiff.format.capture import MemoryRecorder
    from tensordiff.pipeline.adapter import RunRequest
    from tensordiff.pipeline.inputs import default_image_path

    a, b = MemoryRecorder(), MemoryRecorder()
    req = RunRequest("synthetic:tiny", image=default_image_path())
    oracle_run(req, a)
    engine_run(req, b)
    assert a.tensors.keys() == b.tensors.keys()
    for k in a.tensors:
        assert torch.equal(a.tensors[k], b.tensors[k]), k


def test_toy_drift_is_within_tolerance_at_block0_and_beyond_it_after_the_gain():
    # the premise of the local-error test: the drift alone passes at block0, fails at final_norm
    from tensordiff.pipeline.inputs import default_image_path
    from tensordiff.judge.tolerance import DEFAULTS

    tol = DEFAULTS["float32"]
    p = patches_of(default_image_path())
    cos, sin = rope()
    a, b = block0(p, cos, sin), block0(p, cos, sin, drift=True)
    assert ((a - b).abs() <= tol.atol + tol.rtol * a.abs()).all()
    fa, fb = final_norm(a), final_norm(b)
    assert ((fa - fb).abs() > tol.atol + tol.rtol * fa.abs()).any()
    assert math.isfinite(GAIN)
