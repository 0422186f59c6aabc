"""Running the two sides of a model into dumps, and `check` (both sides, then compare).

Oracle dumps are the expensive side; they are cached under `cache_root()/oracle/<key>`, keyed by
everything that determines them: a digest of the oracle's own sources and the adapter, the
torch / transformers / Pillow versions, the weights fingerprint, the image bytes, dtype, device
and the language options.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from . import registry
from .adapter import ModelAdapter, RunRequest
from .capture import Recorder
from .errors import BadInput
from .inputs import check_image, default_image_path, facts_of
from .outputs import dump_root
from .warmup import warm


def make_request(model: str, *, image=None, weights="synthetic:tiny", device="cpu", dtype="float32",
                 backend="torch", fault=None, prompt=None, chunk=None, decode=0, processor=None, extra=(),
                 **options) -> tuple[ModelAdapter, RunRequest]:
    warm()  # before any torch op of this process (synthetic weights included): see warmup.py
    adapter = registry.adapter(model)
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput(f"--option takes KEY=VALUE, not {item!r}")
        options[key] = value
    if processor is not None:
        options["processor"] = processor
    if fault is not None:
        known = [f.name for f in adapter.faults]
        if fault not in known:
            raise BadInput(f"unknown fault {fault!r} for {model} (known: {', '.join(known)})")
    if device != "cpu" and not device.startswith("cuda"):
        raise BadInput(f"unknown device {device!r} (cpu or cuda[:N])")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise BadInput("--device cuda was asked for, but torch sees no CUDA/ROCm GPU on this machine")
    img = Path(image) if image is not None else default_image_path()
    check_image(img)
    if adapter.weights is None:
        raise BadInput(f"model {model} does not say how to load weights")
    wdir = adapter.weights(weights)
    return adapter, RunRequest(weights=weights, weights_dir=wdir, image=img, device=device, dtype=dtype,
                               backend=backend, fault=fault, prompt=prompt, chunk=chunk, decode=decode,
                               options=options)


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for pkg in ("torch", "transformers", "pillow", "numpy", "tensordiff"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def run_side(adapter: ModelAdapter, side: str, req: RunRequest, out: Path, *, fmt: str = "safetensors",
             overwrite: bool = False) -> Path:
    import tensordiff

    warm()
    producer = {"name": f"tensordiff-{side}", "version": tensordiff.__version__, "side": side}
    run = {"inputs": {"file": facts_of(req.image)}, "dtype": req.dtype, "device": req.device, "weights": weights_fingerprint(req.weights_dir),
           "weights_spec": req.weights, "versions": _versions(), "backend": req.backend if side == "engine" else None,
           "fault": req.fault if side == "engine" else None}
    rec = Recorder(out, model=adapter.name, producer=producer, run=run, fmt=fmt, overwrite=overwrite)
    runner = adapter.runner(side)
    try:
        runner(req, rec)
    except BaseException:
        rec.abort()
        raise
    return rec.close()


def weights_fingerprint(wdir: Path | None) -> str:
    """sha256 over the checkpoint's JSON files (config, index) and each shard's name and size.

    Shards are only stat()ed, never opened: a gate that needs the vision tensors of one shard
    must not touch the other 47.
    """
    if wdir is None:
        return "none"
    h = hashlib.sha256()
    for p in sorted(Path(wdir).iterdir()):
        if p.suffix == ".json":
            h.update(p.name.encode() + p.read_bytes())
        elif p.suffix == ".safetensors":
            h.update(f"{p.name}:{p.stat().st_size}".encode())
    return h.hexdigest()


def _source_digest(adapter: ModelAdapter) -> str:
    """Digest of the oracle package and the adapter module: editing either invalidates the cache."""
    import oracle

    h = hashlib.sha256()
    root = Path(oracle.__file__).parent
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    here = Path(__file__).parent
    for p in sorted((here / "models").glob("*.py")) + sorted((here / "synthetic").glob("*.py")):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def oracle_key(adapter: ModelAdapter, req: RunRequest) -> str:
    img = hashlib.sha256(Path(req.image).read_bytes()).hexdigest() if req.image else "none"
    key = {"model": adapter.name, "src": _source_digest(adapter), "versions": _versions(),
           "weights": weights_fingerprint(req.weights_dir), "image": img, "dtype": req.dtype, "device": req.device,
           "prompt": req.prompt, "decode": req.decode, "options": req.options}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _status(msg: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K{msg}")
        sys.stderr.flush()


def check(model: str, *, json_path=None, tolerances=None, out=None, oracle_dtype=None, use_cache=True, **kw):
    from dataclasses import replace

    from .compare import compare_dumps
    from .synthetic import cache_root

    adapter, req = make_request(model, **kw)
    oreq = replace(req, fault=None, backend="torch", chunk=None, dtype=oracle_dtype or req.dtype)
    tmp = None
    if out is not None:
        base = out = dump_root(out)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="tensordiff-check-"))
        base = tmp
    try:
        odir = base / "oracle"
        cached = cache_root() / "oracle" / oracle_key(adapter, oreq) if use_cache else None
        if cached is not None and (cached / "manifest.json").is_file():
            _status(f"oracle: cached ({cached})")
            shutil.copytree(cached, odir)
        else:
            _status(f"running the oracle ({model}, {oreq.dtype}, {oreq.device})…")
            run_side(adapter, "oracle", oreq, odir)
            if cached is not None:
                tmpc = cached.with_name(cached.name + ".tmp")
                shutil.rmtree(tmpc, ignore_errors=True)
                shutil.copytree(odir, tmpc)
                try:
                    tmpc.rename(cached)
                except OSError:
                    shutil.rmtree(tmpc, ignore_errors=True)
        _status(f"running the engine ({req.backend}, {req.dtype}{', fault ' + req.fault if req.fault else ''})…")
        run_side(adapter, "engine", req, base / "engine")
        _status("comparing…")
        report = compare_dumps(odir, base / "engine", tolerances)
        _status("")
        return report
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
