"""The gate on the real model paths (tiny synthetic weights in the official layout): the clean
engine passes, every engine fault fails the gate at its boundary, and local error names the
same stage; the example gate files in `gates/` load and run."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tensordiff.pipeline import registry
from tensordiff.commands.gate import load_gate, run_gate

GATES = Path(__file__).resolve().parents[2] / "gates"


def _gate(model: str):
    path = GATES / f"{model}.toml"
    if model not in registry.names():
        pytest.skip(f"{model} adapter not installed")
    return load_gate(path)


def _faults(model: str) -> list[str]:
    try:
        return [f.name for f in registry.adapter(model).faults]
    except Exception:  # noqa: BLE001 - adapter not importable yet: the tests below skip
        return []


@pytest.mark.parametrize("model", ["deepseek-v4.1-flash", "qwen3-vl"])
def test_example_gate_passes_on_the_clean_engine(model, tmp_path):
    cfg = _gate(model)
    res = run_gate(cfg, progress=False, echo=lambda s: None, html=True)
    assert res.passed, [c.summary_line() for c in res.cases]
    for c in res.cases:
        assert c.local is not None and c.local.available
        assert c.local.origin is None, c.local.summary()
        assert c.views, "image boundaries get heatmaps"
    from tensordiff.reports.junit import write_junit

    write_junit(res.cases, tmp_path / "g.xml")
    root = ET.parse(tmp_path / "g.xml").getroot()
    assert root.get("failures") == "0" and int(root.get("tests")) >= 5


@pytest.fixture(scope="module")
def small_picture(module_tmp) -> Path:
    """600x386: a 32x49 patch grid (not a multiple of 3 wide: the aligner pad matters) whose
    contain/pad rounding differs between round and ceil, at 40% of the default's patches."""
    import numpy as np
    from PIL import Image

    h, w = 386, 600
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rng = np.random.default_rng(3)
    img = np.stack([x / w, y / h, (x + y) / (w + h)], -1) * 220 + rng.normal(0, 20, (h, w, 3))
    path = module_tmp("pictures") / "small.png"
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path)
    return path


@pytest.mark.parametrize("fault", _faults("deepseek-v4.1-flash"))
def test_every_deepseek_fault_fails_the_gate_at_its_boundary(fault, small_picture):
    from tensordiff.pipeline.faults import SEVERAL_IMAGES
    from tensordiff.commands.gate import from_mapping

    _gate("deepseek-v4.1-flash")
    want = registry.adapter("deepseek-v4.1-flash").fault(fault).boundary
    vision = want in ("plan", "patches", "rope", "block0", "final_norm", "aligner")
    model = {"name": "deepseek-v4.1-flash", "images": [str(small_picture)]}
    if not vision:  # a language fault needs the backbone to run: a prompt, and chunks that cut the span
        model.update(prompts=["A picture: <image> What does it show?"], chunk=16)
    if want.startswith("logits.step."):  # a decode fault: enough steps to reach the one it names
        # in the fp32 semantic numerics no near-tie flips before it, so end to end names it too
        # (under the official ones it is a flip's cascade end to end and local error alone names
        # it: tests/models/test_deepseek_language_ties.py)
        model.update(decode=int(want.rsplit(".", 1)[1]), options={"language_numerics": "semantic"})
    if any("synthetic:tiny-fp8" in n.text for n in registry.adapter("deepseek-v4.1-flash").fault(fault).needs):
        model["weights"] = "synthetic:tiny-fp8"  # the checkpoint-reading faults need scales to misread
    if SEVERAL_IMAGES in registry.adapter("deepseek-v4.1-flash").fault(fault).needs:  # a later span to misplace
        # (the example gate's 300x200 picture: any second image has a span to misplace, and the
        # embedded 1024x701 one cost this case more vision than all the rest of it)
        model.update(images=[[str(small_picture), str(GATES / "images" / "deepseek-small-300x200.png")]],
                     prompts=["A <image> and <image>."])
    res = run_gate(from_mapping({"model": [model]}), fault=fault, progress=False, echo=lambda s: None)
    assert res.exit_code == 1
    for c in res.cases:
        assert c.report.earliest == [want], c.summary_line()
        assert c.local.available and c.local.origin == want, c.local.summary()


@pytest.mark.parametrize("fault", _faults("qwen3-vl"))
def test_every_qwen_fault_fails_the_gate(fault):
    import fnmatch

    cfg = _gate("qwen3-vl")
    res = run_gate(cfg, fault=fault, progress=False, echo=lambda s: None)
    assert res.exit_code == 1
    want = registry.adapter("qwen3-vl").fault(fault).boundary
    # the example gate's images cover every geometry rule, so each fault shows on at least one;
    # a fault that needs a geometry an image lacks (see its `needs`) leaves that case clean
    caught = [c for c in res.cases if not c.passed]
    assert caught, [c.summary_line() for c in res.cases]
    for c in caught:
        assert any(fnmatch.fnmatchcase(e, want) for e in c.report.earliest), c.summary_line()
        assert c.local.available and c.local.origin is not None, c.local.summary()
        assert fnmatch.fnmatchcase(c.local.origin, want), c.local.summary()


def _checkpoint_copy(tmp_path) -> Path:
    import shutil

    src = registry.adapter("deepseek-v4.1-flash").weights("synthetic:tiny")
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _shards_holding(ckpt: Path, prefixes) -> set[str]:
    import json

    wmap = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    return {v for k, v in wmap.items() if k.split(".")[0] in prefixes}


def test_gate_reads_only_the_shards_the_vision_path_needs(tmp_path, small_picture):
    _gate("deepseek-v4.1-flash")
    from tensordiff.commands.gate import from_mapping

    ckpt = _checkpoint_copy(tmp_path)
    vision = _shards_holding(ckpt, {"vision", "aligner", "image_start", "image_end", "image_newline"})
    others = {p.name for p in ckpt.glob("*.safetensors")} - vision
    assert others, "the synthetic checkpoint should have a language-only shard"
    for name in others:  # a shard the vision path must never open: make it unreadable garbage
        (ckpt / name).write_bytes(b"\xff" * 64)
    cfg = from_mapping({"model": [{"name": "deepseek-v4.1-flash", "weights": str(ckpt),
                                   "images": [str(small_picture)]}]})
    res = run_gate(cfg, use_cache=False, progress=False, echo=lambda s: None)
    assert res.passed, res.cases[0].summary_line()


def test_partial_checkpoint_is_one_error_naming_the_missing_tensors(tmp_path, capsys):
    import json

    _gate("deepseek-v4.1-flash")
    ckpt = _checkpoint_copy(tmp_path)
    index = ckpt / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    del data["weight_map"]["vision.norm.weight"]
    del data["weight_map"]["aligner.w2.bias"]
    index.write_text(json.dumps(data))
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[[model]]\nname = "deepseek-v4.1-flash"\nweights = "{ckpt}"\n')
    from tensordiff.commands.cli import main

    with pytest.raises(SystemExit) as e:
        main(["gate", str(cfg), "--no-cache"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "vision.norm.weight" in err and "aligner.w2.bias" in err and err.count("\n") == 1
