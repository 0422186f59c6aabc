"""Image checks before any model runs, and what a dump records about the picture file."""
import json
from pathlib import Path

import pytest
from PIL import Image

from tensordiff.cli import main
from tensordiff.errors import BadInput
from tensordiff.inputs import check_image, notes

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "tensordiff" / "data" / "default.png"


@pytest.fixture
def animated(tmp_path):
    im = Image.open(DEFAULT).convert("RGB").resize((96, 64))
    p = tmp_path / "anim.gif"
    im.save(p, save_all=True, append_images=[im.rotate(90), im.rotate(180)], duration=100)
    return p


@pytest.fixture
def rotated(tmp_path):
    im = Image.open(DEFAULT).convert("RGB").resize((96, 64))
    ex = Image.Exif()
    ex[0x0112] = 6
    p = tmp_path / "rot.jpg"
    im.save(p, exif=ex)
    return p


@pytest.mark.parametrize("url", ["https://example.com/cat.png", "http://x/y.jpg", "s3://bucket/k.png"])
def test_a_url_is_not_fetched(url):
    with pytest.raises(BadInput, match="URLs are not fetched; download the image first"):
        check_image(Path(url))


def test_frames_and_orientation_are_recorded(animated, rotated):
    a, r = check_image(animated), check_image(rotated)
    assert (a["frames"], a["exif_orientation"]) == (3, None)
    assert (r["frames"], r["exif_orientation"]) == (1, 6)
    plain = check_image(DEFAULT)
    assert (plain["frames"], plain["exif_orientation"]) == (1, None)
    assert notes({"inputs": {"image": {"frames": 1, "exif_orientation": None}}}) == []


def test_the_first_frame_only_is_said_in_the_dump_and_the_report(animated, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", "deepseek-v4.1-flash", "--image", str(animated), "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "note: the image has 3 frames (animated GIF / multi-frame TIFF); only the first was used" in out
    for side in ("oracle", "engine"):
        run = json.loads((tmp_path / "o" / side / "manifest.json").read_text())["run"]
        image = run["inputs"]["image"]  # the one image description (provenance.describe_image)
        assert {k: image[k] for k in ("frames", "frame_used", "exif_orientation")} == {
            "frames": 3, "frame_used": 0, "exif_orientation": None}
        assert "grid" in run["inputs"]  # the producer's own inputs are merged in, not replacing the file facts


def test_the_orientation_note(rotated):
    facts = check_image(rotated)
    (n,) = notes({"inputs": {"image": {k: facts[k] for k in ("frames", "frame_used", "exif_orientation")}}})
    assert "EXIF orientation 6 (rotated 90° clockwise)" in n and "DeepSeek V4.1 Flash ignores it" in n
