"""The engine runner, and `VisionEngine`, the reusable vision path.

    run(RunRequest(weights=..., weights_dir=..., image=..., device="cuda", dtype="bfloat16"), rec)

Taps at the five boundaries are explicit `rec.record` calls guarded by `rec.enabled`, so a
`NullRecorder` costs a branch. Options (`req.options`, typed by `tensordiff.models.deepseek_v41_flash.options`):
`attention` = SDPA kernel names to prefer on CUDA (see `engine.runtime.attention.KERNELS`), `fuse`
and `graphs` = the CUDA speed paths (`fused`), `kernel_quant` = the language kernels' round trips.
The run's `speed_path` (`VisionEngine.speed_path`) goes into the manifest: what was asked, what ran,
the SDPA kernels taken and every fallback with its reason. Several images (`req.more_images`):
each is planned and encoded on its own, image K >= 1 tapped under `image.K.` (`tensordiff.format.images`).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path

import torch

from tensordiff.format.images import ImageRecorder
from tensordiff.models.deepseek_v41_flash.options import OPTIONS

from .. import backend as backends
from ..errors import EngineInputError
from ..runtime import delegate
from ..runtime import image as rimage
from ..runtime.speed_path import SpeedPath
from . import faults as F
from . import fused as ds_fused
import engine.deepseek_v41_flash.checkpoint as W
from .aligner import AlignerWeights, align, cell_index
from .config import Config
from .fused import GraphCache, can_compile, compile_unavailable
from engine.deepseek_v41_flash.image_processor import ImagePlan, patch_rows, plan_image, render
from .span import image_span
from .vision import NORM_EPS, VisionTower, pad_patch_rows, prepare_tower, tower_shapes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# the backend ops a vision block calls (its GEMMs are torch's on every backend): on the compiled
# route they are chosen for the block as a whole (`VisionEngine._delegate`)
BLOCK_OPS = ("rms_norm", "rope_rotate_half")
ALIGNER = ["aligner.w1.weight", "aligner.w1.bias", "aligner.w2.weight", "aligner.w2.bias"]
MARKERS = ["image_start", "image_end", "image_newline"]


def vision_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The vision path's tensors (tower, aligner over 3x3 cells, span markers) -> implied shapes."""
    cells = cfg.vision_dim * cfg.vision_downsample_ratio ** 2
    aligner = [(cfg.dim, cells), (cfg.dim,), (cfg.dim, cfg.dim), (cfg.dim,)]
    return {**tower_shapes(cfg), **dict(zip(ALIGNER, aligner)), **dict.fromkeys(MARKERS, (cfg.dim,))}


class VisionEngine:
    """Weights prepared once on `device`; then `preprocess(path)` and `encode(patches, plan)`."""

    def __init__(self, checkpoint: str | Path, *, device="cpu", dtype="float32", backend="torch",
                 fault: str | None = None, attention_prefer=None, fuse: str | None = None,
                 graphs: str | None = None):
        """fuse / graphs: 'off', 'on', 'auto' or None (the options' defaults: the TENSORDIFF_FUSE /
        TENSORDIFF_GRAPHS environment, else 'auto'; see `fused`); both are off on the CPU whatever
        is asked."""
        if dtype not in DTYPES:
            raise EngineInputError(f"dtype {dtype!r} is not supported (float32 or bfloat16)")
        self.fault = F.check(fault)
        if fuse is None or graphs is None:  # the options' defaults: the environment, else auto
            defaults = OPTIONS.resolve({})
            fuse, graphs = fuse or defaults["fuse"], graphs or defaults["graphs"]
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        self.backend = backends.get(backend)
        self.checkpoint = Path(checkpoint)
        self.cfg = Config.load(self.checkpoint)
        self.speed = SpeedPath()
        # the typed options' values (None: their defaults, from TENSORDIFF_FUSE / TENSORDIFF_GRAPHS)
        defaults = OPTIONS.resolve({})
        self.asked = {"block": fuse or defaults["fuse"], "cuda_graphs": graphs or defaults["graphs"]}
        cuda_only = None if self.device.type == "cuda" else f"CUDA graphs are CUDA only (device {self.device.type})"
        self.policy = {"block": self._possible("vision block compiled -> eager", self.asked["block"],
                                               None if can_compile(self.device) else
                                               compile_unavailable(self.device)),
                       "cuda_graphs": self._possible("CUDA graphs -> eager", self.asked["cuda_graphs"], cuda_only)}
        shapes = vision_shapes(self.cfg)
        t = W.read(self.checkpoint, list(shapes), shapes=shapes)
        tw = prepare_tower(t, self.cfg, self.dtype, self.device, pad_nonzero=fault == F.PATCH_PAD_NONZERO)
        self.tower = VisionTower(self.cfg, tw, self.backend, rope_interleaved=fault == F.ROPE_INTERLEAVED,
                                 pad_nonzero=fault == F.PATCH_PAD_NONZERO, attention_prefer=attention_prefer,
                                 numeric=self.fault if self.fault in F.NUMERIC else None,
                                 fuse=self.policy["block"], speed=self.speed)
        # 'on' captures at a grid's first pass, 'auto' at its second (a one-shot run stays eager)
        # a numeric fault keeps the eager block, and graphs would replay the unfaulted capture
        graphs = "off" if self.tower.numeric else self.policy["cuda_graphs"]
        self.graphs = None if graphs == "off" else GraphCache(None, after=0 if graphs == "on" else 1)
        cast = lambda n: t[n].to(device=self.device, dtype=self.dtype).contiguous()  # noqa: E731
        self.aligner = AlignerWeights(*(cast(n) for n in ALIGNER))
        self.markers = {n: cast(n) for n in MARKERS}
        self.delegation: dict | None = None  # measured at the first compiled pass (`_delegate`)

    def _possible(self, what: str, asked: str, why_not: str | None) -> str:
        """`asked`, or 'off' where it cannot run here. Off on the CPU is the documented route for
        'auto'; an explicit 'on', or 'auto' on a GPU, that cannot run is a silent fallback."""
        if why_not is None:
            return asked
        if asked == "on" or (asked == "auto" and self.device.type == "cuda"):
            self.speed.fallback(what, why_not)
        return "off"

    def speed_path(self) -> dict:
        """The manifest's `speed_path`: what was asked, what ran, which attention kernels, every
        fallback and why (as of the passes run so far)."""
        fz, g = self.tower._fused, self.graphs
        if fz is not None and fz.error:
            self.speed.fallback("vision block compiled -> eager", fz.error)
        if g is not None and g.error:
            self.speed.fallback("CUDA graphs -> eager", g.error)
        self.speed.parts["vision"] = {
            "block": {"asked": self.asked["block"], "policy": self.policy["block"], "ran": self.tower.ran},
            "cuda_graphs": {"asked": self.asked["cuda_graphs"], "policy": self.policy["cuda_graphs"],
                            "captured": g.captures if g else 0, "replayed": g.replays if g else 0},
            "attention_prefer": list(self.tower.attention_prefer) if self.tower.attention_prefer else None}
        if self.delegation is not None:  # the backend's own ops timed against torch's (`_delegate`)
            self.speed.parts["vision"]["ops_to_torch"] = self.delegation
        return self.speed.as_json()

    def plan(self, width: int, height: int) -> ImagePlan:
        rounding = "ceil" if self.fault == F.CONTAIN_CEIL else "round"
        return plan_image(width, height, self.cfg, contain_rounding=rounding)

    def preprocess(self, path) -> tuple[ImagePlan, torch.Tensor]:
        """Image file -> (plan, patches [N, 588] bf16 on the device)."""
        picture = rimage.open_rgb(path)
        plan = self.plan(*picture.size)
        return plan, patch_rows(render(picture, plan), self.cfg, self.device)

    def encode(self, patches: torch.Tensor, plan: ImagePlan, rec=None) -> torch.Tensor:
        """patches [N, 588] bf16 -> aligner rows [T, dim]; taps into `rec` when given and enabled."""
        taps = rec is not None and rec.enabled
        # (a backend carrying planted kernel faults keeps every kernel: the fault is the point)
        if self.delegation is None and self.backend.name != "torch" and not getattr(self.backend, "faults", ()) \
                and self._compiled_pass_due():
            self._delegate(patches, plan)
        if not taps and self.graphs is not None:
            # one CUDA graph per grid and input shape: the whole tower and aligner in one launch
            self.graphs.fn = lambda p: self._encode(p, plan, None)
            return self.graphs((plan.grid, tuple(patches.shape), patches.dtype), patches)
        return self._encode(patches, plan, rec)

    def _compiled_pass_due(self) -> bool:
        """Whether the pass about to run is the compiled route (`VisionTower.block_fn`'s rule)."""
        t = self.tower
        return t.fuse == "on" or (t.fuse == "auto" and t.passes >= 1)

    def _delegate(self, patches: torch.Tensor, plan: ImagePlan) -> None:
        """Once, before the first compiled pass of a non-torch backend, what runs where is
        measured where it runs (`runtime.delegate`; what was measured goes to the speed path):

        - outside the block (patch projection, final norm, aligner gather: eager ops, replayed in
          the pass's graph), each of the backend's kernels against torch's op on this pass's
          tensors; the clearly slower ones run torch's from now on;
        - the block, whole: compiled around the backend's norm and rope kernels (only the glue
          compiled), against compiled whole on torch's ops (which Inductor fuses into their
          neighbours), each as a replayed graph; the faster block is the one the passes run.

        The eager one-shot route never gets here, so `check` keeps running every kernel of the backend."""
        ref, t = backends.get("torch"), self.tower
        blk = t.w.blocks[0]
        with torch.inference_mode():
            x = t.embed(patches)
            cos, sin = t.rope(plan.grid, x.device)
            rows = pad_patch_rows(patches.to(t.w.patch_w.dtype), t.w.patch_w.shape[1])
            index = cell_index(*plan.grid, self.cfg.vision_downsample_ratio, x.device)
            calls = {"rms_norm": lambda be: be.rms_norm(x, t.w.norm, NORM_EPS),
                     "patch_linear": lambda be: be.patch_linear(rows, t.w.patch_w, t.w.patch_b),
                     "aligner_gather": lambda be: be.aligner_gather(x, index)}
            self.delegation = delegate.measure(calls, self.backend, ref, self.device)
            self.backend = t.backend = t.block.backend = delegate.delegating(self.backend, ref, self.delegation)
            own = ds_fused.FusedBlock(t.block)
            on_torch = copy.copy(t.block)
            on_torch.backend = ref
            reference = ds_fused.FusedBlock(on_torch)
            block = delegate.measure_block(lambda: own(x, blk, cos, sin), lambda: reference(x, blk, cos, sin),
                                           self.device)
        block["ops"] = list(BLOCK_OPS)
        block["where"] = "the compiled block, whole (CUDA-graph replayed on a GPU)"
        for name, fz in (("own_error", own), ("reference_error", reference)):
            if fz.error:  # a block that did not compile ran eagerly while timed: said, not hidden
                block[name] = fz.error
        self.delegation["block"] = block
        t._fused = reference if block["delegated"] else own  # the compiled block every later pass runs

    def _encode(self, patches: torch.Tensor, plan: ImagePlan, rec=None) -> torch.Tensor:
        taps = rec is not None and rec.enabled
        if taps:
            rec.record("patches", patches)
        out = self.align(self.tower.forward(patches, plan.grid, rec), plan.grid)
        if taps:
            rec.record("aligner", out)
        return out

    def align(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Final-norm patches [N, C] of a `grid` -> aligner rows [T, dim]."""
        index = cell_index(*grid, self.cfg.vision_downsample_ratio, x.device, flat_pad=self.fault == F.ALIGNER_FLAT_PAD)
        return align(x, index, self.aligner, self.backend, gelu_tanh=self.fault == F.GELU_TANH,
                     splitk_bf16=self.fault == F.SPLITK_BF16)

    def span(self, position: int, aligned: torch.Tensor, plan: ImagePlan):
        """The overlay span (rows for the whole image span) starting at sequence `position`."""
        return image_span(position, aligned, self.markers, plan.cells)


def engine_for(req) -> VisionEngine:
    """The VisionEngine a request asks for: its device, dtype, backend, fault and typed options."""
    opts = OPTIONS.resolve(req.options)
    return VisionEngine(req.weights_dir, device=req.device, dtype=req.dtype, backend=req.backend, fault=req.fault,
                        attention_prefer=opts["attention"], fuse=opts["fuse"], graphs=opts["graphs"])




def run(req, rec) -> None:
    if req.weights_dir is None or req.image is None:
        raise EngineInputError("the DeepSeek V4.1 Flash engine needs a weights directory and an image")
    if req.chunk is not None and req.prompt is None and req.decode == 0:
        raise EngineInputError("--chunk splits the language prefill: give a --prompt (with <image>) too")
    t0 = time.perf_counter()
    eng = engine_for(req)
    t1 = time.perf_counter()
    # each image of the prompt planned by its own size; image k's taps go under `image.k.`
    # (`tensordiff.format.images`; the first keeps the single-image names)
    prepared = [eng.preprocess(p) for p in (req.image, *req.more_images)]
    # model facts only: the core writes the provenance (weights, versions, the image) itself
    per_image = [{"grid": list(pl.grid), "cells": list(pl.cells), "span": pl.span} for pl, _ in prepared]
    rec.update_run(inputs=per_image[0], backend=eng.backend.name)
    if len(per_image) > 1:
        rec.update_run(inputs={"images": per_image})
    t2 = time.perf_counter()
    aligned = []
    for k, (plan, patches) in enumerate(prepared):
        irec = ImageRecorder(rec, k) if req.taps else None
        if irec is not None and irec.enabled:
            for name, t in plan.record().items():
                irec.record(name, t, boundary="plan")
        with torch.inference_mode():
            aligned.append(eng.encode(patches, plan, irec))
    if eng.device.type == "cuda":
        torch.cuda.synchronize(eng.device)
    # the gate's time breakdown (`tensordiff gate` reads run.timings); forward includes the taps' copies
    rec.update_run(timings={"load_weights": t1 - t0, "preprocess": t2 - t1, "forward": time.perf_counter() - t2},
                   speed_path=eng.speed_path())
    if req.prompt is not None or req.decode > 0:
        from engine.deepseek_v41_flash.language_run import SPEED, run_language

        # the tower ran once per image, above; prefill asks for an image's rows when it first
        # reaches its span
        facts = run_language(dataclasses.replace(req, fault=F.language(req.fault)), rec,
                             [lambda a=a: a for a in aligned], [tuple(pl.cells) for pl, _ in prepared])
        rec.update_run(outputs={"generated": facts["generated"], "stop": facts["stop"]},
                       language={"prompt_tokens": facts["prompt_tokens"], "span_start": facts["span_start"],
                                 "vision_calls": facts["vision_calls"],
                                 **({"span_starts": facts["span_starts"]} if len(prepared) > 1 else {})},
                       speed_path={**eng.speed_path(), "language": dict(SPEED)})

