"""The oracle cache: keyed by the weights' content and the adapter's declared sources, verified on
reuse, staged under unique names, shared safely by two processes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tensordiff.pipeline import oracle_cache, registry
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.pipeline.case import CaseSpec, check, oracle_dump
from tensordiff.pipeline.runs import make_request

import test_gate_toy as toy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORDIFF_CACHE", str(tmp_path / "cache"))
    toy.install(monkeypatch)


def _entries() -> list[str]:
    return sorted(p.name for p in oracle_cache.root().iterdir())


def test_weights_edited_in_place_invalidate_the_cached_oracle(tmp_path):
    src = registry.adapter("deepseek-v4.1-flash").weights("synthetic:tiny")
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    spec = CaseSpec("deepseek-v4.1-flash", weights=str(ck))
    first = check(spec, out=tmp_path / "first")
    again = check(spec, out=tmp_path / "again")
    assert (first.oracle_cache, again.oracle_cache) == ("miss", "hit") and again.report.verdict == "match"
    shard = next(p for p in ck.glob("*.safetensors") if "vision.patch_embed.proj.weight" in load_file(str(p)))
    t = load_file(str(shard))
    t["vision.patch_embed.proj.weight"] = t["vision.patch_embed.proj.weight"] * 1.5
    save_file(t, str(shard), metadata={"format": "pt"})
    edited = check(spec, out=tmp_path / "edited")
    assert edited.oracle_cache == "miss" and not edited.oracle_cached
    assert edited.report.verdict == "match"  # both sides read the edited weights
    # the fault the key prevents: the stale oracle against the engine on the edited weights
    stale = compare_dumps(tmp_path / "first" / "oracle", tmp_path / "edited" / "engine")
    assert stale.verdict == "diverged"


def test_a_cached_dump_that_fails_its_sha256_is_a_miss_and_the_report_says_so(tmp_path):
    spec = CaseSpec(toy.NAME)
    check(spec)
    (key,) = _entries()
    cached = oracle_cache.root() / key
    f = cached / "block0.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF  # one flipped byte in a tensor, the manifest untouched
    f.write_bytes(bytes(data))
    case = check(spec)
    assert case.oracle_cache == "rejected" and not case.oracle_cached
    assert any("failed verification" in n and "block0" in n for n in case.report.notes)
    assert case.report.verdict == "match"  # judged against a fresh oracle, not the corrupt one
    assert "cached oracle failed verification" in case.summary_line()
    assert oracle_cache.verify(oracle_cache.root() / key) is None
    assert check(spec).oracle_cache == "hit"


def test_an_adapter_that_declares_no_sources_gets_no_cache(tmp_path):
    bare = replace(toy.ADAPTER, sources=())
    _, req = make_request(toy.NAME)
    od = oracle_dump(bare, req, tmp_path / "scratch", use_cache=True)
    assert od.cache == "off" and od.path == tmp_path / "scratch" and "declares no oracle sources" in od.note
    assert not _entries()


def test_editing_a_declared_source_changes_the_key(tmp_path):
    mine = tmp_path / "oracle_src.py"
    mine.write_text("SCALE = 1\n")
    ad = replace(toy.ADAPTER, sources=(str(mine),))
    _, req = make_request(toy.NAME)
    before = oracle_cache.key(ad, req)
    mine.write_text("SCALE = 2\n")
    assert oracle_cache.key(ad, req) != before


def test_the_further_images_key_the_cache_and_one_image_keeps_its_key(tmp_path):
    from PIL import Image

    a, b = tmp_path / "a.png", tmp_path / "b.png"
    Image.new("RGB", (40, 30), (200, 0, 0)).save(a)
    Image.new("RGB", (40, 30), (0, 0, 200)).save(b)
    _, req = make_request(toy.NAME)
    one = oracle_cache.key(toy.ADAPTER, req)
    assert oracle_cache.key(toy.ADAPTER, replace(req, more_images=())) == one
    ab = oracle_cache.key(toy.ADAPTER, replace(req, more_images=(a, b)))
    assert ab not in (one, oracle_cache.key(toy.ADAPTER, replace(req, more_images=(b, a))))  # order counts
    b.write_bytes(a.read_bytes())  # an image edited in place
    assert oracle_cache.key(toy.ADAPTER, replace(req, more_images=(a, b))) != ab


WORKER = """
import sys, time
sys.path.insert(0, {here!r})
import test_gate_toy as toy
from dataclasses import replace
from tensordiff.pipeline.adapter import RunRequest
from tensordiff.pipeline.inputs import default_image_path
from tensordiff.pipeline.case import oracle_dump

def slow(req, rec):  # both processes are inside the oracle at once
    time.sleep(1.0)
    toy.oracle_run(req, rec)

ad = replace(toy.ADAPTER, oracle=lambda: slow)
req = RunRequest("synthetic:tiny", weights_dir=toy.weights_dir("synthetic:tiny"), image=default_image_path())
od = oracle_dump(ad, req, __import__("pathlib").Path(sys.argv[1]), use_cache=True)
print(od.path)
"""


def test_two_processes_sharing_one_cache_stay_correct(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENSORDIFF_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER.format(here=str(HERE)), str(tmp_path / f"s{i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    paths = {o.strip() for o, _ in outs}
    assert len(paths) == 1  # both use the one entry (the first rename won)
    (key,) = _entries()  # no staging or half-written directory left
    assert paths == {str(oracle_cache.root() / key)}
    assert oracle_cache.verify(oracle_cache.root() / key) is None
    assert json.loads((oracle_cache.root() / key / "manifest.json").read_text())["tensors"]


def _counting_verify(monkeypatch) -> list:
    calls = []
    real = oracle_cache.verify
    monkeypatch.setattr(oracle_cache, "verify", lambda p: calls.append(p) or real(p))
    return calls


def _later(monkeypatch, seconds: float) -> None:
    """The verification clock `seconds` ahead: the entry's files look that old to it."""
    import time

    real = time.time_ns
    monkeypatch.setattr(oracle_cache.time, "time_ns", lambda: real() + int(seconds * 1e9))


def test_a_process_hashes_an_unchanged_entry_once(monkeypatch):
    _later(monkeypatch, 10)
    calls = _counting_verify(monkeypatch)
    spec = CaseSpec(toy.NAME)
    first = check(spec)
    assert first.oracle_cache == "miss" and calls == []  # stored, not read back
    assert [check(spec).oracle_cache for _ in range(3)] == ["hit"] * 3
    assert len(calls) == 1  # verified by the first hit; the next two found its files unchanged


def test_an_entry_changed_after_its_verification_is_hashed_again_and_rejected(monkeypatch):
    import time

    _later(monkeypatch, 10)
    spec = CaseSpec(toy.NAME)
    check(spec)
    assert check(spec).oracle_cache == "hit"  # verified and remembered
    (key,) = _entries()
    f = oracle_cache.root() / key / "block0.safetensors"
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF  # same size, same mtime: only the ctime tells the write
    time.sleep(0.05)  # past the clock tick the entry was written in
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    case = check(spec)
    assert case.oracle_cache == "rejected" and any("block0" in n for n in case.report.notes)


def test_files_written_within_the_racy_window_are_hashed_on_every_lookup(monkeypatch):
    calls = _counting_verify(monkeypatch)
    spec = CaseSpec(toy.NAME)
    check(spec)  # the entry's files were written just now: one clock tick could hide a later write
    assert [check(spec).oracle_cache for _ in range(2)] == ["hit", "hit"]
    assert len(calls) == 2
