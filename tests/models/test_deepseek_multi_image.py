"""Several images in one DeepSeek V4.1 Flash prompt (a repeated --image, one `<image>` each, in
order), as the official `prepare_vl_inputs` lays them out: each image planned by its own size,
its vision boundaries under `image.K.` (the first keeps the single-image names), every span seen
by the language backbone. Clean cases of 2 and 3 images of different sizes match in fp32; a
span placed at the wrong position is caught at `embeddings`; swapped images at `plan`."""
from __future__ import annotations

import pytest

from PIL import Image

from deepseek_images import _smooth, image_path
from tensordiff.pipeline.compare import compare_dumps
from tensordiff.format.dump import open_dump
from tensordiff.errors import BadInput
from tensordiff.commands.gate import from_mapping, run_gate
import tensordiff.models.deepseek_v41_flash.faults as D
from tensordiff.pipeline.case import CaseSpec
from tensordiff.pipeline.case import check as check_case
from tensordiff.pipeline.runs import make_request, run_side

from cli_runner import run_cli


def check(model: str, *, tolerances=None, out=None, oracle_dtype=None, use_cache=True, **kw):
    """Both sides of one case, compared: its Report."""
    return check_case(CaseSpec(model, oracle_dtype=oracle_dtype, **kw), out=out, tolerances=tolerances,
                      use_cache=use_cache).report

SEMANTIC = ("language_numerics=semantic",)  # the fp32 language mode beside the fp32 vision half
MODEL = "deepseek-v4.1-flash"


@pytest.fixture(scope="module")
def pics(module_tmp):
    d = module_tmp("multi")
    # a photograph (451x300, upscaled), a small portrait PNG (24x40, a large upscale), a wide one
    out = {n: image_path(n, d) for n in ("chelsea", "wide")}
    out["tiny"] = d / "small.png"
    Image.fromarray(_smooth(40, 24, 12)).save(out["tiny"])
    return out


def _check(imgs, prompt, **kw):
    return check(MODEL, image=imgs[0], more_images=tuple(imgs[1:]), prompt=prompt, extra=SEMANTIC, **kw)


def test_two_images_of_different_sizes_match_with_chunks_cutting_the_spans(pics):
    r = _check([pics["chelsea"], pics["tiny"]], "First <image> then <image> end.", chunk=16, decode=1)
    assert r.verdict == "match", r.earliest
    names = [b.name for b in r.boundaries]
    assert names[:12] == ["plan", "patches", "rope", "block0", "final_norm", "aligner", "image.1.plan",
                          "image.1.patches", "image.1.rope", "image.1.block0", "image.1.final_norm", "image.1.aligner"]
    assert "embeddings" in names and "logits.step.1" in names
    run = r.runs["b"]
    assert run["language"]["vision_calls"] == 2  # each image's rows asked for once
    spans = [i["span"] for i in run["inputs"]["images"]]
    assert spans[0] != spans[1]  # sized each by its own picture
    starts = run["language"]["span_starts"]
    assert starts == r.runs["a"]["language"]["span_starts"]
    assert starts[1] == starts[0] + spans[0] + len(" then ")


def test_three_images_match(pics):
    r = _check([pics["tiny"], pics["chelsea"], pics["wide"]], "<image> a <image> b <image>")
    assert r.verdict == "match", r.earliest
    assert {"image.2.aligner", "image.1.plan"} <= {b.name for b in r.boundaries}


def test_a_later_span_at_its_unexpanded_tag_position_is_caught_at_embeddings(pics):
    r = _check([pics["chelsea"], pics["tiny"]], "First <image> then <image> end.",
               fault=D.IMAGE_SPAN_UNEXPANDED)
    assert r.earliest == ["embeddings"]
    assert r.boundary("image.1.aligner").status == "match"


def test_the_fault_is_refused_where_no_second_image_reaches_it(pics):
    """A one-image run never places a later span: planting the fault there would be a silent MATCH."""
    with pytest.raises(BadInput, match="two or more images"):
        check(MODEL, image=pics["tiny"], prompt="Look: <image>", extra=SEMANTIC, fault=D.IMAGE_SPAN_UNEXPANDED)


def test_swapped_images_are_caught_at_each_plan(pics, tmp_path):
    """The order is the prompt's: an engine fed the images the other way round diverges at the
    first boundary of each image's path."""
    a, b = pics["chelsea"], pics["tiny"]
    adapter, oreq = make_request(MODEL, image=a, more_images=(b,))
    _, ereq = make_request(MODEL, image=b, more_images=(a,))
    o = run_side(adapter, "oracle", oreq, tmp_path / "o")
    e = run_side(adapter, "engine", ereq, tmp_path / "e")
    r = compare_dumps(o, e)
    assert sorted(r.earliest) == ["image.1.plan", "plan"]


def test_a_single_image_dump_keeps_its_names(pics, tmp_path):
    adapter, req = make_request(MODEL, image=pics["tiny"])
    d = open_dump(run_side(adapter, "engine", req, tmp_path / "e"))
    assert not any(e.name.startswith("image.") for e in d.entries)
    assert "images" not in d.run["inputs"] and "more_images" not in d.run["inputs"]


@pytest.mark.parametrize("prompt,n", [("one <image> only", 2), ("<image> <image> <image>", 2), ("<image>", 3)])
def test_cli_refuses_tags_that_do_not_pair_with_images(pics, capsys, prompt, n, tmp_path):
    imgs = [pics["tiny"], pics["chelsea"], pics["wide"]][:n]
    argv = ["check", MODEL, *[x for p in imgs for x in ("--image", p)], "--prompt", prompt]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and "placeholder" in err and "Traceback" not in err
    code, _, err = run_cli(["dump", MODEL, "--side", "oracle", "--out", tmp_path / "d", *argv[2:]], capsys)
    assert code == 2 and "placeholder" in err and not (tmp_path / "d").exists()


@pytest.mark.parametrize("side", ["oracle", "engine"])
def test_each_side_refuses_a_mismatch_by_its_own_code(pics, tmp_path, side):
    """Past the request's check (a hand-built request): each runner's tokenizer refuses it."""
    import dataclasses

    adapter, req = make_request(MODEL, image=pics["tiny"], more_images=(pics["wide"],))
    req = dataclasses.replace(req, prompt="only <image>")
    with pytest.raises(BadInput, match="image"):
        run_side(adapter, side, req, tmp_path / side)
    assert not (tmp_path / side).exists()


def test_qwen_refuses_a_second_image(pics, capsys):
    code, _, err = run_cli(["check", "qwen3-vl", "--image", pics["tiny"], "--image", pics["wide"]], capsys)
    assert code == 2 and "one --image" in err


def _gate(pics, imgs, prompts):
    return from_mapping({"gate": {"options": {"language_numerics": "semantic"}},
                         "model": [{"name": MODEL, "images": imgs, "prompts": prompts}]})


def test_gate_case_with_a_list_of_images(pics):
    cfg = from_mapping({"gate": {"options": {"language_numerics": "semantic"}}, "model": [
        {"name": MODEL, "images": [[str(pics["chelsea"]), str(pics["tiny"])]], "prompts": ["A <image> and <image>."]},
        {"name": MODEL, "images": [str(pics["tiny"])], "prompts": ["A <image>."]}]})
    assert cfg.models[0].images == ((pics["chelsea"].resolve(), pics["tiny"].resolve()),)
    res = run_gate(cfg, echo=lambda s: None)
    assert res.passed and "chelsea.png + small.png" in res.cases[0].label
    # planted only where a second image reaches it; the one-image case runs clean
    res = run_gate(cfg, fault=D.IMAGE_SPAN_UNEXPANDED, echo=lambda s: None)
    assert res.cases[0].report.earliest == ["embeddings"] and res.cases[1].passed
    assert "fault" not in res.cases[1].label


@pytest.mark.parametrize("prompts,needle", [(["A <image>."], "holds 1"), ([], "needs prompts")])
def test_gate_refuses_a_case_its_prompts_cannot_hold(pics, prompts, needle):
    with pytest.raises(BadInput, match=needle):
        _gate(pics, [[str(pics["chelsea"]), str(pics["tiny"])]], prompts)
