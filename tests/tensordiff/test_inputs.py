"""Image checks before any model runs, and what a dump records about the picture file."""
import json
import os
from pathlib import Path

import pytest
from PIL import Image

from tensordiff.commands.cli import main
from tensordiff.errors import BadInput
from tensordiff.pipeline.inputs import check_image, notes

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


def test_an_image_is_decoded_once_per_content(tmp_path, monkeypatch):
    import PIL.Image

    p = tmp_path / "a.png"
    p.write_bytes(DEFAULT.read_bytes())
    opened = []
    real = PIL.Image.open
    monkeypatch.setattr(PIL.Image, "open", lambda *a, **k: opened.append(a) or real(*a, **k))
    first = check_image(p)
    again = check_image(p)
    assert again == first and len(opened) == 1
    again["width"] = -1  # a caller's copy: the remembered facts stay as they were
    assert check_image(p)["width"] == first["width"]


def test_a_file_rewritten_in_place_is_checked_again(tmp_path):
    # the fault that proves the memo is keyed by content: the same size and timestamps, other
    # bytes (a rewrite inside one timestamp tick) must be decoded again, and this one is corrupt
    p = tmp_path / "a.png"
    data = DEFAULT.read_bytes()
    p.write_bytes(data)
    check_image(p)
    st = p.stat()
    p.write_bytes(data[: len(data) // 2] + bytes(len(data) - len(data) // 2))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(BadInput, match="corrupt or truncated"):
        check_image(p)
