"""Running the language backbone for a `RunRequest`.

`run_language` is the piece the whole-model runner calls after planning the image: it takes a
callable that yields the aligner rows (run once, when prefill first reaches the span). `run` is a
language-only runner whose image rows come from `req.options["image_rows"]` ([cells_h*cells_w,
dim]) and `req.options["cells"]`, for tests that stand in a fixed aligner output for the tower.
Numerics (`Numerics.of`): `req.options["language_numerics"]` is `official` by default, the official
code's only mode: bf16 activations whatever dtype the vision half runs in, with the kernels'
quantisation (FP8 GEMM inputs for quantised weights, FP8 window KV, FP4 indexer q / k and
compressed KV); `semantic` runs the request's dtype with exact weights and no rounding.
`req.options["kernel_quant"]` overrides the rounding in either mode.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from tensordiff.models.deepseek_v41_flash.options import OPTIONS

from engine import backend as backends
from engine.errors import EngineInputError
from engine.runtime.speed_path import SpeedPath
from engine.deepseek_v41_flash.attention import INDEX_TIES
from engine.deepseek_v41_flash.model import LanguageModel
from engine.deepseek_v41_flash.tokens import DEFAULT_PROMPT, tokenize

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# mode -> (activation dtype, None = the request's; the kernels' rounding by default)
MODES = {"official": (torch.bfloat16, True), "semantic": (None, False)}
# The language boundaries (fnmatch patterns) whose compute dtype a run declares, so the comparator
# judges them in it even when the vision half runs in another (`run.boundary_dtypes`).
BOUNDARIES = ("embeddings", "engram.*", "index.*", "attn.*", "router.*", "hidden.*", "logits*")


@dataclass(frozen=True)
class Numerics:
    mode: str
    dtype: torch.dtype
    kernel_quant: bool

    @classmethod
    def of(cls, req) -> "Numerics":
        """The language half's activation dtype and rounding for a request (see the module doc)."""
        opts = OPTIONS.resolve(req.options)  # typed: a hand-built request may hold the user's strings
        mode = opts["language_numerics"]
        if mode not in MODES or req.dtype not in DTYPES:
            bad = f"language_numerics {mode!r}" if mode not in MODES else f"dtype {req.dtype!r}"
            raise EngineInputError(f"{bad} is not supported (language_numerics: {' or '.join(MODES)}; "
                                   f"dtype: {' or '.join(DTYPES)})")
        dtype, rounding = MODES[mode]
        kq = opts["kernel_quant"]  # None: the mode's own rounding
        return cls(mode, dtype or DTYPES[req.dtype], rounding if kq is None else kq)

    def facts(self) -> dict:
        return {"mode": self.mode, "dtype": str(self.dtype).split(".")[-1], "kernel_quant": self.kernel_quant}

    def boundary_dtypes(self) -> dict:
        return {pattern: self.facts()["dtype"] for pattern in BOUNDARIES}


# the backbone's speed path: one eager route; its attention is the engine's own sparse einsum
# (window + compressed groups + sink), never SDPA, so no kernel choice or fallback exists there
SPEED = {"ran": "eager", "attention": "einsum"}


def language_model(req, num: Numerics | None = None) -> LanguageModel:
    """The backbone a `RunRequest` asks for (the runner's and the local-error stages' one)."""
    num = num or Numerics.of(req)
    return LanguageModel.load(Path(req.weights_dir), dtype=num.dtype, backend=backends.get(req.backend),
                              fault=req.fault, device=req.device, kernel_quant=num.kernel_quant,
                              index_keys=OPTIONS.resolve(req.options)["index_keys"],
                              layers=(req.options or {}).get("layers"),
                              parallel=(req.options or {}).get("parallel"))  # a rank (`distributed`)


def run_language(req, rec, image, cells) -> dict:
    """Tokenise `req.prompt`, prefill in `req.chunk` chunks, decode `req.decode` steps; record the
    language boundaries when `req.taps`. `image` yields one image's aligner rows and `cells` is
    its token grid; for several images both are lists, one entry per `<image>` in prompt order
    (None: no image). Returns the facts to merge into the run's `inputs`."""
    num = Numerics.of(req)
    if req.decode < 0:
        raise EngineInputError(f"decode must be >= 0 (got {req.decode})")
    lm = language_model(req, num)
    rec.update_run(language_numerics=num.facts(), boundary_dtypes=num.boundary_dtypes())
    prompt = req.prompt if req.prompt is not None else DEFAULT_PROMPT
    if image is None:
        images = []
    elif isinstance(image, (list, tuple)):
        images = [(f, tuple(c)) for f, c in zip(image, cells)]
    else:
        images = [(image, tuple(cells))]
    ids, types = tokenize(prompt, lm.cfg, [c for _, c in images] or None)
    if ids.numel() + req.decode > lm.cfg.max_seq_len:
        raise EngineInputError(f"prompt of {ids.numel()} tokens + {req.decode} decode steps exceeds "
                               f"max_seq_len {lm.cfg.max_seq_len}")
    seq = lm.sequence(ids, types, images=images)
    taps = rec if req.taps else None
    last = seq.prefill(req.chunk, taps)
    generated = seq.decode(req.decode, last, taps)
    rec.update_run(semantics={"index_ties": INDEX_TIES, "index_keys": lm.index_keys},
                   layers=list(lm.layers) if len(lm.layers) < lm.cfg.n_layers else None)
    return {"prompt": prompt, "prompt_tokens": int(ids.numel()),
            "input_ids_sha256": hashlib.sha256(ids.numpy().tobytes()).hexdigest(),
            "span_start": seq.span_start, "span_starts": seq.span_starts, "generated": generated, "stop": seq.stop,
            "chunk": req.chunk, "vision_calls": seq.vision_calls}


def run(req, rec) -> None:
    if req.weights_dir is None:
        raise EngineInputError("the DeepSeek V4.1 Flash language engine needs a weights directory")
    opts = req.options or {}
    rows, cells = opts.get("image_rows"), opts.get("cells")
    image = (lambda: rows) if rows is not None else None
    facts = run_language(req, rec, image, tuple(cells) if cells is not None else None)
    rec.update_run(inputs={"language": {k: v for k, v in facts.items() if k not in ("generated", "stop", "chunk",
                                                                                    "vision_calls", "span_starts")}},
                   outputs={"generated": facts["generated"], "stop": facts["stop"]}, chunk=req.chunk,
                   speed_path=SpeedPath(parts={"language": dict(SPEED)}).as_json())
