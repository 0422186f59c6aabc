"""Sharded dumps: rank directories and rank-tagged entries merged into logical tensors, streamed,
and every structural fault refused naming the ranks (tensordiff/format/shard.py)."""
import json
from pathlib import Path

import numpy as np
import pytest

from tensordiff.format import shard
from tensordiff.judge import stream
from tensordiff.format.capture import Recorder
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.format.dump import open_dump
from tensordiff.errors import BadInput
from tests.cli_runner import run_cli

rng = np.random.default_rng(0)
X = rng.standard_normal((6, 8)).astype(np.float32)  # tokens x hidden
IDS = np.arange(12, dtype=np.int64).reshape(6, 2)


def whole(path, tensors):
    with Recorder(path, model="toy", producer={"side": "oracle"}) as rec:
        for n, t in tensors.items():
            rec.record(n, t)
    return path


def ranks(path, world, per_rank):
    """per_rank(r) -> {name: (array, layout or None)}: one rank dump each, DIR/rank<r>."""
    path.mkdir()
    for r in range(world):
        with Recorder(path / f"rank{r}", model="toy", producer={"side": "engine"},
                      run={"parallel": {"rank": r, "world": world}}) as rec:
            for n, (t, lay) in per_rank(r).items():
                rec.record(n, t, layout=lay)
    return path


def split(r, world, axis=1, a=X):
    return np.array_split(a, world, axis=axis)[r]


def good(r, world=2):
    return {"x": (split(r, world), {"shard": {"axis": 1, "index": r, "count": world}}),
            "y": (split(r, world, axis=0), {"dims": "tokens[tp] hidden"}),
            "ids": (IDS, {"replicated": True}),
            "s": (X / world, {"partial": "sum"})}


def ref(tmp_path):
    return whole(tmp_path / "oracle", {"x": X, "y": X, "ids": IDS, "s": X})


@pytest.mark.parametrize("world", [2, 3, 4])
def test_rank_dirs_merge_to_the_whole_and_match(tmp_path, world):
    d = open_dump(ranks(tmp_path / "eng", world, lambda r: good(r, world)))
    assert d.world == world and d.entry("x").shape == (6, 8)  # uneven splits at 3 (3+3+2 columns)
    np.testing.assert_array_equal(d.load("x"), X)
    np.testing.assert_array_equal(d.load("y"), X)
    np.testing.assert_array_equal(d.load("ids"), IDS)
    np.testing.assert_allclose(d.load("s"), X, rtol=1e-6)
    rep = compare_dumps(ref(tmp_path), d)
    assert rep.verdict == "match", str(rep)


@pytest.mark.parametrize("step", [1, 3, 5, 7, 8, 13, 48])
def test_streamed_reads_of_any_range_are_exact(tmp_path, step, monkeypatch):
    # the merged reader gathers each range from the shards: short pieces inside a row, whole rows
    a = rng.standard_normal((5, 7, 6)).astype(np.float32)
    for axis in (0, 1, 2):
        p = ranks(tmp_path / f"e{axis}", 3, lambda r: {"a": (split(r, 3, axis, a), {"shard": {"axis": axis, "index": r,
                                                                                       "count": 3}})})
        m = open_dump(p).entry("a").stored
        rd = m.reader()
        got = np.concatenate([rd.read(s, min(m.numel, s + step)) for s in range(0, m.numel, step)])
        rd.close()
        np.testing.assert_array_equal(got, a.reshape(-1))


def test_rank_tagged_entries_in_one_directory(tmp_path):
    d = tmp_path / "tagged"
    d.mkdir()
    from tensordiff.format.storage import write_safetensors
    from tensordiff.format.dtypes import BY_NAME

    f32 = BY_NAME["float32"]
    write_safetensors(d / "t.safetensors", {"x.0": (split(0, 2), f32), "x.1": (split(1, 2), f32)})
    entries = [{"name": "x", "file": "t.safetensors", "key": f"x.{r}", "rank": r, "dims": "tokens hidden[tp]"}
               for r in (1, 0)]  # listed out of order: the index, not the listing, places a shard
    (d / "manifest.json").write_text(json.dumps({"format": "tensordiff-dump", "version": 1, "model": "toy",
                                                 "producer": {}, "run": {"parallel": {"world": 2}},
                                                 "tensors": entries}))
    np.testing.assert_array_equal(open_dump(d).load("x"), X)
    assert compare_dumps(whole(tmp_path / "o", {"x": X}), d).verdict == "match"


def test_a_bf16_partial_sum_is_summed_in_float64_and_rounded_once(tmp_path):
    import torch

    t = torch.tensor(X)
    parts = [t * 0.25, t * 0.75]
    p = ranks(tmp_path / "e", 2, lambda r: {"s": (parts[r].bfloat16(), {"partial": "sum"})})
    want = (parts[0].bfloat16().double() + parts[1].bfloat16().double()).bfloat16().float().numpy()
    np.testing.assert_array_equal(open_dump(p).load("s"), want)


@pytest.mark.parametrize("fault, words", [
    ("shape", ["shards disagree on shape", "rank 0 [6, 4]", "rank 1 [5, 4]"]),
    ("dtype", ["shards disagree on dtype", "rank 1 float64"]),
    ("missing", ["shard 1 of 2 is missing", "ranks 0"]),
    ("twice", ["ranks 0, 1 all claim shard 0 of 2"]),
    ("partial-missing", ["partial sum over 2 ranks but rank 1 did not record it"]),
    ("no-layout", ["ranks 0, 1 state no layout"]),
    ("layouts", ["ranks disagree on its layout", "rank 0 shard", "rank 1 replicated"]),
])
def test_structural_faults_exit_2_naming_the_ranks(tmp_path, capsys, fault, words):
    def per(r):
        if fault == "shape":
            return {"x": (split(r, 2) if r == 0 else split(r, 2)[:5], {"dims": "tokens hidden[tp]"})}
        if fault == "dtype":
            return {"x": (split(r, 2).astype(np.float64 if r else np.float32), {"dims": "tokens hidden[tp]"})}
        if fault == "missing":
            return {"x": (split(0, 2), {"shard": {"axis": 1, "index": 0, "count": 2}})} if r == 0 else {}
        if fault == "twice":
            return {"x": (split(r, 2), {"shard": {"axis": 1, "index": 0, "count": 2}})}
        if fault == "partial-missing":
            return {"s": (X, {"partial": "sum"})} if r == 0 else {}
        if fault == "no-layout":
            return {"x": (X, None)}
        return {"x": (split(r, 2), {"dims": "tokens hidden[tp]"} if r == 0 else {"replicated": True})}

    p = ranks(tmp_path / "e", 2, per)
    with pytest.raises(BadInput) as e:
        open_dump(p)
    for w in words:
        assert w in str(e.value), str(e.value)
    code, out, err = run_cli(["compare", ref(tmp_path), p], capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_missing_rank_directory_and_a_wrong_rank_are_refused(tmp_path):
    p = ranks(tmp_path / "e", 3, lambda r: good(r, 3))
    import shutil

    shutil.rmtree(p / "rank1")
    with pytest.raises(BadInput, match="the run has 3 ranks but rank1/ is missing"):
        open_dump(p)
    q = ranks(tmp_path / "f", 2, lambda r: good(r, 2))
    m = json.loads((q / "rank1" / "manifest.json").read_text())
    m["run"]["parallel"]["rank"] = 0
    (q / "rank1" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BadInput, match="rank1"):
        open_dump(q)
    m["run"]["parallel"]["rank"] = 1
    m["tensors"][0]["rank"] = 0  # an entry of rank1/ claiming to be rank 0's
    (q / "rank1" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BadInput, match="says rank 0, but it is in rank1/"):
        open_dump(q)


@pytest.mark.parametrize("fields, words", [
    ({"shard": {"axis": 5, "index": 0, "count": 2}}, "not an axis"),
    ({"shard": {"axis": 0, "index": 2, "count": 2}}, "out of range"),
    ({"shard": {"axis": 0.0, "index": 0, "count": 2}}, "integers"),
    ({"dims": "a[tp] b[ep]"}, "2 parallel axes"),
    ({"dims": "a[tp]"}, "each of the tensor's 2 axes"),
    ({"partial": "max"}, "the one reduction known"),
    ({"replicated": True, "partial": "sum"}, "replicated and partial"),
])
def test_bad_layout_fields_are_one_line(tmp_path, fields, words):
    with pytest.raises(BadInput, match=words):
        shard.parse_layout("t", fields, 2, 0, 2)
    with pytest.raises(BadInput):  # the recorder refuses them before anything is written
        Recorder(tmp_path / "r", model="toy").record("x", X, layout=fields)


def test_replicas_that_differ_name_the_rank_against_the_majority(tmp_path):
    def per(r):
        ids = IDS.copy()
        if r == 2:
            ids[3, 1] += 1
        return {"ids": (ids, {"replicated": True})}

    rep = compare_dumps(whole(tmp_path / "o", {"ids": IDS}), ranks(tmp_path / "e", 4, per))
    t = rep.boundary("ids").tensors[0]
    assert t.status == "diverged" and t.ranks["disagree"] == [2], t.reason
    assert "rank 2 disagrees with the majority, ranks 0, 1, 3" in t.reason


def test_replicas_with_no_majority_are_settled_against_the_reference(tmp_path):
    def per(r):
        ids = IDS.copy()
        if r == 0:
            ids[0, 0] = 99
        return {"ids": (ids, {"replicated": True})}

    rep = compare_dumps(whole(tmp_path / "o", {"ids": IDS}), ranks(tmp_path / "e", 2, per))
    t = rep.boundary("ids").tensors[0]
    assert rep.verdict == "diverged" and t.ranks["disagree"] == [0], t.reason
    assert "no majority" in t.reason


def test_replicas_that_agree_raise_no_alarm(tmp_path):
    rep = compare_dumps(whole(tmp_path / "o", {"ids": IDS}),
                        ranks(tmp_path / "e", 4, lambda r: {"ids": (IDS, {"replicated": True})}))
    assert rep.verdict == "match" and rep.boundary("ids").tensors[0].ranks is None


def test_shards_in_the_wrong_order_are_named(tmp_path):
    rev = ranks(tmp_path / "e", 2, lambda r: {"x": (split(r, 2), {"shard": {"axis": 1, "index": 1 - r, "count": 2}})})
    rep = compare_dumps(whole(tmp_path / "o", {"x": X}), rev)
    t = rep.boundary("x").tensors[0]
    assert t.status == "diverged" and "shards in the wrong order" in t.reason, t.reason
    assert {m["rank"] for m in t.ranks["misplaced"]} == {0, 1}


def test_a_lone_diverged_shard_names_its_rank(tmp_path):
    def per(r):
        s = split(r, 4).copy()
        if r == 3:
            s[2, 0] += 1.0
        return {"x": (s, {"shard": {"axis": 1, "index": r, "count": 4}})}

    t = compare_dumps(whole(tmp_path / "o", {"x": X}), ranks(tmp_path / "e", 4, per)).boundary("x").tensors[0]
    assert t.status == "diverged" and t.ranks["disagree"] == [3] and not t.ranks["misplaced"], t.reason


def test_a_partial_sum_recorded_as_replicated_diverges(tmp_path):
    rep = compare_dumps(whole(tmp_path / "o", {"s": X}),
                        ranks(tmp_path / "e", 2, lambda r: {"s": (X * (0.3 if r else 0.7),
                                                                  {"replicated": True})}))
    t = rep.boundary("s").tensors[0]
    assert t.status == "diverged" and "replicas differ between ranks" in t.reason
    assert t.ranks["disagree"] == [0, 1]  # neither partial is the whole


def test_either_side_may_be_sharded(tmp_path):
    e = ranks(tmp_path / "e", 2, good)
    rep = compare_dumps(e, ref(tmp_path))
    assert rep.verdict == "match"


def test_inspect_shows_logical_shapes(tmp_path, capsys):
    code, out, err = run_cli(["inspect", ranks(tmp_path / "e", 2, good)], capsys)
    assert code == 0, err
    assert "sharded run of 2 ranks" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("x "))
    assert "6 × 8" in line and "shard axis 1, ranks 0,1" in line


def test_merging_streams_in_the_comparators_chunks(tmp_path, monkeypatch):
    # a tensor of many chunks: the merged reader never reads more than a chunk (+ a row) at a time
    monkeypatch.setattr(stream, "CHUNK", 64)
    big = rng.standard_normal((40, 24)).astype(np.float32)
    p = ranks(tmp_path / "e", 3, lambda r: {"b": (split(r, 3, 1, big), {"dims": "t h[tp]"})})
    seen = []
    from tensordiff.format import shard as sh

    orig = sh.MergedReader.read

    def spy(self, s, e):
        seen.append(e - s)
        return orig(self, s, e)

    monkeypatch.setattr(sh.MergedReader, "read", spy)
    rep = compare_dumps(whole(tmp_path / "o", {"b": big}), p)
    assert rep.verdict == "match" and max(seen) <= 64 and len(seen) >= big.size // 64


def test_verify_checks_every_ranks_part(tmp_path, capsys):
    p = ranks(tmp_path / "e", 2, good)
    code, out, err = run_cli(["inspect", p, "--verify"], capsys)
    assert code == 0 and "sha256 ok (each rank)" in out, out + err
    f = p / "rank1" / "x.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 0xFF  # one flipped byte in rank 1's shard
    f.write_bytes(bytes(raw))
    code, out, err = run_cli(["inspect", p, "--verify"], capsys)
    assert code == 2 and "SHA256 MISMATCH" in out
    code, out, err = run_cli(["compare", ref(tmp_path), p, "--verify"], capsys)
    assert code == 2 and "rank 1's part of tensor 'x' fails its sha256" in err, err


def test_a_plain_dims_string_is_only_names(tmp_path):
    d = whole(tmp_path / "o", {"x": X})
    m = json.loads((d / "manifest.json").read_text())
    m["tensors"][0]["dims"] = "tokens hidden"
    (d / "manifest.json").write_text(json.dumps(m))
    assert open_dump(d).world is None and open_dump(d).entry("x").shape == (6, 8)


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads resident memory from /proc")
@pytest.mark.parametrize("layout", ["hidden", "tokens", "replicated", "partial"])
def test_streaming_a_merged_tensor_keeps_resident_memory_a_few_chunks_deep(tmp_path, layout):
    # 48 MB merged; read in the comparator's chunks, then released as the comparator does: a
    # shard's pages released before its copy is made would be faulted back in and stay resident
    big = np.random.default_rng(1).standard_normal((3072, 4096), dtype=np.float32)

    def per(r):
        if layout == "hidden":
            return {"b": (split(r, 3, 1, big), {"dims": "t h[tp]"})}
        if layout == "tokens":
            return {"b": (split(r, 3, 0, big), {"dims": "t[tp] h"})}
        return {"b": (big, {"replicated": True})} if layout == "replicated" else {"b": (big / 4, {"partial": "sum"})}

    m = open_dump(ranks(tmp_path / "e", 3, per)).entry("b").stored

    def rss_mb():
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20

    before, peak = rss_mb(), 0.0
    step = stream.chunk_len(4096)
    r = m.reader()
    for s in range(0, m.numel, step):
        x = r.read(s, min(m.numel, s + step))
        float(x.view(np.float32).sum())  # the consumer touches every element
        stream.release(r, s, min(m.numel, s + step))
        peak = max(peak, rss_mb() - before)
    r.close()
    assert peak < 24, f"{peak:.0f} MB resident while streaming 48 MB"


def test_shards_in_the_wrong_order_are_named_downstream_of_other_error_too(tmp_path):
    # reversed AND off by noise that no tolerance passes (what a shard looks like after an upstream
    # near-tie cascade): nothing matches anywhere, but each shard resembles the other place
    noisy = X + 0.2 * rng.standard_normal(X.shape).astype(np.float32)
    rev = ranks(tmp_path / "e", 2, lambda r: {"x": (split(r, 2, 1, noisy), {"shard": {"axis": 1, "index": 1 - r,
                                                                                       "count": 2}})})
    t = compare_dumps(whole(tmp_path / "o", {"x": X}), rev).boundary("x").tensors[0]
    assert t.status == "diverged" and "resembles the other side's slice" in t.reason, t.reason
    assert {(m["rank"], m["matches"]) for m in t.ranks["misplaced"]} == {(0, 0), (1, 1)}
    # the same noise in place: the shards diverge where they are, and none is called misplaced
    inplace = ranks(tmp_path / "f", 2, lambda r: {"x": (split(r, 2, 1, noisy), {"dims": "t h[tp]"})})
    t = compare_dumps(whole(tmp_path / "o2", {"x": X}), inplace).boundary("x").tensors[0]
    assert t.status == "diverged" and not t.ranks["misplaced"] and t.ranks["disagree"] == [0, 1]
