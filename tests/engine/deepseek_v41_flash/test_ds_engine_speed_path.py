"""The engine writes its speed path into the manifest (`run.speed_path`): what was asked, what
ran, the SDPA kernel each attention call took, and every silent fallback with its reason. The
fallbacks are forced here on the CPU: SDPA -> math, a compile that fails, a speed path asked for
where it cannot run."""
from __future__ import annotations

import pytest
from torch.nn.attention import SDPBackend, sdpa_kernel

import engine.runtime.fused as fused  # the block compiler lives in the runtime
import engine.deepseek_v41_flash.run as run_mod
from tensordiff.dump import open_dump
from tensordiff.runs import make_request, run_side


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("TENSORDIFF_FUSE", raising=False)
    monkeypatch.delenv("TENSORDIFF_GRAPHS", raising=False)


def _dump(path, **kw):
    ad, req = make_request("deepseek-v4.1-flash", **kw)
    return open_dump(run_side(ad, "engine", req, path))


def _digests(d):
    return [(e.name, e.sha256) for e in d.entries]


def test_a_plain_cpu_run_records_eager_and_the_kernel_sdpa_took(tmp_path):
    d = _dump(tmp_path / "e")
    sp = d.run["speed_path"]
    assert sp["vision"]["block"] == {"asked": "auto", "policy": "off", "ran": "eager"}
    assert sp["vision"]["cuda_graphs"] == {"asked": "auto", "policy": "off", "captured": 0, "replayed": 0}
    assert sp["vision"]["attention_prefer"] is None
    # the 4-D call takes PyTorch's fused CPU kernel, once per block: no silent math path
    assert list(sp["attention"]["sdpa"]) == ["flash"] and sp["attention"]["sdpa"]["flash"] >= 1
    assert sp["fallbacks"] == []
    assert "torch" in d.run["versions"]  # a key added beside the others, nothing replaced


def test_forced_sdpa_math_is_a_recorded_fallback(tmp_path):
    with sdpa_kernel([SDPBackend.MATH]):
        sp = _dump(tmp_path / "e").run["speed_path"]
    assert list(sp["attention"]["sdpa"]) == ["math"]
    assert sp["fallbacks"] == [{"what": "sdpa flash -> math",
                                "why": "flash is disabled (torch.backends.cuda.flash_sdp_enabled() is False)"}]


def test_a_compile_that_fails_falls_back_to_the_same_eager_numbers_and_says_why(tmp_path, monkeypatch):
    eager = _dump(tmp_path / "eager")

    def broken(fn):
        def call(*args, **kwargs):
            raise RuntimeError("inductor: no working C++ compiler")
        return call

    monkeypatch.setattr(run_mod, "can_compile", lambda device: True)
    monkeypatch.setattr(fused, "_compile", broken)
    d = _dump(tmp_path / "fell-back", fuse="on")
    sp = d.run["speed_path"]
    assert sp["vision"]["block"] == {"asked": "on", "policy": "on", "ran": "eager"}
    assert sp["fallbacks"] == [{"what": "vision block compiled -> eager",
                                "why": "RuntimeError: inductor: no working C++ compiler"}]
    assert _digests(d) == _digests(eager)


def test_speed_paths_asked_for_on_the_cpu_are_recorded_fallbacks(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORDIFF_FUSE", "1")
    monkeypatch.setenv("TENSORDIFF_GRAPHS", "1")
    sp = _dump(tmp_path / "e").run["speed_path"]
    assert sp["vision"]["block"] == {"asked": "on", "policy": "off", "ran": "eager"}
    assert sp["vision"]["cuda_graphs"]["asked"] == "on" and sp["vision"]["cuda_graphs"]["policy"] == "off"
    assert sp["fallbacks"] == [
        {"what": "vision block compiled -> eager", "why": "compiled blocks are CUDA only (device cpu)"},
        {"what": "CUDA graphs -> eager", "why": "CUDA graphs are CUDA only (device cpu)"}]


def test_the_request_option_wins_over_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORDIFF_FUSE", "1")
    sp = _dump(tmp_path / "e", fuse="off", graphs=False).run["speed_path"]
    assert sp["vision"]["block"]["asked"] == "off" and sp["vision"]["cuda_graphs"]["asked"] == "off"
    assert sp["fallbacks"] == []


class _SlowPatchGemm:
    """A non-torch backend: torch's ops, its patch GEMM 50 ms slower per call (a slow own kernel;
    far beyond what load on a shared machine does to the tiny reference GEMM)."""

    def __init__(self, faults=()):
        from engine.backend.torch_ops import TorchBackend

        self.name, self.faults, self.ref = "slowpatch", frozenset(faults), TorchBackend()

    def __getattr__(self, op):
        return getattr(self.ref, op)

    def patch_linear(self, x, weight, bias):
        import time

        time.sleep(0.05)
        return self.ref.patch_linear(x, weight, bias)


@pytest.mark.parametrize("faults", [(), ("a-planted-kernel-fault",)])
def test_a_backends_slower_op_is_delegated_to_torch_from_the_first_compiled_pass(monkeypatch, tmp_path, faults):
    """`VisionEngine._delegate`: not on the one-shot eager pass; then measured once, the slow op
    delegated, the numbers unchanged, what was measured in the speed path. A backend with planted
    kernel faults keeps every kernel."""
    import torch

    import engine.backend as backends
    import engine.deepseek_v41_flash.fused as ds_fused
    from engine.deepseek_v41_flash.run import VisionEngine
    from tensordiff.capture import NullRecorder
    from tensordiff.synthetic.deepseek_v41_flash import resolve

    class Eager:  # the compiled block's place, run eagerly (compiling is not what is tested here)
        def __init__(self, block):
            self.block, self.ok, self.error = block, True, None

        def __call__(self, *a):
            return self.block(*a)

    monkeypatch.setitem(backends._CACHE, "slowpatch", _SlowPatchGemm(faults))
    monkeypatch.setattr(run_mod, "can_compile", lambda device: True)
    monkeypatch.setattr(ds_fused, "FusedBlock", Eager)
    w = resolve("synthetic:tiny")
    eng = VisionEngine(w, device="cpu", backend="slowpatch", fuse="auto", graphs="off")
    ref = VisionEngine(w, device="cpu", fuse="off", graphs="off")
    from PIL import Image

    Image.new("RGB", (70, 56), (90, 140, 200)).save(tmp_path / "p.png")
    plan, patches = eng.preprocess(tmp_path / "p.png")
    with torch.inference_mode():
        want = ref.encode(patches, plan, NullRecorder())
        assert torch.equal(eng.encode(patches, plan, NullRecorder()), want)
        assert eng.delegation is None and "ops_to_torch" not in eng.speed_path()["vision"]  # the eager pass
        assert torch.equal(eng.encode(patches, plan, NullRecorder()), want)
    assert eng.tower.ran == "compiled"
    if faults:
        assert eng.delegation is None and eng.backend.name == "slowpatch" and not hasattr(eng.backend, "ops")
        return
    ops = eng.speed_path()["vision"]["ops_to_torch"]
    assert set(ops) == {"rms_norm", "patch_linear", "aligner_gather", "rope_rotate_half"}
    assert ops["patch_linear"]["delegated"] and ops["patch_linear"]["own_ms"] > 45
    # the other ops are the same torch ops both ways: whatever the timing noise decided, the
    # backend runs exactly what the record says
    assert eng.backend.ops == {k for k, v in ops.items() if v["delegated"]} and eng.tower.block.backend is eng.backend

