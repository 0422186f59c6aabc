"""The fault matrix bench routes every named fault to a gate block that can carry it (so a fault
added later without a route fails here, not silently on the GPU), and summarises a gate's JSON the
way its table reads."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tensordiff.pipeline import registry
import tensordiff.models.deepseek_v41_flash.faults as deepseek_faults
import tensordiff.models.qwen3_vl.faults as qwen3_vl_faults

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fault_matrix.py"
spec = importlib.util.spec_from_file_location("fault_matrix", BENCH)
fm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fm)
LANGUAGE = {fm.DEEPSEEK: {f.name for f in deepseek_faults.LANGUAGE_FAULTS},
            fm.QWEN: {f.name for f in qwen3_vl_faults.LANGUAGE_FAULTS}}


@pytest.mark.parametrize("model", [fm.DEEPSEEK, fm.QWEN])
def test_every_fault_has_a_carrier(model):
    bl = fm.blocks("cpu", "synthetic:tiny")[model]
    adapter = registry.adapter(model)
    for f in adapter.faults:
        cb = fm.carriers(adapter, f, bl)
        assert cb, f.name
        kinds = {b["kind"] for b in cb}
        if f.name in fm.QUANTISED:
            assert kinds == {"quantised"}
        elif f.name in LANGUAGE[model]:
            assert kinds == {"language"}, f.name  # a language fault never lands on the vision block
        else:
            assert kinds == {"vision"}, f.name


def test_two_image_fault_goes_to_the_two_image_block():
    adapter = registry.adapter(fm.DEEPSEEK)
    f = next(f for f in adapter.faults if f.name == deepseek_faults.IMAGE_SPAN_UNEXPANDED)
    assert [b["block"] for b in fm.carriers(adapter, f, fm.blocks("cpu", "synthetic:tiny")[fm.DEEPSEEK])] == ["two-images"]


def test_gate_text_is_a_gate_file(tmp_path):
    from tensordiff.commands.gate import load_gate

    b = fm.blocks("cpu", "synthetic:tiny")[fm.DEEPSEEK]
    p = tmp_path / "g.toml"
    p.write_text(fm.gate_text("t", fm.DEEPSEEK, [b[0]["model"], b[2]["model"]]))
    cfg = load_gate(p)
    assert [m.dtype for m in cfg.models] == ["bfloat16", "bfloat16"]
    assert cfg.models[1].chunk == 5 and len(cfg.models[1].images[0]) == 2


def test_summary_names_passes_and_origins():
    case = {"label": "x", "passed": False, "error": None, "passes": ["semantic", "numeric"],
            "report": {"verdict": "diverged", "earliest": ["rope"]}, "numeric": {"verdict": "match", "earliest": []},
            "local_error": {"available": True, "origin": "rope"}, "local_error_numeric": {"available": False}}
    s = fm.summarise_case(case)
    assert s["passes"] == {"semantic": {"verdict": "diverged", "earliest": ["rope"]},
                           "numeric": {"verdict": "match", "earliest": []}}
    assert s["local_error"] == "rope" and s["local_error_numeric"] is None
