"""The engine's Qwen3-VL run: picture -> vision tower boundaries, prompt -> M-RoPE positions; with a
prompt or decode steps, on through the text decoder (`sequence`): chunked prefill (`req.chunk`),
then `req.decode` greedy steps."""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from tensordiff.models.qwen3_vl.options import OPTIONS

from .. import backend as backends
from ..errors import EngineInputError
from ..runtime.fused import compile_unavailable
from ..runtime.speed_path import SpeedPath
from . import faults as F
from .config import load_config
from .decoder import Decoder
from .positions import decode_positions, mrope_positions, tokenize
from .sequence import Sequence
from .preprocess import decode, preprocess
from .vision import VisionTower
from .weights import load_visual

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise EngineInputError(f"unsupported dtype {name!r} ({', '.join(DTYPES)})")
    return DTYPES[name]


def speed_policy(device, asked: dict[str, str], speed: SpeedPath) -> dict[str, str]:
    """The CUDA speed paths asked for ({"block": fuse, "cuda_graphs": graphs}) as they can run on
    `device`: 'off' where they cannot. Off on the CPU is the documented route for 'auto'; an explicit
    'on', or 'auto' on a GPU, that cannot run is a fallback recorded in `speed`."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    why = {"block": compile_unavailable(device),
           "cuda_graphs": None if cuda else f"CUDA graphs are CUDA only (device {device.type})"}
    what = {"block": "vision block compiled -> eager", "cuda_graphs": "CUDA graphs -> eager"}
    policy = {}
    for part, wanted in asked.items():
        if why[part] is not None and wanted != "off":
            if wanted == "on" or cuda:
                speed.fallback(what[part], why[part])
            wanted = "off"
        policy[part] = wanted
    return policy


def load_tower(req, cfg, speed=None, fuse: str = "off", graphs: str = "off", attention_prefer=None) -> VisionTower:
    """The tower a `RunRequest` asks for (the runner's and the local-error stages' one); fuse and
    graphs as `speed_policy` resolved them (the stages run eager); attention_prefer: CUDA kernel
    names in order (`engine.runtime.attention`), None for the default order."""
    dtype = torch_dtype(req.dtype)
    weights = load_visual(req.weights_dir, cfg.vision, dtype, req.device)
    return VisionTower(cfg.vision, weights, backends.get(req.backend), dtype, F.check(req.fault), speed=speed,
                       fuse=fuse, graphs=graphs, attention_prefer=attention_prefer)


def speed_facts(tower: VisionTower, asked: dict, policy: dict, speed: SpeedPath) -> dict:
    """The manifest's `speed_path` after the passes run so far: asked, ran, captures, fallbacks."""
    fz, g = tower._fused, tower.graphs
    if fz is not None and fz.error:
        speed.fallback("vision block compiled -> eager", fz.error)
    if g is not None and g.error:
        speed.fallback("CUDA graphs -> eager", g.error)
    speed.parts["vision"] = {
        "block": {"asked": asked["block"], "policy": policy["block"], "ran": tower.ran},
        "cuda_graphs": {"asked": asked["cuda_graphs"], "policy": policy["cuda_graphs"],
                        "captured": g.captures if g else 0, "replayed": g.replays if g else 0}}
    return speed.as_json()


def run(req, rec) -> None:
    fault = F.check(req.fault)
    if req.weights_dir is None:
        raise EngineInputError("no checkpoint directory resolved for the engine")
    if req.image is None:
        raise EngineInputError("qwen3-vl needs an image")
    if req.decode < 0:
        raise EngineInputError(f"decode steps must be >= 0, not {req.decode}")
    torch_dtype(req.dtype), backends.get(req.backend)  # a bad dtype or backend is refused before any work
    cfg = load_config(req.weights_dir)
    if req.decode and cfg.text is not None and req.decode >= cfg.text.max_position_embeddings:
        # refused before any work: the prompt comes on top, so no such sequence fits
        raise EngineInputError(f"decode {req.decode} steps cannot fit the text model's max_position_embeddings "
                               f"{cfg.text.max_position_embeddings} (prompt tokens + decode steps); ask for fewer")
    opts = OPTIONS.resolve(req.options)
    processor = opts["processor"]

    img = decode(Path(req.image))
    try:
        px = preprocess(img, cfg.processor, processor, raster=fault == F.MERGE_ORDER_RASTER,
                        ceil_sides=fault == F.RESIZE_CEIL_SIDES)
    except EngineInputError as e:  # the picture's own fault (its size, its shape): name the file
        raise EngineInputError(f"{req.image}: {e}") from None
    grid_thw = px.grid_thw
    for name, t in px.plan.record().items():
        rec.record(name, t, boundary="plan")
    rec.record("patches", px.pixel_values)

    speed = SpeedPath()
    asked = {"block": opts["fuse"], "cuda_graphs": opts["graphs"]}
    policy = speed_policy(req.device, asked, speed)
    # one pass: 'auto' stays eager (a one-shot check pays no compile or capture)
    tower = load_tower(req, cfg, speed, fuse=policy["block"], graphs=policy["cuda_graphs"])
    with torch.inference_mode():
        seen = tower(px.pixel_values.to(req.device), grid_thw, rec)

    prompt = tokenize(req.prompt, grid_thw, cfg)
    if cfg.text is not None and prompt.input_ids.shape[0] + req.decode > cfg.text.max_position_embeddings:
        raise EngineInputError(f"prompt of {prompt.input_ids.shape[0]} tokens + decode {req.decode} steps exceeds "
                               f"the text model's max_position_embeddings {cfg.text.max_position_embeddings}")
    pos, deltas = mrope_positions(prompt, cfg.vision.spatial_merge_size)
    carried = 0 if fault == F.MROPE_NO_DELTA else deltas  # what decoding will add
    rec.record("positions.ids", pos)
    rec.record("positions.rope_deltas", torch.tensor([carried], dtype=torch.int64))
    if req.decode:
        rec.record("positions.decode", decode_positions(prompt.input_ids.shape[0], req.decode, carried))

    facts = {}
    if req.prompt is not None or req.decode > 0:  # the language path
        if cfg.text is None:
            raise EngineInputError(f"{req.weights_dir}/config.json has no text_config: no language path")
        if req.chunk is not None and req.chunk < 1:
            raise EngineInputError(f"chunk must be at least 1 (got {req.chunk})")
        dtype = torch_dtype(req.dtype)
        dec = Decoder.load(req.weights_dir, cfg.text, cfg.tie_word_embeddings, backends.get(req.backend), dtype,
                           req.device, fault)
        stops = {cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.image_token_id, cfg.video_token_id}
        seq = Sequence(dec, prompt.input_ids, pos, carried, cfg.image_token_id, stops, seen.embeds, seen.deepstack)
        taps = rec if req.taps else None
        last = seq.prefill(req.chunk, taps)
        generated = seq.decode(req.decode, last, taps)
        rec.update_run(outputs={"generated": generated, "stop": seq.stop}, chunk=req.chunk)
        facts = {"input_ids_sha256": hashlib.sha256(prompt.input_ids.numpy().tobytes()).hexdigest()}

    # model facts only: the core writes the provenance (weights, versions, the image) itself
    inputs = {
        "resized": [px.plan.resized_height, px.plan.resized_width],
        "grid": list(px.plan.grid), "cells": list(px.plan.cells), "grid_thw": list(grid_thw),
        "processor": processor, "prompt": req.prompt, "tokens": int(prompt.input_ids.shape[0]), "decode": req.decode, **facts,
    }
    rec.update_run(inputs=inputs, fault=fault, speed_path=speed_facts(tower, asked, policy, speed))
