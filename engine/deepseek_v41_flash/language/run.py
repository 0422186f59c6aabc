"""Running the language backbone for a `RunRequest`.

`run_language` is the piece the whole-model runner calls after planning the image: it takes a
callable that yields the aligner rows (run once, when prefill first reaches the span). `run` is a
language-only runner whose image rows come from `req.options["image_rows"]` ([cells_h*cells_w,
dim]) and `req.options["cells"]`, for tests that stand in a fixed aligner output for the tower.
`req.options["kernel_quant"]` (default off) turns on the kernels' FP8 / FP4 activation round trips.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

import torch

from ... import backend as backends
from ...errors import EngineInputError
from .model import LanguageModel
from .tokens import DEFAULT_PROMPT, tokenize

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def run_language(req, rec, image: Callable[[], torch.Tensor] | None, cells: tuple[int, int] | None) -> dict:
    """Tokenise `req.prompt`, prefill in `req.chunk` chunks, decode `req.decode` steps; record the
    language boundaries when `req.taps`. Returns the facts to merge into the run's `inputs`."""
    if req.dtype not in DTYPES:
        raise EngineInputError(f"dtype {req.dtype!r} is not supported (float32 or bfloat16)")
    if req.decode < 0:
        raise EngineInputError(f"decode must be >= 0 (got {req.decode})")
    lm = LanguageModel.load(Path(req.weights_dir), dtype=DTYPES[req.dtype], backend=backends.get(req.backend),
                            fault=req.fault, device=req.device,
                            kernel_quant=bool((req.options or {}).get("kernel_quant", False)))
    prompt = req.prompt if req.prompt is not None else DEFAULT_PROMPT
    ids, types = tokenize(prompt, lm.cfg, cells if image is not None else None)
    if ids.numel() + req.decode > lm.cfg.max_seq_len:
        raise EngineInputError(f"prompt of {ids.numel()} tokens + {req.decode} decode steps exceeds "
                               f"max_seq_len {lm.cfg.max_seq_len}")
    seq = lm.sequence(ids, types, image=image, cells=cells)
    taps = rec if req.taps else None
    last = seq.prefill(req.chunk, taps)
    generated = seq.decode(req.decode, last, taps)
    return {"prompt": prompt, "prompt_tokens": int(ids.numel()),
            "input_ids_sha256": hashlib.sha256(ids.numpy().tobytes()).hexdigest(),
            "span_start": seq.span_start, "generated": generated, "stop": seq.stop,
            "chunk": req.chunk, "vision_calls": seq.vision_calls}


def run(req, rec) -> None:
    if req.weights_dir is None:
        raise EngineInputError("the DeepSeek V4.1 Flash language engine needs a weights directory")
    opts = req.options or {}
    rows, cells = opts.get("image_rows"), opts.get("cells")
    image = (lambda: rows) if rows is not None else None
    facts = run_language(req, rec, image, tuple(cells) if cells is not None else None)
    rec.update_run(inputs={"language": {k: v for k, v in facts.items() if k not in ("generated", "stop", "chunk",
                                                                                    "vision_calls")}},
                   outputs={"generated": facts["generated"], "stop": facts["stop"]}, chunk=req.chunk)
