"""Many small float tensors measured in one native call (tensordiff/judge/batch.py): every reported
number is the streamed path's, exactly; what is not eligible streams; pages are released; a
planted fault is found the same way."""
import json
import math

import pytest
import torch

from tensordiff import Recorder
from tensordiff.judge import batch, native
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.errors import BadInput

pytestmark = pytest.mark.skipif(native.float_batch() is None, reason="no native kernel on this machine")


def _pairs(seed=0):
    """A small tensor of each kind the batch takes, with its B: fp32 and bf16 on either side,
    1-D, 2-D, 3-D and 0-D, ULP noise, large errors, one-sided and shared NaN/Inf, float sums that
    overflow, subnormals, all-equal tensors (percentiles 0) and all-zero ones."""
    g = torch.Generator().manual_seed(seed)
    out = {}

    def put(name, a, b):
        out[name] = (a, b)

    x = torch.randn(25, 128, generator=g)
    put("noise.ulp", x, x * (1 + 2 ** -22))
    put("noise.big", x, x + 1e-3 * torch.randn(25, 128, generator=g))
    put("equal.same", x, x.clone())
    put("equal.zero", torch.zeros(7, 3), torch.zeros(7, 3))
    v = torch.randn(300, generator=g)
    put("flat.vec", v, v + 1e-6)
    put("flat.scalar", torch.tensor(1.5), torch.tensor(1.5000001))
    put("deep.cube", torch.randn(4, 5, 6, generator=g), torch.randn(4, 5, 6, generator=g))
    y = x.clone()
    y[3, 7] = float("nan")
    y[4, 1] = float("inf")
    z = y.clone()
    z[4, 1] = float("-inf")
    put("nonfinite.onesided", y, z)
    put("nonfinite.shared", y, y.clone())
    put("overflow.sums", x * 3e19, x * 3e19 * (1 + 2 ** -20))
    put("tiny.subnormal", x * 1e-39, x * 1e-39 * 1.01)
    put("mixed.bf16_a", x.bfloat16(), x)
    put("mixed.bf16_b", x, (x * (1 + 2 ** -10)).bfloat16())
    put("mixed.bf16_both", x.bfloat16(), (x * 1.01).bfloat16())
    put("wide.rows", torch.randn(2, 3000, generator=g), torch.randn(2, 3000, generator=g))
    return out


def _write(root, pairs, fmt="safetensors"):
    for side in (0, 1):
        with Recorder(root / "ab"[side], model="toy-batch", fmt=fmt, producer={"name": "test"}) as r:
            for name, p in pairs.items():
                r.record(name, p[side])
    return root / "a", root / "b"


def _report(a, b, **kw):
    return json.dumps(compare_dumps(a, b, **kw).as_json(), sort_keys=True)


@pytest.mark.parametrize("fmt", ["safetensors", "hdf5"])
def test_every_number_is_the_streamed_paths(tmp_path, monkeypatch, fmt):
    a, b = _write(tmp_path, _pairs(), fmt)
    calls = []
    real = batch.SmallBatch.run

    def counted(self):
        calls.append(len(self))
        return real(self)

    monkeypatch.setattr(batch.SmallBatch, "run", counted)
    batched = _report(a, b)
    assert sum(calls) >= 14, calls  # the batch really measured them (HDF5 too: mapped in place)
    monkeypatch.setattr(batch, "SMALL", 0)  # nothing eligible: every tensor streams
    calls.clear()
    streamed = _report(a, b)
    assert calls == [] and batched == streamed
    rep = json.loads(batched)
    st = {t["name"]: t["status"] for bd in rep["boundaries"] for t in bd["tensors"]}
    assert st["noise.ulp"] == "match" and st["noise.big"] == "diverged" and st["nonfinite.onesided"] == "diverged"
    assert st["nonfinite.shared"] == "match" and st["equal.zero"] == "match"


def test_the_percentile_bins_of_c_and_numpy_agree(tmp_path):
    """ulp_p50/p99 over spreads that land in the linear bins, the log bins, bin 0 and none."""
    g = torch.Generator().manual_seed(3)
    pairs = {}
    for i, rel in enumerate([0, 2 ** -24, 2 ** -22, 2 ** -18, 1e-4, 1e-2, 1.0]):
        x = torch.randn(40, 50, generator=g)
        noise = torch.randn(40, 50, generator=g).abs() * rel
        pairs[f"spread.{i}"] = (x, x * (1 + noise))
    a, b = _write(tmp_path, pairs)
    got = compare_dumps(a, b)
    from tensordiff.judge.metrics import FloatMetrics
    from tensordiff.format.dtypes import BY_NAME
    from tensordiff.judge.tolerance import DEFAULTS

    f32 = BY_NAME["float32"]
    for name, (x, y) in pairs.items():
        m = FloatMetrics(f32, f32, f32, DEFAULTS["float32"], tuple(x.shape))
        m.update(0, x.numpy().ravel(), y.numpy().ravel())
        want = m.result()
        t = next(t for bd in got.boundaries for t in bd.tensors if t.name == name)
        assert (t.metrics.ulp_p50, t.metrics.ulp_p99, t.metrics.ulp_max) == (want.ulp_p50, want.ulp_p99, want.ulp_max)
    assert any(t.metrics.ulp_p50 == 0 for bd in got.boundaries for t in bd.tensors)  # the 0 case is covered
    assert any(t.metrics.ulp_p99 > 16 for bd in got.boundaries for t in bd.tensors)  # and the log bins


def test_a_planted_fault_is_found_with_its_worst_element(tmp_path):
    pairs = {f"layer{i}.step0": (torch.ones(25, 128) * i, torch.ones(25, 128) * i) for i in range(30)}
    pairs["layer17.step0"][1][11, 100] += 0.5
    a, b = _write(tmp_path, pairs)
    r = compare_dumps(a, b)
    bad = [t for bd in r.boundaries for t in bd.tensors if t.status != "match"]
    assert [t.name for t in bad] == ["layer17.step0"]
    t = bad[0]
    assert t.worst["index"] == [11, 100] and t.worst["a"] == 17.0 and t.worst["b"] == 17.5
    assert t.row_error[11] == 0.5 and max(t.row_error[:11] + t.row_error[12:]) == 0
    assert t.metrics.max_abs == 0.5 and t.metrics.mismatches == 1


def test_what_is_not_eligible_streams(tmp_path, monkeypatch):
    """Integer tensors, float64, a tensor above SMALL and --verify take the streamed path."""
    pairs = {"ints.ids": (torch.arange(12).reshape(3, 4), torch.arange(12).reshape(3, 4)),
             "f64.x": (torch.randn(5, 5, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)),
             "big.x": (torch.zeros(batch.SMALL + 1), torch.zeros(batch.SMALL + 1)),
             "small.x": (torch.ones(4, 4), torch.ones(4, 4))}
    a, b = _write(tmp_path, pairs)
    taken = []
    real = batch.SmallBatch.add

    def add(self, sa, sb, *args):
        ok = real(self, sa, sb, *args)
        taken.append((sa.key, ok))
        return ok

    monkeypatch.setattr(batch.SmallBatch, "add", add)
    assert compare_dumps(a, b).verdict == "diverged"  # f64.x differs
    assert dict(taken) == {"f64.x": False, "big.x": False, "small.x": True}
    taken.clear()
    compare_dumps(a, b, verify=True)
    assert taken == []  # --verify hashes every tensor: streamed


def test_a_truncated_file_is_named_as_the_streamed_path_names_it(tmp_path):
    pairs = {f"t{i}": (torch.ones(25, 128) * i, torch.ones(25, 128) * i) for i in range(4)}
    a, b = _write(tmp_path, pairs)
    from tensordiff.format.dump import open_dump

    da, db = open_dump(a), open_dump(b)  # checked whole when opened; truncated after that
    f = sorted(b.glob("*.safetensors"))[2]
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(BadInput, match=f"{f.name}: tensor 't2' cannot be read .* the file is damaged"):
        compare_dumps(da, db)


def test_the_pages_read_are_released(tmp_path, monkeypatch):
    pairs = {f"t{i}": (torch.randn(25, 128), torch.randn(25, 128)) for i in range(50)}
    a, b = _write(tmp_path, pairs)
    seen = []
    real = batch.release_bytes
    monkeypatch.setattr(batch, "release_bytes", lambda mm, lo, hi, scope: (seen.append((len(mm), lo, hi)),
                                                                           real(mm, lo, hi, scope)))
    compare_dumps(a, b)
    from tensordiff.format.dump import open_dump

    for d in (open_dump(a), open_dump(b)):
        for e in d.entries:
            lo, hi = e.stored.offset, e.stored.offset + e.stored.nbytes
            assert any(l <= lo and hi <= h for _, l, h in seen), e.name


def test_a_batch_runs_when_it_holds_its_bytes(tmp_path, monkeypatch):
    """Resident memory stays bounded: a boundary of many tensors runs in several batches."""
    pairs = {f"t.{i}": (torch.randn(25, 128), torch.randn(25, 128)) for i in range(40)}
    a, b = _write(tmp_path, pairs)
    monkeypatch.setattr(batch, "BATCH_BYTES", 10 * 25 * 128 * 4)
    sizes = []
    real = batch.SmallBatch.run
    monkeypatch.setattr(batch.SmallBatch, "run", lambda self: (sizes.append(len(self)), real(self))[1])
    r = compare_dumps(a, b)
    assert sizes == [10, 10, 10, 10] and len(r.boundaries[0].tensors) == 40
    assert all(t.metrics.numel == 3200 and not math.isnan(t.metrics.cosine) for t in r.boundaries[0].tensors)


def test_small_tensors_of_many_boundaries_wait_together(tmp_path, monkeypatch):
    """A comparison batches across boundaries (one call for 40 boundaries of 2-3 tensors each);
    with --fail-fast it goes boundary by boundary, and stops at the first failing one."""
    pairs = {f"layer{i % 40}.step{i // 40}": (torch.ones(5, 8) * i, torch.ones(5, 8) * i) for i in range(100)}
    pairs["layer3.step1"] = (pairs["layer3.step1"][0], pairs["layer3.step1"][0] + 1)
    a, b = _write(tmp_path, pairs)
    sizes = []
    real = batch.SmallBatch.run
    monkeypatch.setattr(batch.SmallBatch, "run", lambda self: (sizes.append(len(self)), real(self))[1])
    r = compare_dumps(a, b)
    assert sizes == [100] and len(r.boundaries) == 40
    assert r.earliest == ["layer3"] and r.boundary("layer3").tensors[1].status == "diverged"
    assert all(b.status == "match" for b in r.boundaries if b.name != "layer3")
    sizes.clear()
    r = compare_dumps(a, b, fail_fast=True)
    assert sizes == [3, 3, 3, 3]  # layer0..layer3, then the rest skipped
    assert [b.status for b in r.boundaries[3:6]] == ["diverged", "skipped", "skipped"]
