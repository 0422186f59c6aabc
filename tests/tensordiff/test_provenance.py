"""Provenance: one weights fingerprint (the content of every file read), one versions(), one
image description, written once per side by the core; runners add model facts, merged deeply."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from cli_runner import run_cli
from tensordiff.models.deepseek_v41_flash.synthetic import resolve
from tensordiff.pipeline import oracle_cache, provenance
from tensordiff.format.capture import MemoryRecorder, Recorder
from tensordiff.format.dump import open_dump
from tensordiff.pipeline.inputs import default_image_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))


def _checkpoint(d: Path) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"dim": 4}))
    save_file({"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}, str(d / "model.safetensors"))
    return d


def _scale_in_place(shard: Path, name: str, by: float) -> None:
    t = load_file(str(shard))
    t[name] = t[name] * by
    save_file(t, str(shard))  # same name and size: only the bytes (and the mtime) change


def test_the_fingerprint_follows_the_bytes_of_every_file(tmp_path):
    ck = _checkpoint(tmp_path / "ck")
    before = provenance.weights_fingerprint(ck)
    assert before.startswith("sha256:") and provenance.weights_fingerprint(ck) == before
    size = (ck / "model.safetensors").stat().st_size
    _scale_in_place(ck / "model.safetensors", "w", 1.5)
    assert (ck / "model.safetensors").stat().st_size == size  # a name-and-size fingerprint was blind to this
    assert provenance.weights_fingerprint(ck) != before
    (ck / "config.json").write_text(json.dumps({"dim": 5}))
    assert provenance.weights_fingerprint(ck) not in (before,)
    assert provenance.weights_fingerprint(None) == "none"


def test_only_the_shards_a_run_reads_are_hashed(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text("{}")
    save_file({"vision.w": torch.ones(4)}, str(ck / "a.safetensors"))
    save_file({"layers.0.w": torch.ones(4)}, str(ck / "b.safetensors"))
    (ck / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"vision.w": "a.safetensors", "layers.0.w": "b.safetensors"}}))
    assert [p.name for p in provenance.weight_files(ck, ("vision.",))] == [
        "a.safetensors", "config.json", "model.safetensors.index.json"]
    vision, everything = provenance.weights_fingerprint(ck, ("vision.",)), provenance.weights_fingerprint(ck)
    _scale_in_place(ck / "b.safetensors", "layers.0.w", 1.5)  # a tensor the vision run never reads
    assert provenance.weights_fingerprint(ck, ("vision.",)) == vision
    assert provenance.weights_fingerprint(ck) != everything
    _scale_in_place(ck / "a.safetensors", "vision.w", 1.5)  # one it reads
    assert provenance.weights_fingerprint(ck, ("vision.",)) != vision


def _later(monkeypatch, seconds: float) -> None:
    """The hashing clock `seconds` ahead: the files written just now look that old to it."""
    import time

    real = time.time_ns
    monkeypatch.setattr(provenance.time, "time_ns", lambda: real() + int(seconds * 1e9))


def _memo(tmp_path) -> Path:
    (memo,) = [p for p in (tmp_path / "cache" / "filehash").iterdir() if p.suffix == ".json"]
    return memo


def test_a_second_fingerprint_costs_a_stat(tmp_path, monkeypatch):
    _later(monkeypatch, 10)
    ck = _checkpoint(tmp_path / "ck")
    shard = ck / "model.safetensors"
    real = provenance.file_sha256(shard)
    memo = _memo(tmp_path)
    rec = json.loads(memo.read_text())
    assert rec["sha256"] == real and rec["stamp"] == list(provenance.stat_key(shard.stat()))
    rec["sha256"] = "remembered"  # a planted memo: used as long as the file's stat key holds
    memo.write_text(json.dumps(rec))
    assert provenance.file_sha256(shard) == "remembered"
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched: hashed again
    assert provenance.file_sha256(shard) == real


def _rewrite_keeping_times(shard: Path, name: str) -> None:
    """An in-place edit that keeps the file's size and inode and sets its times back (what
    `cp -p`, `rsync -t` and many tools leave): only its ctime tells."""
    import time

    st = shard.stat()
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    start = 8 + n + json.loads(data[8:8 + n])[name]["data_offsets"][0]
    time.sleep(0.05)  # past the clock tick the file was last changed in
    with open(shard, "r+b") as f:  # the same file: its first value's top byte flips sign
        f.seek(start + 1)
        f.write(bytes([data[start + 1] ^ 0x80]))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = shard.stat()
    assert (after.st_size, after.st_ino, after.st_mtime_ns) == (st.st_size, st.st_ino, st.st_mtime_ns)


def test_an_in_place_rewrite_with_its_times_restored_gets_a_new_digest(tmp_path, monkeypatch):
    _later(monkeypatch, 10)
    ck = _checkpoint(tmp_path / "ck")
    before = provenance.weights_fingerprint(ck)
    assert len(list((tmp_path / "cache" / "filehash").glob("*.json"))) == 2  # remembered: the next call is a stat
    _rewrite_keeping_times(ck / "model.safetensors", "w")
    assert provenance.weights_fingerprint(ck) != before


def test_a_file_changed_within_the_racy_window_is_not_remembered(tmp_path):
    ck = _checkpoint(tmp_path / "ck")  # written just now: a write in the same tick could hide
    provenance.file_sha256(ck / "model.safetensors")
    assert not (tmp_path / "cache" / "filehash").exists() or not list((tmp_path / "cache" / "filehash").glob("*.json"))


def test_the_oracle_cache_keys_its_entries_by_the_same_stat_key(tmp_path):
    d = tmp_path / "entry"
    d.mkdir()
    (d / "a").write_text("x")
    assert oracle_cache._signature(d) == (("a", provenance.stat_key((d / "a").stat())),)


def test_check_no_longer_blames_a_correct_engine_after_an_in_place_rewrite(tmp_path, monkeypatch, capsys):
    """A vision weight rewritten in place with its times restored: the oracle cache key follows
    the new bytes, so the oracle runs again and the (correct) engine matches it."""
    src = resolve("synthetic:tiny")
    _later(monkeypatch, 10)
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    args = ["check", "deepseek-v4.1-flash", "--weights", ck, "--json", tmp_path / "r.json"]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    index = json.loads((ck / "model.safetensors.index.json").read_text())["weight_map"]
    name = "vision.blocks.0.mlp.w1.weight"
    _rewrite_keeping_times(ck / index[name], name)
    code, _, err = run_cli(args, capsys)
    report = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and report["verdict"] == "match", report["earliest"]


def test_versions_and_the_image_description():
    v = provenance.versions()
    assert {"python", "torch", "numpy", "tensordiff"} <= set(v)
    v["torch"] = "0"  # read once per process, handed out as copies: a caller's edit stays its own
    assert provenance.versions()["torch"] != "0"
    d = provenance.describe_image(default_image_path())
    assert d["size"] == [d["width"], d["height"]] == [1024, 701]
    assert len(d["sha256"]) == 64 and d["bytes"] == default_image_path().stat().st_size


def test_sources_are_found_without_importing_them(tmp_path):
    code = ("import sys; from tensordiff.pipeline.provenance import source_files\n"
            "files = source_files('oracle.deepseek_v41_flash')\n"
            "assert any(rel == 'vision.py' for rel, _ in files), files\n"
            "assert 'oracle' not in sys.modules and 'torch' not in sys.modules")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    mine = tmp_path / "my_oracle.py"
    mine.write_text("x = 1\n")
    before = provenance.source_digest((str(mine),))
    mine.write_text("x = 2\n")  # a third-party adapter's oracle edited
    assert provenance.source_digest((str(mine),)) != before
    with pytest.raises(Exception, match="no module"):
        provenance.source_files("no_such_package_xyz.sub")


def test_update_run_merges_deeply(tmp_path):
    rec = Recorder(tmp_path / "d", model="toy", run={"inputs": {"image": {"sha256": "abc"}},
                                                     "versions": {"torch": "2", "numpy": "1"}})
    rec.update_run(inputs={"grid": [2, 3]}, versions={"pillow": "11"}, attn="sdpa")
    rec.record("x", torch.ones(1))
    run = open_dump(rec.close()).run
    assert run["inputs"] == {"image": {"sha256": "abc"}, "grid": [2, 3]}
    assert run["versions"] == {"torch": "2", "numpy": "1", "pillow": "11"} and run["attn"] == "sdpa"
    mem = MemoryRecorder()
    mem.update_run(inputs={"a": 1})
    mem.update_run(inputs={"b": 2})
    assert mem.run == {"inputs": {"a": 1, "b": 2}}


@pytest.mark.parametrize("model", ["deepseek-v4.1-flash", "qwen3-vl"])
def test_both_sides_carry_one_provenance(tmp_path, model):
    from tensordiff.pipeline.runs import make_request, run_side

    adapter, req = make_request(model)
    runs = [open_dump(run_side(adapter, side, req, tmp_path / side)).run for side in ("oracle", "engine")]
    want = provenance.versions()
    for run in runs:
        assert run["versions"] == want  # a runner once replaced it with {torch, pillow}
        assert run["weights"] == provenance.run_weights(adapter, req)
        assert run["inputs"]["image"] == provenance.describe_image(req.image)
        assert run["inputs"]["grid"]  # the runner's own facts, merged in
