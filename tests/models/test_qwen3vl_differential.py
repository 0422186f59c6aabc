"""The clean engine matches transformers on several pictures; every planted fault is named at its
boundary by the comparator (fp32, CPU, synthetic:tiny)."""
from __future__ import annotations

import dataclasses
import importlib.util
import fnmatch
import shutil

import pytest

from qwen3vl_images import make_images
from tensordiff.pipeline.adapter import RunRequest
from tensordiff.format.capture import Recorder
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.pipeline.faults import CHUNK
from tensordiff.models.qwen3_vl.adapter import ADAPTER
import tensordiff.models.qwen3_vl.faults as QF

PROMPT = "Look at <image> and then at <image>, please."


@pytest.fixture(scope="module")
def setup(module_tmp):
    root = module_tmp("qwen3vl")
    return root, make_images(root / "images"), ADAPTER.weights("synthetic:tiny")


def dump(root, side, req, tag):
    out = root / f"{tag}-{side}"
    if out.exists():
        return out
    rec = Recorder(out, model=ADAPTER.name, producer={"name": f"test-{side}", "side": side})
    ADAPTER.runner(side)(req, rec)
    return rec.close()


def request(images, wdir, name, **kw):
    return RunRequest(weights="synthetic:tiny", weights_dir=wdir, image=images[name], prompt=PROMPT, decode=2, **kw)


@pytest.mark.parametrize("name", ["astronaut", "chelsea", "coffee", "tiny", "wide", "tall", "rounding", "exif",
                                  "rgba", "palette"])
def test_clean_engine_matches_oracle(setup, name):
    root, images, wdir = setup
    req = request(images, wdir, name)
    a = dump(root, "oracle", req, name)
    b = dump(root, "engine", req, name)
    report = compare_dumps(a, b)
    assert report.verdict == "match", str(report)
    names = {bd.name for bd in report.boundaries}
    assert {"patches", "pos_embed", "rope", "block0", "final_norm", "aligner", "deepstack.0", "deepstack.1",
            "deepstack.2", "positions"} <= names


def test_grids_cover_the_cases(setup):
    import json

    root, images, wdir = setup
    grids = {}
    for name in ("tiny", "wide", "tall", "rounding", "exif"):
        dump(root, "engine", request(images, wdir, name), name)
        grids[name] = json.loads((root / f"{name}-engine" / "manifest.json").read_text())["run"]["inputs"]["grid"]
    assert grids["tiny"] == [4, 6]  # 21x27 grows to the 64x64 floor: ceil to 64x96
    assert grids["wide"][1] > 4 * grids["wide"][0]
    assert grids["tall"][0] > 4 * grids["tall"][1]
    assert grids["rounding"] == [4, 8]  # 80 -> 64 (down), 112 -> 128 (up)
    assert grids["exif"] == [12, 8]  # 120 wide x 200 high once the EXIF rotation is applied


@pytest.mark.parametrize("fault", [f.name for f in ADAPTER.faults])
def test_fault_is_named_at_its_boundary(setup, fault):
    root, images, wdir = setup
    # resize-ceil-sides needs a side where rounding and ceil to the 32-px factor differ (its
    # `needs`): chelsea's sides do not; "rounding" (112x80: 80 rounds to 64, ceils to 96) does
    name = "rounding" if fault == QF.RESIZE_CEIL_SIDES else "chelsea"
    req = request(images, wdir, name)
    a = dump(root, "oracle", req, name)
    # a fault at a chunk edge needs a chunked prefill (its `needs`): 7 rows cut chelsea's pad range
    chunk = 7 if CHUNK in ADAPTER.fault(fault).requirements else None
    b = dump(root, "engine", dataclasses.replace(req, fault=fault, chunk=chunk), f"{name}-{fault}")
    report = compare_dumps(a, b)
    expected = ADAPTER.fault(fault).boundary
    assert report.verdict == "diverged", str(report)
    assert any(fnmatch.fnmatchcase(e, expected) for e in report.earliest), (fault, report.earliest, str(report))
    # the fault is localised: no other root than its own boundary
    assert all(fnmatch.fnmatchcase(e, expected) for e in report.earliest), (fault, report.earliest)
    shutil.rmtree(b)  # read by no other test: 86 MB of prompt logits (a 151,936-token vocabulary)


def test_clean_engine_matches_oracle_in_bfloat16(setup):
    root, images, wdir = setup
    req = dataclasses.replace(request(images, wdir, "coffee"), dtype="bfloat16")
    report = compare_dumps(dump(root, "oracle", req, "coffee-bf16"), dump(root, "engine", req, "coffee-bf16"))
    assert report.verdict == "match", str(report)
    # the position table is weighted in fp32 and cast once, as transformers 5.17 does: bit-exact
    pe = report.boundary("pos_embed").tensors[0]
    assert pe.metrics["max_abs"] == 0, pe.metrics


def test_processor_mismatch_is_named_at_patches(setup):
    """The fast (torchvision) and slow (PIL) processors differ by a few levels: a real case."""
    root, images, wdir = setup
    req = request(images, wdir, "chelsea")
    fast = dataclasses.replace(req, options={"processor": "torchvision"})
    report = compare_dumps(dump(root, "oracle", req, "chelsea"), dump(root, "engine", fast, "chelsea-tv"))
    assert report.verdict == "diverged"
    assert report.earliest == ["patches"], report.earliest


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                    reason="torchvision is not installed (the GPU machine has it)")
@pytest.mark.parametrize("name", ["chelsea", "tiny", "wide"])
def test_fast_processor_matches_on_both_sides(setup, name):
    root, images, wdir = setup
    req = dataclasses.replace(request(images, wdir, name), options={"processor": "torchvision"})
    report = compare_dumps(dump(root, "oracle", req, f"{name}-tv"), dump(root, "engine", req, f"{name}-tv"))
    assert report.verdict == "match", str(report)
