"""What a model adapter provides to the toolkit (entry-point group `tensordiff.models`).

An adapter ties one model's contract to its two producers. Our own adapters live in
`tensordiff.models`; a user's engine plugs in the same way from its own package:

    [project.entry-points."tensordiff.models"]
    my-model = "my_pkg.tensordiff_adapter:ADAPTER"
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from tensordiff.judge.contract import Contract
from tensordiff.pipeline.faults import Fault, find
from tensordiff.pipeline.options import NO_OPTIONS, OptionTable

SIDES = ("oracle", "engine")


@dataclass(frozen=True)
class RunRequest:
    weights: str  # as the user gave it: "synthetic:tiny", "synthetic:full", ... or a checkpoint dir
    weights_dir: Path | None = None  # the resolved checkpoint directory both sides load from
    image: Path | None = None
    # the prompt's further images, in order, after `image` (`tensordiff.format.images` names their taps)
    more_images: tuple[Path, ...] = ()
    device: str = "cpu"
    dtype: str = "float32"
    backend: str = "torch"  # engine kernels: "torch" reference ops or compiled "hip"
    fault: str | None = None
    prompt: str | None = None
    chunk: int | None = None  # engine prefill chunk length (None: one chunk)
    decode: int = 0  # decode steps after the prompt
    taps: bool = True
    # typed values, parsed once against the adapter's option table (`tensordiff.pipeline.options`)
    options: dict[str, Any] = field(default_factory=dict)


class Recorderish(Protocol):
    enabled: bool

    def record(self, name: str, tensor: Any, *, boundary: str | None = None) -> None: ...

    def update_run(self, **fields: Any) -> None: ...


Runner = Callable[[RunRequest, Recorderish], None]


@dataclass(frozen=True)
class ModelAdapter:
    name: str
    contract: Contract
    faults: tuple[Fault, ...]
    oracle: Callable[[], Runner]  # lazily imports the oracle side
    engine: Callable[[], Runner]  # lazily imports the engine side
    # Resolves a weights SPEC to a checkpoint directory (writing synthetic weights on first use);
    # raises BadInput for an unknown spec or an incomplete checkpoint.
    weights: Callable[[str], Path] | None = None
    description: str = ""
    # Optional: the engine's stages, for local error (each engine stage run on the ORACLE's
    # tensors upstream of its boundary). Returns `make_stages(req, run) -> {boundary: stage}`,
    # `stage(inputs: {name: tensor}) -> {name: tensor}`; see `tensordiff/pipeline/local_error.py`.
    stages: Callable[[], Any] | None = None
    # Optional: the discrete preprocessing rules an image may exercise (`tensordiff.judge.geometry.Rule`,
    # predicates over the oracle's `plan` boundary); the gate reports which its images reach.
    geometry: tuple[Any, ...] = ()
    # The code the ORACLE side runs: dotted module/package names (or file/folder paths), found
    # without importing them. Their bytes key the oracle cache (`oracle_cache.key`), so editing
    # the oracle invalidates its cached dumps; an adapter that declares none gets no oracle cache.
    sources: tuple[str, ...] = ()
    # Optional: the tensor-name prefixes a run reads from the checkpoint (None: all of it). Only
    # the shards holding them are hashed into the weights fingerprint (`provenance.run_weights`),
    # so a vision gate on a 48-shard checkpoint reads one shard. Too narrow a list would let an
    # edit go unseen: list every prefix either side reads.
    weight_prefixes: Callable[[RunRequest], tuple[str, ...] | None] | None = None
    # The run options (`-o NAME=VALUE`): name, type, default, help; parsed once into RunRequest.options.
    options: OptionTable = NO_OPTIONS
    # Whether both runners take several images per prompt (RunRequest.more_images); otherwise a
    # second --image is refused before anything runs.
    multi_image: bool = False
    # Optional: the options a float32 REFERENCE run sets, (name, value) pairs: the model's exact
    # numerics where its default numerics round whatever the dtype (DeepSeek's language half runs
    # bf16 with kernel quantisation under its default `official` numerics). The semantic pass runs
    # both sides with them, and the numeric pass's float32 reference is the oracle with them; the
    # numeric pass's floor run and engine keep the user's options (`pipeline.exact_request`).
    exact_options: tuple[tuple[str, Any], ...] = ()
    # Optional: the dtype the model's official computation runs in for a weights SPEC ("bfloat16",
    # "float32"; a checkpoint's is what its config declares): what a run with no --dtype computes
    # (`runs.run_dtype`). None: float32.
    official_dtype: Callable[[str], str] | None = None
    # Optional: `tensordiff inspect CKPT` on a checkpoint directory. Returns `describe(path,
    # layers)`, which gives None for a directory of another model, else a view with `lines()` (the
    # report, plain words) and `problems` (what stops a run: missing shards, tensors, scales).
    checkpoint: Callable[[], Callable[[Path, str | None], Any]] | None = None

    def runner(self, side: str) -> Runner:
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}")
        return self.oracle() if side == "oracle" else self.engine()

    def fault(self, name: str) -> Fault:
        return find(self.faults, name)


def lazy(target: str) -> Callable[[], Any]:
    """`lazy("pkg.module:attr")`: a factory that imports the attribute when first called, so an
    adapter module never imports model code (or torch) at import time."""
    module, _, attr = target.partition(":")

    def load():
        import importlib

        return getattr(importlib.import_module(module), attr)

    return load
