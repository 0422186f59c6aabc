"""Running one side of a model into a dump: the request (`make_request`, every input validated
before anything runs) and the run (`run_side`). The pipeline of a whole case (oracle cache,
engine, comparison, local error) is `tensordiff.pipeline.case`.
"""
from __future__ import annotations

from pathlib import Path

from tensordiff.pipeline import registry
from tensordiff.pipeline.adapter import ModelAdapter, RunRequest
from tensordiff.format.capture import Recorder
from tensordiff.errors import BadInput
from tensordiff.pipeline.inputs import check_image, default_image_path
from tensordiff.warmup import warm
from tensordiff.pipeline.options import parse_assignments, validate_request
from tensordiff.pipeline.provenance import describe_image, run_weights, versions
from tensordiff.version import VERSION


def make_request(model: str, *, image=None, weights="synthetic:tiny", device="cpu", dtype="float32",
                 backend="torch", fault=None, prompt=None, chunk=None, decode=0, processor=None, extra=(),
                 adapter: ModelAdapter | None = None, fault_dtype: str | None = None, layers: str | None = None,
                 more_images=(), **options) -> tuple[ModelAdapter, RunRequest]:
    """The validated request of one run; `adapter` when the caller already looked it up;
    `fault_dtype` the precision a fault's needs are checked in (a case's float32 semantic pass);
    `layers` a DeepSeek language layer subset ("0-2"), handed to both runners as `options["layers"]`;
    `more_images` the prompt's further images after `image`, in order (a repeated --image)."""
    warm()  # before any torch op of this process (synthetic weights included): see warmup.py
    adapter = adapter or registry.adapter(model)
    raw = {**options, **parse_assignments(extra)}
    if processor is not None:
        raw["processor"] = processor
    _, options = validate_request(adapter, fault=fault, options=raw, prompt=prompt, chunk=chunk, decode=decode,
                                  dtype=fault_dtype or dtype, images=1 + len(tuple(more_images)))
    if layers is not None:
        if adapter.name != "deepseek-v4.1-flash":
            raise BadInput(f"--layers selects DeepSeek V4.1 Flash language layers; {model} has no such option")
        options["layers"] = layers  # absent for every layer, so cache keys stay what they were
    if device != "cpu" and not device.startswith("cuda"):
        raise BadInput(f"unknown device {device!r} (cpu or cuda[:N])")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise BadInput("--device cuda was asked for, but torch sees no CUDA/ROCm GPU on this machine")
    img = Path(image) if image is not None else default_image_path()
    check_image(img)
    more = tuple(Path(p) for p in more_images)
    if more and not adapter.multi_image:
        raise BadInput(f"{model} takes one --image per prompt here (got {1 + len(more)})")
    for p in more:
        check_image(p)
    if more and prompt is not None and prompt.count("<image>") != 1 + len(more):
        raise BadInput(f"the prompt holds {prompt.count('<image>')} '<image>' placeholder(s) but {1 + len(more)} "
                       "images were given: one placeholder per --image, in order")
    if adapter.weights is None:
        raise BadInput(f"model {model} does not say how to load weights")
    wdir = adapter.weights(weights)
    return adapter, RunRequest(weights=weights, weights_dir=wdir, image=img, more_images=more, device=device, dtype=dtype,
                               backend=backend, fault=fault, prompt=prompt, chunk=chunk, decode=decode,
                               options=options)


def run_side(adapter: ModelAdapter, side: str, req: RunRequest, out: Path, *, fmt: str = "safetensors",
             overwrite: bool = False) -> Path:
    """Run one side into a dump at `out`. The provenance (weights content, versions, the input
    image) is written here, once per side; the runner adds its model facts (`rec.update_run`,
    merged in deeply)."""

    warm()
    producer = {"name": f"tensordiff-{side}", "version": VERSION, "side": side}
    image = describe_image(req.image)
    inputs = {"image": image} if image else {}
    if req.more_images:  # the prompt's further images, in order (absent for one image)
        inputs["more_images"] = [describe_image(p) for p in req.more_images]
    run = {"inputs": inputs, "dtype": req.dtype, "device": req.device,
           "weights": run_weights(adapter, req), "weights_spec": req.weights, "versions": versions(),
           "backend": req.backend if side == "engine" else None, "fault": req.fault if side == "engine" else None,
           "options": adapter.options.for_side(req.options, side)}
    rec = Recorder(out, model=adapter.name, producer=producer, run=run, fmt=fmt, overwrite=overwrite)
    runner = adapter.runner(side)
    try:
        runner(req, rec)
    except BaseException:
        rec.abort()
        raise
    return rec.close()

