"""Checkpoint directories are checked before either side loads them; the cache stays readable."""
import json
import shutil
import stat

import pytest

from tensordiff.commands.cli import main
from tensordiff.models.deepseek_v41_flash.synthetic import INDEX, resolve


def run(args, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.fixture
def ckpt(tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(resolve("synthetic:tiny"), dst)
    return dst


def test_synthetic_weights_are_world_readable(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "fresh-cache"))
    old = os.umask(0o022)
    try:
        d = resolve("synthetic:tiny")  # written now, into the fresh cache
    finally:
        os.umask(old)
    assert stat.S_IMODE(d.stat().st_mode) & 0o055 == 0o055
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o044 == 0o044 for p in d.iterdir())


def test_a_truncated_shard_is_one_line(ckpt, capsys):
    for shard in sorted(ckpt.glob("*.safetensors")):
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) // 2])
    code, _, err = run(["check", "deepseek-v4.1-flash", "--weights", ckpt], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "truncated" in err and ".safetensors" in err


def test_an_index_pointing_to_a_pickle_shard(ckpt, capsys):
    idx = json.loads((ckpt / INDEX).read_text())
    idx["weight_map"] = {k: "pytorch_model.bin" for k in idx["weight_map"]}
    (ckpt / INDEX).write_text(json.dumps(idx))
    (ckpt / "pytorch_model.bin").write_bytes(b"\x80\x04not a real pickle")
    code, _, err = run(["check", "deepseek-v4.1-flash", "--weights", ckpt], capsys)
    assert code == 2 and "never unpickles" in err and "pytorch_model.bin" in err


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "missing.safetensors"])
def test_an_index_pointing_outside_or_to_nothing(ckpt, capsys, shard):
    idx = json.loads((ckpt / INDEX).read_text())
    idx["weight_map"] = {k: shard for k in idx["weight_map"]}
    (ckpt / INDEX).write_text(json.dumps(idx))
    code, _, err = run(["check", "deepseek-v4.1-flash", "--weights", ckpt], capsys)
    assert code == 2 and ("outside the checkpoint" in err or "missing" in err or "not a .safetensors" in err)
