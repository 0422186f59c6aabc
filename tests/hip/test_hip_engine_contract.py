"""The engines drive the hip backend's Python layer correctly, checked on the CPU.

The compiled module is replaced by `hip_fake_kernels` (the binding's checks, the torch ops'
numbers), so every argument the engines hand `--backend hip` passes through HipBackend's
preparation and the binding's contract here, in CI; the GPU machine then only has to answer
for the kernels themselves (tests/hip/test_hip_kernels.py, hip/gpu_check.sh).
"""
from __future__ import annotations

import pytest

from hip_fake_kernels import install
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.pipeline.runs import make_request, run_side


def check(model: str, tmp_path, dtype="float32"):
    adapter, req = make_request(model, weights="synthetic:tiny", dtype=dtype, backend="hip")
    oracle = run_side(adapter, "oracle", req, tmp_path / "oracle")
    engine = run_side(adapter, "engine", req, tmp_path / "engine")
    return compare_dumps(oracle, engine)


@pytest.mark.parametrize("model,kernels", [
    ("deepseek-v4.1-flash", {"patch_gemm", "rms_norm", "rope_rotate_half", "aligner_gather"}),
    ("qwen3-vl", {"patch_gemm", "rope_rotate_half"}),
])
def test_engine_through_the_hip_layer_matches_the_oracle(model, kernels, tmp_path, monkeypatch):
    fake = install(monkeypatch)
    report = check(model, tmp_path)
    assert report.verdict == "match", str(report)
    assert kernels <= set(fake.calls), sorted(set(fake.calls))


def test_qwen_language_path_through_the_hip_layer_matches_the_oracle(tmp_path, monkeypatch):
    # the text decoder's RMSNorms (hidden, q/k per head), M-RoPE and the image overlay go through
    # the same backend entry points as DeepSeek's
    fake = install(monkeypatch)
    adapter, req = make_request("qwen3-vl", weights="synthetic:tiny", backend="hip", prompt="A <image> b", decode=1)
    report = compare_dumps(run_side(adapter, "oracle", req, tmp_path / "oracle"),
                           run_side(adapter, "engine", req, tmp_path / "engine"))
    assert report.verdict == "match", str(report)
    assert {"logits.step.1", "deepstack_add.2"} <= {b.name for b in report.boundaries}
    assert {"rms_norm", "rope_rotate_half", "embed_scatter"} <= set(fake.calls), sorted(set(fake.calls))


def test_a_kernel_that_breaks_the_contract_is_seen(tmp_path, monkeypatch):
    # Teeth: a module whose aligner gather drops the zero padding diverges at the aligner.
    fake = install(monkeypatch)
    real = fake.aligner_gather

    def no_padding(x, index, stream):
        return real(x, index.clamp(min=0), stream)

    monkeypatch.setattr(fake, "aligner_gather", no_padding)
    report = check("deepseek-v4.1-flash", tmp_path)
    assert report.verdict == "diverged" and report.earliest == ["aligner"], report.earliest
