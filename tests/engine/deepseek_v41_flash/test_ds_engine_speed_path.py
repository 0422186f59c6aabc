"""The engine writes its speed path into the manifest (`run.speed_path`): what was asked, what
ran, the SDPA kernel each attention call took, and every silent fallback with its reason. The
fallbacks are forced here on the CPU: SDPA -> math, a compile that fails, a speed path asked for
where it cannot run."""
from __future__ import annotations

import pytest
from torch.nn.attention import SDPBackend, sdpa_kernel

import engine.runtime.fused as fused  # the block compiler lives in the runtime
import engine.deepseek_v41_flash.run as run_mod
from tensordiff.format.dump import open_dump
from tensordiff.pipeline.runs import make_request, run_side


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
    from tensordiff.format.capture import NullRecorder
    from tensordiff.models.deepseek_v41_flash.synthetic import resolve

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
    assert set(ops) == {"rms_norm", "patch_linear", "aligner_gather", "block"}
    assert ops["patch_linear"]["delegated"] and ops["patch_linear"]["own_ms"] > 45
    assert ops["block"]["ops"] == ["rms_norm", "rope_rotate_half"]
    # the other ops are the same torch ops both ways: whatever the timing noise decided, the
    # backend runs exactly what the record says
    assert eng.backend.ops == {k for k, v in ops.items() if v["delegated"] and k != "block"}
    assert eng.tower.block.backend is eng.backend
    block_backend = eng.tower._fused.block.backend  # the stand-in's block: the one the passes run
    assert block_backend is (backends.get("torch") if ops["block"]["delegated"] else eng.backend)


class _SlowRope(_SlowPatchGemm):
    """A backend whose rope kernel (an op of the block only) is the slow one: its calls are
    counted, and the timer below charges 5 ms for each (a shared 2-core machine's timing noise is
    larger than any sleep a test can afford)."""

    rope_calls = 0

    def patch_linear(self, x, weight, bias):
        return self.ref.patch_linear(x, weight, bias)

    def rope_rotate_half(self, x, cos, sin):
        self.rope_calls += 1
        return self.ref.rope_rotate_half(x, cos, sin)


def test_the_block_runs_torchs_ops_when_they_make_the_whole_block_faster(monkeypatch, tmp_path):
    """`VisionEngine._delegate` times the block whole, on the backend's ops and on torch's; the
    slower block is not run again, the numbers are torch's, the record says which block ran."""
    import torch

    import engine.backend as backends
    import engine.deepseek_v41_flash.fused as ds_fused
    from engine.deepseek_v41_flash.run import VisionEngine
    from tensordiff.format.capture import NullRecorder
    from tensordiff.models.deepseek_v41_flash.synthetic import resolve

    class Eager:
        def __init__(self, block):
            self.block, self.ok, self.error = block, True, None

        def __call__(self, *a):
            return self.block(*a)

    slow = _SlowRope()

    def charged_ms(fn, device, reps):  # 1 ms a call, plus 5 for each call of the slow rope
        before = slow.rope_calls
        fn()
        return 1.0 + 5.0 * (slow.rope_calls - before)

    real = run_mod.delegate.measure_block
    monkeypatch.setattr(run_mod.delegate, "measure_block",
                        lambda own, ref, device: real(own, ref, device, timer=charged_ms))
    monkeypatch.setitem(backends._CACHE, "sloworope", slow)
    monkeypatch.setattr(run_mod, "can_compile", lambda device: True)
    monkeypatch.setattr(ds_fused, "FusedBlock", Eager)
    w = resolve("synthetic:tiny")
    eng = VisionEngine(w, device="cpu", backend="sloworope", fuse="auto", graphs="off")
    ref = VisionEngine(w, device="cpu", fuse="off", graphs="off")
    from PIL import Image

    Image.new("RGB", (70, 56), (90, 140, 200)).save(tmp_path / "p.png")
    plan, patches = eng.preprocess(tmp_path / "p.png")
    with torch.inference_mode():
        want = ref.encode(patches, plan, NullRecorder())
        eng.encode(patches, plan, NullRecorder())  # the eager pass: every kernel of the backend
        assert slow.rope_calls == len(eng.tower.w.blocks)
        assert torch.equal(eng.encode(patches, plan, NullRecorder()), want)
    block = eng.speed_path()["vision"]["ops_to_torch"]["block"]
    assert block["delegated"] and block["own_ms"] == 6.0 and block["reference_ms"] == 1.0  # one rope a block
    assert eng.tower._fused.block.backend is backends.get("torch")
    before = slow.rope_calls
    with torch.inference_mode():
        assert torch.equal(eng.encode(patches, plan, NullRecorder()), want)
    assert slow.rope_calls == before  # the passes run the torch block: the slow rope is not called again


def test_the_backends_block_stays_when_it_is_not_slower(monkeypatch, tmp_path):
    """The clean case: the backend's block timed no slower than torch's keeps the backend's kernels."""
    import torch

    import engine.backend as backends
    import engine.deepseek_v41_flash.fused as ds_fused
    from engine.deepseek_v41_flash.run import VisionEngine
    from tensordiff.format.capture import NullRecorder
    from tensordiff.models.deepseek_v41_flash.synthetic import resolve

    class Eager:
        def __init__(self, block):
            self.block, self.ok, self.error = block, True, None

        def __call__(self, *a):
            return self.block(*a)

    slow = _SlowRope()
    real = run_mod.delegate.measure_block
    monkeypatch.setattr(run_mod.delegate, "measure_block",
                        lambda own, ref, device: real(own, ref, device, timer=lambda fn, d, r: (fn(), 1.0)[1]))
    monkeypatch.setitem(backends._CACHE, "sloworope", slow)
    monkeypatch.setattr(run_mod, "can_compile", lambda device: True)
    monkeypatch.setattr(ds_fused, "FusedBlock", Eager)
    eng = VisionEngine(resolve("synthetic:tiny"), device="cpu", backend="sloworope", fuse="auto", graphs="off")
    from PIL import Image

    Image.new("RGB", (70, 56), (90, 140, 200)).save(tmp_path / "p.png")
    plan, patches = eng.preprocess(tmp_path / "p.png")
    with torch.inference_mode():
        eng.encode(patches, plan, NullRecorder())
        eng.encode(patches, plan, NullRecorder())
        before = slow.rope_calls
        eng.encode(patches, plan, NullRecorder())
    assert eng.speed_path()["vision"]["ops_to_torch"]["block"]["delegated"] is False  # a tie keeps the backend's
    assert eng.tower._fused.block.backend is eng.backend and slow.rope_calls == before + len(eng.tower.w.blocks)
