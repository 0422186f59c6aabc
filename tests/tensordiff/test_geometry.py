"""Geometry coverage: the rules each model declares over its `plan` boundary say which discrete
preprocessing rules an image exercises; a gate warns about a rule no image reaches; the example
gate files reach every rule."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers_dumps import write

from tensordiff.format.dump import open_dump
from tensordiff.commands.gate import GateResult, load_gate
from tensordiff.judge.geometry import Coverage, exercised, read_plan
import tensordiff.models.deepseek_v41_flash.adapter as DS
import tensordiff.models.qwen3_vl.adapter as QW
from tensordiff.pipeline.case import CaseResult

GATES = Path(__file__).resolve().parents[2] / "gates"


def ds_plan(src, canvas, content, grid, flags=(0, 0)):
    return {"plan.size": torch.tensor([*src, *canvas, *content, 0, 0]), "plan.grid": torch.tensor([*grid, 1, 1]),
            "plan.tokens": torch.tensor([grid[0] * grid[1], 3]), "plan.flags": torch.tensor(flags)}


@pytest.mark.parametrize("plan,want", [
    # the bundled 1024x701: 74 patches wide, 701/1024*1036 = 709.2 (round 709, ceil 710)
    (ds_plan((1024, 701), (1036, 714), (1036, 709), (51, 74)), {"grid-width-not-multiple-of-3", "contain-round-ne-ceil"}),
    # a square that fills its canvas: no rule
    (ds_plan((840, 840), (840, 840), (840, 840), (60, 60)), set()),
    (ds_plan((840, 840), (840, 840), (840, 840), (61, 60), flags=(1, 1)),
     {"grid-height-not-multiple-of-3", "under-min-pixels", "over-token-budget"}),
])
def test_deepseek_rules_read_the_plan(tmp_path, plan, want):
    d = open_dump(write(tmp_path / "d", plan, model=DS.NAME, boundaries={k: "plan" for k in plan}))
    assert set(exercised(DS.GEOMETRY, d)) == want


def test_qwen_rules_read_the_plan(tmp_path):
    def plan(src, resized, flags):
        gh, gw = resized[1] // 16, resized[0] // 16
        return {"plan.size": torch.tensor([*src, *resized]), "plan.grid": torch.tensor([1, gh, gw, gh // 2, gw // 2]),
                "plan.flags": torch.tensor(flags)}

    cases = [(plan((150, 230), (160, 224), (0, 0)), {"qwen-side-round-ne-ceil"}),  # 230 = 7*32 + 6
             (plan((160, 224), (160, 224), (0, 0)), set()),
             (plan((1024, 701), (256, 160), (1, 0)), {"qwen-max-pixels"}),
             (plan((40, 60), (64, 96), (0, 1)), {"qwen-min-pixels"})]
    for i, (p, want) in enumerate(cases):
        d = open_dump(write(tmp_path / f"d{i}", p, model=QW.NAME))
        assert set(exercised(QW.GEOMETRY, d)) == want, (i, read_plan(d))


def test_a_dump_without_a_plan_exercises_nothing(tmp_path):
    d = open_dump(write(tmp_path / "d", {"patches": torch.zeros(2, 2)}, model=DS.NAME))
    assert exercised(DS.GEOMETRY, d) == []


def test_the_gate_warns_about_a_rule_no_image_reaches():
    cfg = load_gate(GATES / "deepseek-v4.1-flash.toml")
    cases = [CaseResult(DS.NAME, Path("a.png"), None, "float32", "a", geometry=["over-token-budget"]),
             CaseResult(DS.NAME, Path("b.png"), None, "float32", "b", geometry=["under-min-pixels"])]
    res = GateResult(cfg, cases)
    cov = res.coverage()[DS.NAME]
    assert set(cov.missing) == {r.name for r in DS.GEOMETRY} - {"over-token-budget", "under-min-pixels"}
    lines = res.coverage_lines()
    assert lines[0].startswith(f"geometry ({DS.NAME}): 2 of {len(DS.GEOMETRY)} rules exercised")
    assert sum(line.startswith("warning:") for line in lines) == len(cov.missing)
    assert res.as_json()["geometry"][DS.NAME]["rules"]["over-token-budget"]["images"] == ["a"]


def test_full_coverage_warns_nothing():
    cov = Coverage.of(QW.GEOMETRY, {"x": [r.name for r in QW.GEOMETRY]})
    assert cov.missing == [] and cov.warnings(QW.NAME) == []


@pytest.mark.parametrize("adapter", [DS.ADAPTER, QW.ADAPTER], ids=lambda a: a.name)
def test_the_example_gate_images_reach_every_rule(adapter):
    """The example gate's images, planned by the engine's own planner (no tower run)."""
    from PIL import Image

    cfg = load_gate(GATES / f"{adapter.name}.toml")
    images = [img for m in cfg.models for img in m.images]
    wdir = adapter.weights("synthetic:tiny")
    hit = set()
    for img in images:
        w, h = Image.open(img).size
        if adapter is DS.ADAPTER:
            from engine.deepseek_v41_flash.config import Config
            from engine.deepseek_v41_flash.image_processor import plan_image

            rec = plan_image(w, h, Config.load(wdir)).record()
        else:
            from engine.qwen3_vl.config import load_config
            from engine.qwen3_vl.smart_resize import plan

            pc = load_config(wdir).processor
            rec = plan(h, w, pc.patch_size, pc.merge_size, pc.shortest_edge, pc.longest_edge).record()
        p = {k: tuple(int(v) for v in t.reshape(-1)) for k, t in rec.items()}
        hit |= {r.name for r in adapter.geometry if r.test(p)}
    assert hit == {r.name for r in adapter.geometry}, sorted({r.name for r in adapter.geometry} - hit)
