"""Every way a Qwen3-VL checkpoint goes wrong is one line and exit status 2, on both sides."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from bad_checkpoints import CASES
from tensordiff.commands.cli import main
from tensordiff.models.qwen3_vl.adapter import ADAPTER

VICTIM = "model.visual.blocks.1.attn.qkv.weight"


@pytest.fixture(scope="module")
def setup(module_tmp):
    root = module_tmp("qwen-ckpt")
    img = root / "pic.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)).save(img)
    return root, img, ADAPTER.weights("synthetic:tiny")


def run(args, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    _, err = capsys.readouterr()
    return e.value.code, err


def test_the_good_checkpoint_runs(setup, capsys):
    root, img, good = setup
    for side in ("oracle", "engine"):
        code, err = run(["dump", "qwen3-vl", "--side", side, "--weights", good, "--image", img,
                         "--out", root / f"good-{side}"], capsys)
        assert code == 0, err


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("side", ["oracle", "engine"])
def test_bad_checkpoint_exits_2_in_one_line(setup, case, side, capsys):
    root, img, good = setup
    bad = root / f"{case}-{side}"
    mention = CASES[case](good, bad, VICTIM)
    out = root / f"out-{case}-{side}"
    code, err = run(["dump", "qwen3-vl", "--side", side, "--weights", bad, "--image", img, "--out", out], capsys)
    assert code == 2, err
    assert err.startswith("tensordiff: error:") and len(err.strip().splitlines()) == 1, err
    assert mention in err, err
    assert not out.exists()


@pytest.mark.parametrize("side", ["oracle", "engine"])
def test_one_pixel_sides(setup, side, capsys):
    """1-px sides pass the input check; what the official processor then does decides: 1x1 and
    3x1 are scaled up to its budget, 1001x1 is over its aspect-ratio limit (one line, exit 2)."""
    root, _, good = setup
    for w, h, want in [(1, 1, 0), (3, 1, 0), (1001, 1, 2)]:
        img = root / f"px-{w}x{h}.png"
        Image.fromarray(np.random.default_rng(2).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(img)
        out = root / f"px-{w}x{h}-{side}"
        code, err = run(["dump", "qwen3-vl", "--side", side, "--weights", good, "--image", img, "--out", out], capsys)
        assert code == want, (w, h, err)
        if want:
            assert "aspect ratio" in err and len(err.strip().splitlines()) == 1, err


def test_the_processor_default_is_pil_whether_or_not_torchvision_imports(monkeypatch, tmp_path):
    """The help's default is the run's: `pil` with or without torchvision (transformers' own pick
    follows the environment; ours does not), shown by `tensordiff options`, the same oracle cache
    key either way, and recorded as the processor that ran in both dumps."""
    import importlib.machinery
    import importlib.util
    import json

    from oracle.qwen3_vl import processor as PR
    from tensordiff.pipeline import oracle_cache, registry
    from tensordiff.models.qwen3_vl.options import OPTIONS
    from tensordiff.pipeline.case import CaseSpec, check
    from tensordiff.pipeline.runs import make_request

    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))
    assert OPTIONS.get("processor").default_text == "pil"
    adapter = registry.adapter("qwen3-vl")
    _, without = make_request("qwen3-vl")
    # transformers decides what it has when first imported: that stays the real answer
    import transformers.image_utils  # noqa: F401
    import transformers.models.qwen2_vl.image_processing_pil_qwen2_vl  # noqa: F401

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        importlib.machinery.ModuleSpec("torchvision", None) if name == "torchvision" else real(name, *a)))
    assert PR.available() == "torchvision"  # as if it were installed
    _, with_tv = make_request("qwen3-vl")
    assert with_tv.options["processor"] == without.options["processor"] == "pil"
    assert oracle_cache.key(adapter, with_tv) == oracle_cache.key(adapter, without)
    proc, ran = PR.build(with_tv.weights_dir, OPTIONS.resolve(with_tv.options)["processor"])
    assert ran == "pil" and type(proc).__name__ == "Qwen2VLImageProcessorPil"
    monkeypatch.setattr(importlib.util, "find_spec", real)
    case = check(CaseSpec("qwen3-vl"), out=tmp_path / "run")
    assert case.report.verdict == "match"
    for side in ("oracle", "engine"):
        run = json.loads((tmp_path / "run" / side / "manifest.json").read_text())["run"]
        assert run["options"]["processor"] == "pil" and run["inputs"]["processor"] == "pil", side
