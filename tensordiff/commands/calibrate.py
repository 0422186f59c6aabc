"""`tensordiff calibrate`: measure each boundary's noise floor and write tolerances from it.

The floor is how far the ORACLE moves from itself under a change that is not a bug: another
precision (fp32 -> bf16) or another attention kernel (SDPA math -> flash / efficient). Measured
on the gate's images, per boundary and per comparison unit (the narrower dtype of the two sides,
as the comparator judges), a floor becomes a tolerance that is a stated multiple of it:

    atol = multiple × floor (floor = max |Δ| seen, multiple 10 by default),  rtol = 0,
    no element allowed outside,  min_cosine = 1 − multiple × (1 − worst cosine seen) where that
    is looser than the dtype default (else the default)

written as `[tolerances.boundaries.<b>.<dtype>]` with `floor` set, so the report prints every
error also as "× floor". A boundary whose floor cannot be measured (identical in every variant,
missing, or the variant could not run) keeps the dtype default, and the file says so.

Variants (`--variant KEY=VALUE`, repeatable): `dtype=bfloat16|float32` changes the oracle's
dtype; `sdpa=math|flash|efficient|cudnn` runs the oracle under `torch.nn.attention.sdpa_kernel`
with only that kernel allowed (and records it in `RunRequest.options["sdpa"]`, so the oracle
cache keeps them apart); any other key is one of the model's run options that the oracle reads
(`tensordiff options MODEL`; e.g. `attention=eager` for the Qwen3-VL oracle, `processor=pil`),
typed through that table; an unknown or engine-only key is refused.

The engine's profile is measured under the gate case's engine options (`[[model]] options`,
backend, device), and the file records them as `[calibration.engine]`: a profile measured on the
eager engine need not hold for the compiled one (fused segments, CUDA graphs), so a gate whose
numeric pass would judge an engine run under other options by this profile refuses to run
(`check_engine`; on other weights too: a profile does not transfer across weight seeds).
`--repeats N` runs the clean engine N times per image; each profile entry then records
`run_spread` (run-to-run) apart from `image_spread`, and the band covers both.
"""
from __future__ import annotations

import math
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from tensordiff.errors import BadInput
from tensordiff.pipeline.options import oracle_option
from tensordiff.judge.floor import Profile
from tensordiff.judge.metrics import FloatResult
from tensordiff.pipeline.calibration import Calibration, Floor, engine_record
from tensordiff.pipeline import registry
from tensordiff.pipeline.case import oracle_dump, oracle_request
from tensordiff.pipeline.compare import compare_dumps, three_way
from tensordiff.pipeline.runs import make_request, run_side

DEFAULT_VARIANTS = ("dtype=bfloat16",)
# The engine differs from the oracle in every summation order, a variant in only one change (a
# dtype, an attention kernel): measured here, the fp32 engine sits at up to ~5x the eager-vs-SDPA
# floor, a bf16 engine at ~1-2x the fp32-vs-bf16 floor; planted bugs at 10^3-10^6x.
DEFAULT_MULTIPLE = 10.0
SDPA = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}


@dataclass(frozen=True)
class Variant:
    key: str
    value: str

    @property
    def label(self) -> str:
        return f"{self.key}={self.value}"


def parse_variant(s: str) -> Variant:
    if "=" not in s:
        raise BadInput(f"--variant {s!r}: expected KEY=VALUE (dtype=bfloat16, sdpa=math, attention=eager, ...)")
    k, v = (x.strip() for x in s.split("=", 1))
    if not k or not v:
        raise BadInput(f"--variant {s!r}: expected KEY=VALUE")
    if k == "dtype" and v not in ("float32", "bfloat16"):
        raise BadInput(f"--variant {s!r}: dtype must be float32 or bfloat16")
    if k == "sdpa" and v not in SDPA:
        raise BadInput(f"--variant {s!r}: sdpa must be one of {', '.join(SDPA)}")
    return Variant(k, v)


@contextmanager
def _sdpa_only(name: str | None):
    if name is None:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, SDPA[name], None)
    if backend is None:
        raise BadInput(f"this torch has no SDPA backend {name!r}")
    with sdpa_kernel([backend]):
        yield


def variant_request(req, v: Variant, adapter=None):
    if v.key == "dtype":
        return replace(req, dtype=v.value)
    if v.key == "sdpa" or adapter is None:
        return replace(req, options={**req.options, v.key: v.value})
    name, value = oracle_option(adapter, v.key, v.value, f"--variant {v.label}")  # typed by the model's table
    return replace(req, options={**req.options, name: value})


def calibrate(model: str, images, *, weights: str = "synthetic:tiny", device: str = "cpu",
              dtype: str = "float32", variants=DEFAULT_VARIANTS, multiple: float = DEFAULT_MULTIPLE,
              use_cache: bool = True, echo=None, engine_profile: bool = True, backend: str = "torch",
              options=(), repeats: int = 1) -> Calibration:
    """The oracle at `dtype` (the reference) against itself under each variant, on every image;
    with `engine_profile`, the clean engine in the low precision of the first dtype variant too,
    three-way (tensordiff.judge.floor), for the numeric pass's multipliers and profile: `repeats` runs
    per image under the engine `options` (NAME=VALUE, as a gate's `[[model]] options`)."""
    if not (isinstance(multiple, (int, float)) and multiple > 0 and math.isfinite(multiple)):
        raise BadInput(f"--multiple must be a positive number, not {multiple!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise BadInput(f"--repeats must be a positive integer, not {repeats!r}")
    vs = [v if isinstance(v, Variant) else parse_variant(v) for v in variants]
    if not vs:
        raise BadInput("calibrate needs at least one --variant")
    for v in vs:
        if v.key == "dtype" and v.value == dtype:
            raise BadInput(f"--variant {v.label} is the reference itself (reference dtype {dtype}); pick the other dtype")
    echo = echo or (lambda s: None)
    adapter = registry.adapter(model)
    for v in vs:  # a runner option is checked against the model's table before anything runs
        if v.key not in ("dtype", "sdpa"):
            oracle_option(adapter, v.key, v.value, f"--variant {v.label}")
    cal = Calibration(model, weights, f"oracle {dtype}, default attention", [v.label for v in vs], float(multiple),
                      [str(i) for i in images], engine=engine_record(adapter, backend, device, options),
                      repeats=repeats)
    order: dict[str, None] = {}
    t0 = time.perf_counter()
    low = next((v for v in vs if v.key == "dtype" and v.value != "float32"), None)
    if engine_profile and low is not None and dtype == "float32":
        cal.profile, cal.profile_dtype = Profile(), low.value
    elif engine_profile:
        cal.profile_note = ("the reference must be float32 and a variant a lower dtype "
                            f"(reference {dtype}, variants {', '.join(v.label for v in vs)})")
    else:
        cal.profile_note = "not asked for"
    with tempfile.TemporaryDirectory(prefix="tensordiff-calibrate-") as tmp:
        for i, img in enumerate(images):
            _, ereq = make_request(model, image=img, weights=weights, device=device, dtype=dtype, backend=backend,
                                   adapter=adapter, extra=tuple(options))
            req = oracle_request(ereq)
            ref = oracle_dump(adapter, req, Path(tmp) / f"ref-{i}", use_cache).path
            for j, v in enumerate(vs):
                if v.label in cal.failed:
                    continue
                vreq = variant_request(req, v, adapter)
                try:
                    vdir = oracle_dump(adapter, vreq, Path(tmp) / f"var-{i}-{j}", use_cache,
                                       wrap=(lambda v=v: _sdpa_only(v.value)) if v.key == "sdpa" else None).path
                except BadInput:
                    raise
                except RuntimeError as e:  # e.g. no kernel for this backend on this device/shape
                    cal.failed[v.label] = str(e).splitlines()[0][:300]
                    echo(f"variant {v.label} could not run: {cal.failed[v.label]}")
                    continue
                rep = compare_dumps(ref, vdir)
                for b in rep.boundaries:
                    order.setdefault(b.name, None)
                    for t in b.tensors:
                        unit = t.dtype.get("unit")
                        m = t.metrics
                        if unit is None or not isinstance(m, FloatResult):
                            continue
                        f = cal.floors.setdefault((b.name, unit), Floor(b.name, unit))
                        f.samples += 1
                        if not math.isfinite(m.max_abs) or m.max_abs > f.max_abs:
                            f.max_abs, f.variant = (m.max_abs if math.isfinite(m.max_abs) else math.inf), v.label
                        if math.isfinite(m.cosine):
                            f.cosine = min(f.cosine, m.cosine)
                echo(f"{Path(img).name}: {v.label}: measured {len(rep.boundaries)} boundaries")
                if cal.profile is not None and v is low:
                    for r in range(repeats):
                        edir = run_side(adapter, "engine", replace(ereq, dtype=low.value),
                                        Path(tmp) / f"engine-{i}-{r}")
                        num = three_way(ref, vdir, edir)
                        cal.profile.add(num, Path(img).name, run=r)
                        shutil.rmtree(edir, ignore_errors=True)  # judged: N repeats need no N dumps on disk
                        echo(f"{Path(img).name}: clean {low.value} engine"
                             + (f" (run {r + 1} of {repeats})" if repeats > 1 else "") + f", numeric pass {num.verdict}")
    cal.boundaries = list(order)
    cal.timings["total"] = time.perf_counter() - t0
    if not cal.boundaries and cal.failed:
        raise BadInput("no variant could run: " + "; ".join(f"{k}: {v}" for k, v in cal.failed.items()))
    return cal


