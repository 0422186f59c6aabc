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
